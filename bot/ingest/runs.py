"""A run's attempts and its end, at the bot's edge: what the lifecycle (bot/runs/lifecycle.py, pure) decides,
carried out on the store, the view across ranks, the metric windows and the alerts.

    a message ─► `before`: a process of a new start (a re-run, a resume) ─► the attempt ends ("gone",
                 "replaced by attempt n+1"), its firing alerts close, its ranks and series are forgotten,
                 attempt n+1 starts clean
              ─► (the ingest records it)
              ─► `ended`: its final heartbeat leaves every rank ended ─► the attempt ends ("ended
                 normally"), logged once for the run, its firing alerts close with "run ended"
              ─► `ended` / a rank gone missing: every rank ended or missing while an ERROR fires or a rank is
                 missing ─► the attempt "failed: ..." (the lifecycle's FAILED): its alerts stay as they are (it
                 died of them), one ERROR `run_failed` says the last step, the last finite loss and what fired

An alert closes as any other resolution does: a resolved event through the ingest's stages (dedup,
routes, grouping, the outbox), its message saying why. The attempts' history stays in the store
(`run_attempts`): `status`, the console and `/v1/runs` show it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import msgspec

from bot.ranks.missing import RULE as MISSING_RULE
from bot.runs.devices import id_problem
from bot.runs.lifecycle import ENDED_NORMALLY, FAILED, RUN_ENDED, RunPhase, end_input, new_attempt, run_step
from bot.shared import BotState
from bot.store.rows import AlertView, RunRow
from msmon.contract.wire import Envelope, Event, Heartbeat, Severity, Status

log = logging.getLogger("msmon.bot")

Emit = Callable[[Event, str, dict[str, str], float], int]  # Ingest.event

_RETIRED = 4096  # earlier attempts' processes remembered per run (a late message of one is dropped)
_PHASES = {p.value: p for p in RunPhase}  # a run's stored state (bot/store/rows.py's RunState) as its phase
RUN_FAILED = "run_failed"  # the rule of the one message a run that died sends (`Runs._failed`)
# Alerts about liveness, not about the training: at a run's end its ranks' own phases say who is missing; a job_gone
# or rank_missing still firing when the last final heartbeat comes (the watchdog or the rank check has not run since
# the job spoke again) is stale, and a run is not failed for it
LIVENESS = frozenset({"job_gone", "job_stalled", MISSING_RULE})
_NAMED = 8  # firing alerts a failure names (the rest counted)


ALIAS = "@"  # "<run_id>@<project>": the bot's name for a project's run whose id another project's run has


def alias_problem(run_id: str) -> str | None:
    """Why a job may not name its run `run_id` (None: it may). A run id with "@" could be another project's alias
    ("sq@B" created by project A's token would take project B's `sq` when A has one: every B envelope 403), so the
    jobs' run ids never hold it; the bot alone makes aliases (`JobAuth.run_owner`, bot/ingest/auth.py)."""
    if ALIAS in run_id:
        return (f"run_id {run_id[:80]!r} has {ALIAS!r}, which the bot keeps for its names of a project's run whose id "
                f"another project uses (<run_id>{ALIAS}<project>): name the run without {ALIAS!r}")
    return id_problem("run_id", run_id)


def events_problem(events: list[Event]) -> str | None:
    """Why a job's events cannot be kept (their rule or device has a control character: `status` lists them), or
    None. HTTP answers it 422, NATS drops the message as poison."""
    for ev in events:
        problem = id_problem("rule", ev.rule) or id_problem("device", ev.device)
        if problem is not None:
            return f"an event's {problem}"
    return None


def failure(errors: list[AlertView], lost: list[str]) -> str:
    """"while ERRORs fired: loss_nan on device 0 since step 1,200; rank 2 missing": why a run failed (job data: the
    receivers escape it)."""
    parts = [f"{a['rule']} on device {a['device']} since step {a['first_step']:,}" for a in errors[:_NAMED]]
    if len(errors) > _NAMED:
        parts.append(f"{len(errors) - _NAMED} more")
    said = f"while ERRORs fired: {', '.join(parts)}" if parts else ""
    if lost:
        missing = f"{', '.join(lost[:_NAMED])}{f' and {len(lost) - _NAMED} more' if len(lost) > _NAMED else ''} missing"
        said = f"{said}; {missing}" if said else f"with {missing}"
    return said


class Runs:
    def __init__(self, state: BotState, emit: Emit) -> None:
        self.state, self.emit = state, emit

    def before(self, run_id: str, rank: int | None, device: str, host: str, proc: str, now: float) -> None:
        """A message of run `run_id` from process `proc` (rank `rank`, device `device` on `host`), before the
        ingest records it: when it is a new start's, the attempt before ends and a new one starts."""
        if not proc or not self.state.cfg.ranks.enable:
            return  # an older notifier, or no view of the ranks: no way to tell a new start from a late message
        ranks = self.state.ranks.runs.get(run_id)
        was = ranks.members.get(str(rank) if rank is not None else device) if ranks is not None else None
        if was is not None and was.life.proc == proc:
            return  # the rank's own process going on (nearly every message): nothing read
        known = ranks.procs() if ranks is not None else frozenset()
        if proc in known:
            return  # a process the run has seen: going on, or late from an earlier attempt (the view drops it)
        run = self.state.store.run(run_id)
        if run is None:
            return
        # a new process of a rank that had one; without a rank, only on the same host (processes of one device
        # id on several hosts, from a launcher msmon does not know, are not restarts of each other)
        restarted = was is not None and bool(was.life.proc) and was.life.proc != proc and \
            (rank is not None or was.host == host)
        if new_attempt(_PHASES[run["state"]], known, proc, restarted):
            self._new_attempt(run, now)

    def stale(self, run_id: str, proc: str) -> bool:
        """A message of a process of an earlier attempt of the run (sent late): not the run's liveness nor series."""
        ranks = self.state.ranks.runs.get(run_id)
        return bool(proc) and ranks is not None and proc in ranks.retired

    def ended(self, beats: list[Heartbeat]) -> None:
        """After the ingest recorded them: a final heartbeat that leaves every rank of its run ended or missing (as
        many as the job's world, when it said its size) ends the run's attempt (`settle`)."""
        final = [hb for hb in beats if hb.final and not self.stale(hb.run_id, hb.proc)]
        if not final:
            return
        hb = final[-1]
        self.state.store.escalations.end_run(hb.run_id, self.state.clock(), hb.step)  # the watchdog: no job_gone
        self.settle(hb.run_id, hb.world, hb.step)

    def settle(self, run_id: str, world: int | None = None, step: int | None = None) -> None:
        """Whether the run's attempt has ended, and how (the lifecycle's `end_input` and `run_step`): after a final
        heartbeat (`step`: its step, `world`: the size it says) and after one of the run's ranks went missing.
        Every rank said final and no ERROR fires: "ended normally", its alerts close. Every rank said final or is
        missing, while an ERROR fires or a rank is missing: "failed", its alerts stay as they are (it died of them)
        and the run says so once (`_failed`)."""
        run = self.state.store.run(run_id)
        if run is None or run["ended"]:
            return
        now = self.state.clock()
        ranks = self.state.ranks.run(run_id) if self.state.cfg.ranks.enable else None
        errors = [a for a in self.state.store.alerts(run_id, "firing")
                  if a["severity"] == Severity.ERROR.value and a["rule"] not in LIVENESS]
        lost: list[str] = []
        if ranks is not None:
            members = list(ranks.members.values())
            lost = [m.name() for m in members if m.missing]
            inp = end_input(sum(m.ended for m in members), len(lost), len(members), ranks.world, bool(errors))
            step = max((m.step for m in members if m.step is not None), default=step)
        elif step is not None and (world or 1) <= 1:
            inp = end_input(1, 0, 1, world, bool(errors))
        else:
            return  # one of many ranks, and no view of the others (ranks.enable false): the watchdog's end only
        if inp is None:
            return  # other ranks go on (or are late): the run has not ended
        phase = run_step(_PHASES[run["state"]], inp)
        n = len(ranks.members) if ranks is not None else 1
        if phase is RunPhase.FAILED:
            self._failed(run, now, step, errors, lost)
            return
        self.state.store.attempts.end(run_id, run["attempt"], run["attempt_started"], now, step, ENDED_NORMALLY)
        if ranks is not None:
            ranks.firing.clear()  # its alerts close below, once, as the run's
        log.info("msmon bot: run %s%s ended normally at step %s (%d rank%s)", run_id,
                 f" attempt {run['attempt']}" if run["attempt"] > 1 else "", step, n, "s" if n != 1 else "")
        self._close(run, now, f"{RUN_ENDED}: {run_id} ended normally at step {step}")

    def _failed(self, run: RunRow, now: float, step: int | None, errors: list[AlertView], lost: list[str]) -> None:
        """The attempt ended while it was dying: recorded "failed: ...", its alerts left firing, and one ERROR
        `run_failed` through the ingest's stages (chat, console, escalation) saying the last step, the last finite
        loss and which alerts were firing."""
        run_id = run["run_id"]
        why = failure(errors, lost)
        self.state.store.attempts.end(run_id, run["attempt"], run["attempt_started"], now, step, f"{FAILED}: {why}")
        curve = self.state.windows.curves.get(run_id)
        loss = curve.said("loss") if curve is not None else "no loss was reported"
        attempt = f" attempt {run['attempt']}" if run["attempt"] > 1 else ""
        text = f"{run_id}{attempt} FAILED at step {step or 0:,}: it ended {why}; {loss}"
        log.warning("msmon bot: run %s", text)
        ev = Event(run_id=run_id, device="*", step=step or 0, time=now, rule=RUN_FAILED, severity=Severity.ERROR,
                   status=Status.FIRING, value=float(len(errors)), threshold=0.0, message=text,
                   hint="The run died of the alerts named here: they stay open until acknowledged or a new attempt "
                        "starts. The console keeps its whole curve, downsampled; restart from a checkpoint before the "
                        "first alert.")
        if self.emit(ev, run["project"], run["labels"], now):
            self.state.wake_outbox()

    def _new_attempt(self, run: RunRow, now: float) -> None:
        run_id, n = run["run_id"], run["attempt"]
        attempts = self.state.store.attempts
        if not run["ended"]:
            attempts.end(run_id, n, run["attempt_started"], now, run["last_step"],
                         "gone" if run["gone"] else f"replaced by attempt {n + 1}")
        attempts.start(run_id, n + 1, now)
        self._close(run, now, f"{RUN_ENDED}: a new attempt ({n + 1}) of {run_id} started")
        old = self.state.ranks.runs.pop(run_id, None)  # the new attempt's ranks and series start clean
        if old is not None:  # what the earlier attempts' processes still send is stale
            fresh = self.state.ranks.run(run_id, create=True)
            assert fresh is not None
            fresh.retired = frozenset(sorted(old.procs())[-_RETIRED:])
        windows = self.state.windows
        windows.runs.pop(run_id, None)
        windows.actions.pop(run_id, None)
        self.state.store.restart_run(run_id, now)
        log.info("msmon bot: run %s: attempt %d started (attempt %d %s at step %s)", run_id, n + 1, n,
                 run["end_reason"] or ("was gone" if run["gone"] else "did not end"), run["last_step"])

    def _close(self, run: RunRow, now: float, why: str) -> None:
        """Every firing alert of the run resolved, `why` as its message (through the ingest's stages)."""
        queued = 0
        for a in self.state.store.alerts(run["run_id"], "firing"):
            ev = Event(run_id=run["run_id"], device=a["device"], step=a["last_step"] or 0, time=now, rule=a["rule"],
                       severity=Severity(a["severity"]), status=Status.RESOLVED, value=0.0, threshold=0.0,
                       message=why)
            queued += self.emit(ev, run["project"], run["labels"], now)
        if queued:
            self.state.wake_outbox()


def keyed(env: Envelope, key: str) -> Envelope:
    """`env` with its run named `key` everywhere: the bot's key for a project's run whose id another
    project's run has (`JobAuth.run_owner`, bot/ingest/auth.py)."""
    def re(items: list[Any]) -> list[Any]:
        return [msgspec.structs.replace(x, run_id=key) for x in items]

    return msgspec.structs.replace(env, run_id=key, events=re(env.events), samples=re(env.samples),
                                   actions=re(env.actions), heartbeats=re(env.heartbeats))
