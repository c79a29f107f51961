"""What the bot does with a command, whoever typed it (Slack, Socket Mode, `msmon cmd`):

    parse -> audit record -> who may -> answer from the bot's own state (status, runs, ack, silence, help)
                                     or queue a Command for the run's ranks with an apply step

The job's side (polls, the jobs' answers, expiry, reports) is bot/commands/jobs.py. Both work on the
shared `BotState` (bot/shared.py). Synchronous and quick, called on the event loop.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import math
from collections.abc import Callable, Mapping
from typing import Any

from bot.commands import auth
from bot.commands.origin import Origin
from bot.commands.parse import CommandError, Parsed, format_duration, help_text, parse
from bot.pipeline.silence import Silence
from bot.ranks.table import lines as rank_lines
from bot.receivers.render import median, num
from bot.shared import BotState
from bot.store.rows import AlertView, CommandRow, CommandStatus, RunRow
from msmon.contract.actions import ACTIONS, VERB_ACTION, ParamError, check_params
from msmon.contract.wire import Event, RingCheckpoint, Severity, Status, Window
from msmon.core.trend import summarize

log = logging.getLogger("msmon.bot")


STALE = 30.0  # seconds: a status older than this says how old it is


def heard(ago: float, what: str = "last heard") -> str:
    """", last heard 12 min ago" when `ago` seconds is old enough to matter (else nothing)."""
    if ago < STALE:
        return ""
    return f", {what} {format_duration(round(ago))} ago"


@dataclasses.dataclass
class Answer:
    """The immediate answer, given at once (a chat system waits for it: Slack 3 s at most)."""

    text: str
    ok: bool = True
    status: int = 200  # for HTTP callers: 403 refused, 404 unknown run, 422 not a valid command
    private: bool = False  # only the asker sees it
    command: CommandRow | None = None  # the stored job command
    confirm: str | None = None  # a confirmation button should send this command text
    chart: Event | None = None  # status: what to draw (render_chart, off the event loop)
    record: str | None = None  # the command log's id of a command answered at once (help, runs, status)

    def to_json(self) -> dict[str, Any]:
        cmd = self.command
        return {"ok": self.ok, "text": self.text, "private": self.private, "confirm": self.confirm,
                "command": None if cmd is None else view(cmd), "record": self.record}


def view(cmd: CommandRow) -> dict[str, Any]:
    """A stored command as the API shows it."""
    keys = ("id", "created_at", "user", "source", "run_id", "text", "verb", "action", "params", "apply_step",
            "status", "detail", "results", "expires_at", "updated_at")
    return {k: v for k, v in cmd.items() if k in keys}


class CommandService:
    def __init__(self, state: BotState) -> None:
        self.state = state
        self.cfg, self.store, self.clock = state.cfg, state.store, state.clock
        # The verbs the bot answers itself on a known run; the job actions go to every rank (`_queue`), and
        # `help` and `runs` need no run. Every chat verb has exactly one of these (checked in the tests).
        self._bot_verbs: dict[str, Callable[[Parsed, RunRow, Origin, float], Answer]] = {
            "status": self._status_verb,
            "ack": lambda p, run, origin, now: self._ack(p, origin, now, run["project"]),
            "silence": lambda p, run, origin, now: self._silence(p, origin, now, run["project"]),
        }

    def handled_verbs(self) -> set[str]:
        """Every chat verb this service carries out (the tests check it is every verb the parser knows)."""
        return {"help", "runs", *VERB_ACTION, *self._bot_verbs}

    # -- commands in ------------------------------------------------------------------------------

    def submit(self, text: str, origin: Origin) -> Answer:
        """Handle one command; every one is recorded (the audit log), allowed or not."""
        now = self.clock()
        off = self._switched_off(now, origin, text)
        if off is not None:
            return off
        try:
            p = parse(text)
        except CommandError as exc:
            self._audit(now, origin, text, exc.verb or "?", None, CommandStatus.INVALID, str(exc))
            return Answer(str(exc), ok=False, status=422, private=True)
        return self._handle(p, origin, text, now)

    def submit_parsed(self, p: Parsed, origin: Origin) -> Answer:
        """Handle one command given as a structure (the console's ack and silence buttons: the run, rule and
        device are the alert's own fields, never text joined from job data and parsed back), exactly as
        `submit` handles its text: the same permissions and audit log."""
        now = self.clock()
        off = self._switched_off(now, origin, p.text())
        return off if off is not None else self._handle(p, origin, p.text(), now)

    def _switched_off(self, now: float, origin: Origin, text: str) -> Answer | None:
        if self.cfg.commands.enable:
            return None
        msg = "Commands are switched off on this bot (commands.enable in its bot.yaml)."
        self._audit(now, origin, text, "?", None, CommandStatus.REJECTED, msg)
        return Answer(msg, ok=False, status=403, private=True)

    def _handle(self, p: Parsed, origin: Origin, text: str, now: float) -> Answer:
        if p.verb in ("help", "runs"):
            rec = self._audit(now, origin, p.text(), p.verb, None, CommandStatus.DONE, "")
            return Answer(help_text(p.topic) if p.verb == "help" else self._runs_text(), record=rec["id"])
        run = self.store.run(p.run or "")
        if run is None:
            msg = self._unknown_run(p.run or "")
            self._audit(now, origin, text, p.verb, p.run, CommandStatus.REJECTED, msg)
            return Answer(msg, ok=False, status=404, private=True)
        project = run["project"]
        if p.destructive and not auth.allowed(origin.user, project, self.cfg.commands.allow,
                                              self.cfg.commands.groups):
            msg = (f"{origin.who} may not `{p.verb}` runs of project {project}: ask "
                   f"{auth.who_may(project, self.cfg.commands.allow)}. (This attempt is recorded.)")
            self._audit(now, origin, p.text(), p.verb, p.run, CommandStatus.DENIED, msg, project)
            log.warning("msmon bot: DENIED %s from %s (%s) on run %s: not in commands.allow for project %s",
                        p.text(), origin.who, origin.source, p.run, project)
            return Answer(msg, ok=False, status=403, private=True)
        if p.verb == "stop" and not p.confirmed:
            return Answer(f"Stop run {p.run}? It saves a checkpoint, then ends training on every rank.",
                          private=True, confirm=f"stop {p.run} confirm")
        if p.verb in VERB_ACTION:  # a job action (msmon/contract/actions.py): every rank applies it
            return self._queue(p, run, origin, now)
        return self._bot_verbs[p.verb](p, run, origin, now)

    def _audit(self, now: float, origin: Origin, text: str, verb: str, run_id: str | None, status: CommandStatus,
               detail: str, project: str | None = None) -> CommandRow:
        with self.store.tx():
            return self.store.commands.add(
                created_at=now, user=origin.user, source=origin.source, project=project, run_id=run_id, text=text,
                verb=verb, action=VERB_ACTION.get(verb), params={}, apply_step=None, status=status, detail=detail,
                origin=origin.to_stored(), expires_at=None)

    def _unknown_run(self, run_id: str) -> str:
        known = [r["run_id"] for r in self.store.runs()]
        close = difflib.get_close_matches(run_id, known, n=1, cutoff=0.6)
        hint = f" Did you mean `{close[0]}`?" if close else ""
        listed = ", ".join(known[:10]) + (" ..." if len(known) > 10 else "") if known else "none yet"
        return f"No run `{run_id}` has reported to this bot.{hint} Known runs: {listed}. (`runs` lists them.)"

    def _enqueue(self, p: Parsed, run: RunRow, origin: Origin, now: float, action: str,
                 params: dict[str, Any]) -> tuple[CommandRow, list[CommandRow]]:
        """Store `action` for every rank of `run`, past its latest step and the commands still waiting, and wake
        the ranks' polls: (the command, the commands that were waiting)."""
        # Never before a command accepted earlier and still waiting: every rank applies a run's commands in
        # acceptance order, so a resume's "at once" cannot overtake a pending pause (it cancels it instead).
        waiting = self.store.commands.open_for(run["run_id"])
        apply_step = max([self.apply_step(run, now), *(int(c["apply_step"] or 0) for c in waiting)])
        with self.store.tx():
            cmd = self.store.commands.add(
                created_at=now, user=origin.user, source=origin.source, project=run["project"], run_id=run["run_id"],
                text=p.text(), verb=p.verb, action=action, params=params, apply_step=apply_step,
                status=CommandStatus.PENDING, detail="", origin=origin.to_stored(),
                expires_at=now + self.cfg.commands.expire_after)
        self.state.waiters.wake(run["run_id"])
        return cmd, waiting

    def _queue(self, p: Parsed, run: RunRow, origin: Origin, now: float) -> Answer:
        action = VERB_ACTION[p.verb]
        # The action's parameters, by the names the action table gives them (a parsed field of the same name)
        params = {param.name: getattr(p, param.name) for param in ACTIONS[action].params
                  if getattr(p, param.name, None) is not None}
        if action == "rewind" and params.get("before") == -1:
            params.update(self._alert_onset(run["run_id"]))
        try:  # what the parser checked, again on what goes to the ranks (a Parsed built in code, the alert onset)
            params = check_params(action, params)
        except ParamError as exc:
            return self._refuse(p, run, origin, now, str(exc))
        to = params.get("to")
        if isinstance(to, int) and to > max(self.apply_step(run, now), int(run["last_step"] or 0)):
            return self._refuse(p, run, origin, now, f"cannot rewind forward: step {to:,} is after the step the run "
                                                     f"would apply it at ({self.apply_step(run, now):,})")
        cmd, waiting = self._enqueue(p, run, origin, now, action, params)
        apply_step = int(cmd["apply_step"] or 0)
        log.info("msmon bot: command %s `%s` from %s (%s): every rank of run %s applies it at step %d", cmd["id"],
                 p.text(), origin.who, origin.source, run["run_id"], apply_step)
        who = "every rank" if len(run["devices"]) > 1 else "the job"
        pauses = [c["id"] for c in waiting if c["action"] == "pause"]
        when = ((f"cancels {', '.join(pauses)} if not paused yet, else " if pauses else "")
                + "resumes as soon as it gets it") if p.verb == "resume" else (
                f"applies it at step {apply_step:,} (last reported step {run['last_step'] or 0:,})")
        gone = (f" Careful: run {run['run_id']} has sent no heartbeat for a while (gone?); the command waits "
                f"{self.cfg.commands.expire_after:.0f} s for it." if run["gone"] else "")
        return Answer(f"`{p.text()}` queued as {cmd['id']}: {who} {when}. The result will be reported here.{gone}",
                      command=cmd)

    def _refuse(self, p: Parsed, run: RunRow, origin: Origin, now: float, why: str) -> Answer:
        """A job action whose parameters no rank would take: answered here, recorded, nothing queued."""
        msg = f"`{p.text()}` not queued: {why}. Nothing was sent to run {run['run_id']}."
        self._audit(now, origin, p.text(), p.verb, run["run_id"], CommandStatus.INVALID, msg, run["project"])
        return Answer(msg, ok=False, status=422, private=True)

    def _alert_onset(self, run_id: str) -> dict[str, Any]:
        """`rewind <run> before-alert`: the first step of the run's earliest firing alert, the same for every rank
        (each rank's own newest alert may differ: a bad shard spikes on one rank). None firing: the job's own."""
        firing = [a for a in self.store.alerts(run_id, "firing") if a.get("first_step") is not None]
        if not firing:
            return {}
        first = min(firing, key=lambda a: int(a["first_step"]))
        return {"before": int(first["first_step"]), "alert": str(first["rule"])}

    def apply_step(self, run: RunRow, now: float) -> int:
        """The step at which every rank applies a command: past the latest step any rank can have
        reached by the time the command reaches them. Reports lag (samples travel in batches), so the
        run's pace covers the time since its newest report (by the job's clock and by the bot's receipt,
        whichever is older: skewed clocks only add margin) plus `commands.apply_lead`."""
        last = int(run["last_step"] or 0)
        if run["paused"]:
            return last  # the ranks wait at the paused step: a command applies there, at once (JobControl)
        pace = self.state.windows.pace(run["run_id"])
        if pace is None:
            return last + 1
        rate, sampled_at = pace
        newest = max(sampled_at, self.state.resumed_at.get(run["run_id"], 0.0))
        behind = 0.0 if run["paused"] else max(now - newest, now - (run["last_progress"] or now), 0.0)
        ahead = math.ceil(rate * (behind + self.cfg.commands.apply_lead))
        log.debug("msmon bot: run %s: last step %d reported %.2f s ago at %.1f steps/s: apply %d steps ahead",
                  run["run_id"], last, behind, rate, ahead + 1)
        return last + 1 + ahead

    # -- the read-only commands ---------------------------------------------------------------------

    def _runs_text(self) -> str:
        runs = self.store.runs()
        if not runs:
            return "No run has reported to this bot yet."
        lines = []
        now = self.clock()
        for r in runs[:30]:
            firing = self.store.alerts(r["run_id"], "firing")
            attempt = f" attempt {r['attempt']}" if r["attempt"] > 1 else ""
            lines.append(f"`{r['run_id']}` ({r['project']}){attempt} step {r['last_step'] or 0:,}, {r['state']}, seen "
                         f"{now - (r['last_seen'] or now):.0f} s ago, {len(firing)} alert(s) firing")
        return "\n".join(lines)

    def _status_verb(self, p: Parsed, run: RunRow, origin: Origin, now: float) -> Answer:
        rec = self._audit(now, origin, p.text(), p.verb, p.run, CommandStatus.DONE, "", run["project"])
        return dataclasses.replace(self._status(run), record=rec["id"])

    def _status(self, run: RunRow) -> Answer:
        run_id = run["run_id"]
        self.state.flush()
        state = (f"{run['state'].upper()} ({run['end_reason']})" if run["ended"] else "GONE (no heartbeat)"
                 if run["gone"] else "PAUSED" if run["paused"] else "running")
        attempt = f", attempt {run['attempt']}" if run["attempt"] > 1 else ""
        lines = [f"*{run_id}* ({run['project']}{attempt}): step {run['last_step'] or 0:,}, {state}, devices "
                 f"{', '.join(run['devices'])}{heard(self.clock() - (run['last_seen'] or self.clock()))}"]
        lines += [f"attempt {a['attempt']}: {a['end_reason'] or 'going on'} at step {a['last_step'] or 0:,}"
                  for a in self.store.attempts.of(run_id)[-4:] if a["attempt"] < run["attempt"]]
        ring = _ring_line(self.state.windows.checkpoints.get(run_id))
        if ring:
            lines.append(ring)
        dropped = self.state.drops.line(run_id)  # what its job dropped before the bot took it
        if dropped:
            lines.append(dropped)
        hist = self._history(run)
        if hist:
            behind = (run["last_step"] or 0) - hist[-1].step
            if behind > 0:  # its samples were shed (the bot was overloaded) or not sent: say how old these are
                lines.append(f"metrics as of step {hist[-1].step:,}, {behind:,} steps before the last reported step"
                             f"{heard(self.clock() - hist[-1].time, 'sampled')}")
            window = Window.of(hist)
            for name, values in (("loss", window.loss), ("lr", window.learning_rate),
                                 ("grad norm", window.grad_norm), ("tokens/s", window.tokens_per_s)):
                now = next((v for v in reversed(values) if v is not None), None)
                if now is not None:
                    lines.append(f"{name} {num(now)} (median of the last {len(values)}: {num(median(values))})")
            scaling = _loss_scale_line(hist)
            if scaling is not None:
                lines.append(scaling)
            total, target = self.state.windows.plans.get(run_id, (None, None))
            pace = self.state.windows.pace(run_id)
            if total is not None and pace is not None and not run["paused"]:
                left = max(total - (run["last_step"] or 0), 0) / pace[0]
                lines.append(f"ETA to step {total:,}: {format_duration(max(round(left), 1))} at {pace[0]:.3g} steps/s")
            trend = summarize(window.steps, window.loss, total_steps=total, target_loss=target)
            if trend is not None:
                lines += trend.describe()[:4]
        else:
            lines.append("no metrics received yet")
        ranks = self.state.ranks.runs.get(run_id)
        if ranks is not None:
            lines += rank_lines(ranks, self.state.cfg.ranks, self.state.clock())  # per-rank table (bot/ranks)
        firing = self.store.alerts(run_id, "firing")
        for a in firing:
            acked = f", acknowledged by {a['acked_by']}" if a["acked_by"] else ""
            lines.append(f"FIRING {a['severity']} {a['rule']} on device {a['device']} {_since(a)}"
                         f"{acked} (ack: `ack {run_id}/{a['rule']}`)")
        if not firing:
            lines.append("no alert firing")
        for c in self.store.commands.open_for(run_id):  # what is queued: when it applies, who answered
            answered = f", {len(c['results'])}/{len(run['devices'])} answered" if c["results"] else ""
            when = (f"applies at the paused step {run['last_step'] or 0:,}, at once" if run["paused"]
                    else f"waits for step {c['apply_step']:,}")
            lines.append(f"queued: command {c['id']} `{c['text']}` {when}{answered}")
        lines += _level_change_lines(self.store.commands.level_changes(run_id, limit=20))
        return Answer("\n".join(lines), chart=_status_event(run, hist, firing) if hist else None)

    def _history(self, run: RunRow) -> list[Any]:
        devices = sorted(self.state.windows.runs.get(run["run_id"], {}))
        return self.state.windows.history(run["run_id"], devices[0]) if devices else []

    def _ack(self, p: Parsed, origin: Origin, now: float, project: str) -> Answer:
        run_id, rule = p.run or "", p.rule or ""
        with self.store.tx():
            fps = self.store.ack(run_id, rule, p.device, origin.who)
        self.state.index.acked(fps)
        where = f"device {p.device}" if p.device else "all devices"
        if not fps:
            firing = sorted({a["rule"] for a in self.store.alerts(run_id, "firing")})
            msg = (f"Nothing to acknowledge: `{rule}` is not firing on {where} of run {run_id}. Firing now: "
                   f"{', '.join(firing) or 'nothing'}.")
            self._audit(now, origin, p.text(), p.verb, run_id, CommandStatus.REJECTED, msg, project)
            return Answer(msg, ok=False, private=True)
        msg = (f"{origin.who} acknowledged {rule} on {where} of run {run_id}: no reminders until it resolves, and "
               "its escalation stops (a rise to ERROR still pages).")
        self._audit(now, origin, p.text(), p.verb, run_id, CommandStatus.DONE, msg, project)
        cmd = self.tell_job_acked(run_id, rule, p.device, origin, now)
        if cmd is None:
            return Answer(msg)
        return Answer(f"{msg} The job takes the level it holds now as the new normal at step {cmd['apply_step']:,} "
                      f"({cmd['id']}; reported here).", command=cmd)

    def tell_job_acked(self, run_id: str, rule: str, device: str | None, origin: Origin,
                       now: float) -> CommandRow | None:
        """The job hears of an acknowledgement (from chat, the console or an email link): an `acknowledge`
        command for every rank, so a level shift its rule holds against the pre-shift reference becomes the
        new normal. The command, or None for a run the bot does not know."""
        run = self.store.run(run_id)
        if run is None:
            return None
        params = {"rule": rule} if device is None else {"rule": rule, "device": device}
        cmd, _ = self._enqueue(Parsed("ack", run=run_id, rule=rule, device=device), run, origin, now, "acknowledge",
                               params)
        return cmd

    def _silence(self, p: Parsed, origin: Origin, now: float, project: str) -> Answer:
        duration = float(p.duration or 0.0)
        with self.store.tx():
            sid = self.store.add_silence(Silence(id=0, expires_at=now + duration, run_id=p.run, rule=p.rule,
                                                 created_by=origin.who, comment=p.text()))
        what = f"{p.rule} alerts" if p.rule else "all alerts"
        msg = f"Silenced {what} of run {p.run} for {format_duration(duration)} (silence {sid}, by {origin.who})."
        self._audit(now, origin, p.text(), p.verb, p.run, CommandStatus.DONE, msg, project)
        return Answer(msg)


def _since(alert: AlertView) -> str:
    """Since when a firing alert fires and, where that differs, the step of the alert that was posted
    (the notification log's sent_step): the episode's first event may have been held back (inhibited,
    silenced) and the message in the channel raised at a later step."""
    first, posted = alert["first_step"], alert.get("sent_step")
    if alert["sent_severity"] is None or alert["sent_resolved"]:  # nothing sent in this episode
        return f"since step {first:,} (not posted: held back by an inhibit or a silence)"
    if posted is None or posted == first:  # posted is None: a row from before the notification log had steps
        return f"since step {first:,}"
    return f"since step {first:,}, posted at step {posted:,}"


def _level_change_lines(changes: list[dict[str, Any]], shown: int = 3) -> list[str]:
    """The run's latest threshold changes, one line each (a change every rank answered is one line): step, by
    whom and why, and the job's detail (the levels and what they would have done on its recent samples)."""
    seen: set[tuple[Any, ...]] = set()
    lines: list[str] = []
    for c in changes:
        key = (c["command_id"] or c["step"], c["action"], c["rule"])
        if key in seen:
            continue
        seen.add(key)
        if len(lines) < shown:
            lines.append(f"level change at step {c['step']:,} by {c['who']} (`{c['why']}`): {c['detail']}")
    return lines


def _ring_line(devices: Mapping[str, list[RingCheckpoint]] | None) -> str | None:
    """`health checkpoints (device 0): step 500 healthy, step 600 unhealthy (loss_spike ERROR at step 610); 2 of 2
    devices list the same steps`: what `rewind` can load (docs/rewind.md). None when the job keeps none."""
    if not devices:
        return None
    device, ring = next(iter(sorted(devices.items())))
    if not ring:
        return f"health checkpoints (device {device}): none yet"
    shown = ", ".join(f"step {c.step:,} {c.health}"
                      + (f" ({c.why})" if c.health in ("unhealthy", "doubted") and c.why else "") for c in ring[-8:])
    steps = [c.step for c in ring]
    same = sum(1 for r in devices.values() if [c.step for c in r] == steps)
    agree = f"; {same} of {len(devices)} devices list the same steps" if len(devices) > 1 else ""
    good = [c.step for c in ring if c.health == "healthy"]
    hint = f"; `rewind` loads step {good[-1]:,}" if good else "; no healthy one: `rewind` would be refused"
    return f"health checkpoints (device {device}): {shown}{agree}{hint}"


def _loss_scale_line(hist: list[Any]) -> str | None:
    """fp16 dynamic loss scaling in a status: the scale now, the sampled steps skipped (overflow) in the window
    and the job's running count of skipped steps, e.g. "loss scale 1024, 3 steps skipped (overflow) in the last
    600 samples; 41 in the run". None for a run whose samples say nothing of loss scaling."""
    scale = next((s.loss_scale for s in reversed(hist) if s.loss_scale is not None), None)
    total = next((s.skipped_steps for s in reversed(hist) if s.skipped_steps is not None), None)
    if scale is None and total is None and all(s.overflow is None for s in hist):
        return None
    skipped = sum(1 for s in hist if s.overflow)
    whole = scale is not None and math.isfinite(scale) and scale.is_integer() and abs(scale) < 1e16
    parts = [f"loss scale {scale:.0f}" if whole else f"loss scale {num(scale)}"] if scale is not None else []
    parts.append(f"{skipped} step{'' if skipped == 1 else 's'} skipped (overflow) in the last {len(hist)} samples"
                 + (f"; {total:,} in the run" if total is not None else ""))
    return ", ".join(parts)


def _status_event(run: RunRow, hist: list[Any], firing: list[AlertView]) -> Event:
    """The run's recent window dressed as an event, so the alert chart draws it: FIRING at the highest severity
    firing (its title and colour say so), RESOLVED (green) when nothing fires."""
    last = hist[-1]
    top = Severity.ERROR if any(a["severity"] == Severity.ERROR.value for a in firing) else Severity.WARNING
    rules = ", ".join(sorted({a["rule"] for a in firing if a["severity"] == top.value}))
    says = f"{top.value} firing: {rules}" if firing else "no alert firing"
    return Event(run_id=run["run_id"], device=last.device, step=last.step, time=last.time, rule="status",
                 severity=top, status=Status.FIRING if firing else Status.RESOLVED, value=math.nan,
                 threshold=math.nan, message=f"status of run {run['run_id']} at step {last.step}: {says}",
                 window=Window.of(hist))

