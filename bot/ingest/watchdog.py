"""Tells "process dead" from "alive but not stepping", from the jobs' heartbeats, and raises it
through the same event path as any other alert (rules `job_gone` and `job_stalled`): ERRORs that
escalate like any other (bot/escalation), saying the last step and when the run was last seen.
Never for a paused run (it heartbeats without stepping on purpose) nor for a run that ended
normally (its last heartbeat says `final`; bot/store/sqlite.py's run_ends)."""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import time
from collections.abc import Callable
from datetime import datetime, timezone

from bot.config import BotConfig
from bot.ingest.envelope import Ingest
from bot.runs.lifecycle import RunInput, silence
from bot.store.rows import RunRow
from bot.store.sqlite import Store
from msmon.contract.wire import Event, Severity, Status

HINTS = {
    "job_gone": "No heartbeat: the process died or its host is unreachable. Check the scheduler and the node; "
                "restart from the last checkpoint.",
    "job_stalled": "The process is alive but not stepping: a hung collective, a dead data loader or a deadlock. "
                   "Look at the ranks' stacks (py-spy dump) before killing it.",
}


def verdicts(run: RunRow, now: float, heartbeat_timeout: float, stall_timeout: float,
             ended_at: float | None = None, since: float = 0.0) -> dict[str, float]:
    """Pure: rule -> seconds of silence, for the conditions that hold for this run now (the run lifecycle's
    `silence`, bot/runs/lifecycle.py). A run whose attempt ended, or whose last heartbeat was a final one
    (`ended_at`), ended normally: nothing. `since`: the bot's own start, from which silence counts at the
    earliest (a bot outage pages nothing for the runs that went on meanwhile)."""
    hb = run.get("last_heartbeat")
    if hb is None or run.get("ended") or (ended_at is not None and ended_at >= hb):
        return {}  # never sent a heartbeat (a replay, an old notifier), or said it ended: nothing to judge
    found = silence(hb, run.get("last_progress"), bool(run.get("paused")), now, heartbeat_timeout, stall_timeout,
                    since)
    if found is RunInput.NO_HEARTBEAT:
        return {"job_gone": now - max(hb, since)}
    if found is RunInput.NO_PROGRESS:
        return {"job_stalled": now - max(run["last_progress"] or since, since)}
    return {}


def _clock_time(t: float | None) -> str:
    return "never" if t is None else datetime.fromtimestamp(t, tz=timezone.utc).strftime("%H:%M UTC")


def silence_text(run: RunRow, rule: str, silent: float, limit: float) -> str:
    """"run-42 stopped reporting at step 12,400, last seen 02:13 UTC (...)": the last step and time seen."""
    step = f"{run['last_step'] or 0:,}"
    if rule == "job_gone":
        return (f"{run['run_id']} stopped reporting at step {step}, last seen {_clock_time(run['last_heartbeat'])} "
                f"(no heartbeat for {silent:.0f} s; limit {limit:.0f} s)")
    return (f"{run['run_id']} is alive but has not stepped past step {step} since "
            f"{_clock_time(run['last_progress'])} (no progress for {silent:.0f} s; limit {limit:.0f} s)")


class Watchdog:
    def __init__(self, cfg: BotConfig, store: Store, ingest: Ingest, clock: Callable[[], float] = time.time,
                 period: float = 2.0) -> None:
        self.cfg, self.store, self.ingest, self.clock, self.period = cfg, store, ingest, clock, period
        self.firing: dict[tuple[str, str], bool] = {}
        self.started = clock()  # the `bot restart` event: silence counts from here at the earliest
        self.checked: float | None = None  # the last pass (None: none yet)
        # run -> the next time its silence crosses a timeout, as its row read last said, and a heap of (time, run)
        # holding at least one entry at or before it: a run's deadline only moves later while it is not read (it
        # is read whenever it is heard from), so an entry that comes due is put back at the later time unread
        self.deadline: dict[str, float] = {}
        self._heap: list[tuple[float, str]] = []

    def candidates(self, now: float) -> list[RunRow]:
        """The runs whose verdict can have changed since the last pass, so that a pass costs what changed,
        not every stored run (100,000 runs read every 2 s held the loop for seconds). A verdict changes
        only when the run is heard from (its last_seen moves: a heartbeat, a pause, its end: the index
        runs_last_seen) or when its silence crosses a timeout (the deadlines kept from the rows read);
        every run on the first pass and when the bot-start grace ends."""
        p, prev = self.cfg.pipeline, self.checked
        # (a second's overlap on every bound: a run read twice is judged twice, the same way; one missed is not)
        if prev is None or any(prev - 1.0 <= self.started + t <= now for t in (p.heartbeat_timeout, p.stall_timeout)):
            return self.store.runs()
        ids = dict.fromkeys(self.store.runs_seen_since(prev - 1.0))
        heap = self._heap
        while heap and heap[0][0] < now:
            at, run_id = heapq.heappop(heap)
            due = self.deadline.get(run_id)
            if due is None:
                continue  # read since (and its deadline passed or none is left), or a second entry of it
            if due >= now:
                if due > at:
                    heapq.heappush(heap, (due, run_id))  # heard from since it was planned: later, no read
                continue
            del self.deadline[run_id]
            ids[run_id] = None
        return [run for run in (self.store.run(run_id) for run_id in ids) if run is not None]

    def check(self) -> int:
        now = self.clock()
        p = self.cfg.pipeline
        queued = 0
        runs = self.candidates(now)
        ended = self.store.escalations.ended_of([run["run_id"] for run in runs])
        self.checked = now
        for run in runs:
            ended_at = ended.get(run["run_id"])
            found = verdicts(run, now, p.heartbeat_timeout, p.stall_timeout, ended_at, self.started)
            for rule in ("job_gone", "job_stalled"):
                key = (run["run_id"], rule)
                if rule in found and not self.firing.get(key):
                    self.firing[key] = True
                    queued += self._raise(run, rule, Status.FIRING, found[rule], now)
                    if rule == "job_gone":
                        self.store.mark_gone(run["run_id"], True)
                elif rule not in found and self.firing.get(key):
                    self.firing[key] = False
                    queued += self._raise(run, rule, Status.RESOLVED, 0.0, now)
            self._plan(run, ended_at, now)
        if queued:
            self.ingest.state.wake_outbox()
        return queued

    def _plan(self, run: RunRow, ended_at: float | None, now: float) -> None:
        """Keep when this run's silence next crosses a timeout (none: it never heartbeat, it ended, or both
        timeouts are crossed already: only its being heard from changes its verdict)."""
        run_id, hb, progress, p = run["run_id"], run.get("last_heartbeat"), run.get("last_progress"), self.cfg.pipeline
        times = []
        if hb is not None and not run.get("ended") and (ended_at is None or ended_at < hb):
            times.append(max(hb, self.started) + p.heartbeat_timeout)
            if not run.get("paused") and progress is not None:
                times.append(max(progress, self.started) + p.stall_timeout)
        due = min((t for t in times if t >= now), default=None)
        if due is None:
            self.deadline.pop(run_id, None)
            return
        old = self.deadline.get(run_id)
        self.deadline[run_id] = due
        if old is None or due < old:
            heapq.heappush(self._heap, (due, run_id))

    def _raise(self, run: RunRow, rule: str, status: Status, silent: float, now: float) -> int:
        limit = self.cfg.pipeline.heartbeat_timeout if rule == "job_gone" else self.cfg.pipeline.stall_timeout
        ev = Event(run_id=run["run_id"], device="*", step=run["last_step"] or 0, time=now, rule=rule,
                   severity=Severity.ERROR, status=status, value=silent, threshold=limit,
                   message=silence_text(run, rule, silent, limit) if status is Status.FIRING else f"{rule} cleared",
                   hint=HINTS[rule] if status is Status.FIRING else "")
        return self.ingest.event(ev, run["project"], run["labels"], now)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.check()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), self.period)
