"""The lifecycles of runs and of their ranks: pure, clock injected, each one transition table.

    a rank:  reporting ─quiet─► late ─silent, the others go on─► missing
                 ▲  ◄──────── a newer message of its process ───────┘
                 └─ final heartbeat ─► ended      (only a new process of the rank leaves it: a new attempt)

    a run:   (created by its job's own first message) ─► running ⇄ paused
             running ─no progress─► stalled ─► gone (no heartbeat)   ended (every rank said final)
             any ─ every rank said final or is missing, while an ERROR fires or a rank is missing ─► failed
             ended / failed / gone ─ a process of a new start ─► running, attempt n+1

A run that ends while it is dying (NaN to its last step, a rank killed) has not "ended normally": it is
`failed`, its alerts keep their state (they are why it died; bot/ingest/runs.py), and the run says so once.

What moves them is a table, as in h11's `_state.py`: `RANK_TABLE[(phase, input)]` and
`RUN_TABLE[(phase, input)]`; a pair not in the table is a bug (LifecycleError), never a silent guess.
The inputs come from what the jobs send (envelope, heartbeat, final heartbeat), the bot's own clock
(a tick of the watchdog or of the rank rules) and the bot's own start (`bot restart`: a grace period, so
an outage of the bot pages nothing for the runs that went on meanwhile). A message is ordered by the
job's own numbers, never by arrival: each process sends a nonce of its own start (`proc`) and numbers its
heartbeats (`seq`); a heartbeat overtaken in flight by a newer one, an envelope retried after its
process said final, or anything of an earlier attempt's process is `STALE` and moves nothing.

Used by bot/ranks/view.py (a rank's phase), bot/ranks/missing.py (who is missing), bot/ingest/watchdog.py (a
run's silence) and bot/ingest/runs.py (a run's end and attempts); the I/O stays at those edges.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable

RUN_ENDED = "run ended"  # the resolution reason of an alert closed with its run's attempt (bot/ingest/runs.py)
ENDED_NORMALLY = "ended normally"  # an attempt's end reason (run_attempts.end_reason)
FAILED = "failed"  # the first word of a failed attempt's end reason: "failed: ..." (`ended_phase`)


class LifecycleError(Exception):
    """A transition the table does not have: a bug in the caller, not in the job's data."""


class RankPhase(str, enum.Enum):
    REPORTING = "reporting"
    LATE = "late"  # quiet for longer than usual; not yet paged
    MISSING = "missing"  # silent while the other ranks go on: rank_missing
    ENDED = "ended"  # its final heartbeat came: it finished normally


class RankInput(str, enum.Enum):
    REPORT = "report"  # a newer message of the rank's own process (envelope or heartbeat)
    FINAL = "final"  # its process's final heartbeat
    RESTART = "restart"  # a message of a new process of this rank (a re-run, a resume)
    STALE = "stale"  # older than what was seen of its process, or of an earlier attempt's process
    QUIET = "quiet"  # a tick: silent for `late_after`
    SILENT = "silent"  # a tick: silent for `missing_after` while the others report (or already missing)


_R, _L, _M, _E = RankPhase.REPORTING, RankPhase.LATE, RankPhase.MISSING, RankPhase.ENDED
RANK_TABLE: dict[tuple[RankPhase, RankInput], RankPhase] = {
    **{(p, RankInput.REPORT): _R for p in (_R, _L, _M)},
    **{(p, RankInput.FINAL): _E for p in (_R, _L, _M)},
    **{(p, RankInput.RESTART): _R for p in RankPhase},
    **{(p, RankInput.STALE): p for p in RankPhase},
    (_R, RankInput.QUIET): _L, (_L, RankInput.QUIET): _L, (_M, RankInput.QUIET): _M,
    (_R, RankInput.SILENT): _M, (_L, RankInput.SILENT): _M, (_M, RankInput.SILENT): _M,
    (_E, RankInput.QUIET): _E, (_E, RankInput.SILENT): _E,
    # (ENDED, REPORT) and (ENDED, FINAL) are not here: `classify` makes a message of an ended process STALE
}


@dataclasses.dataclass
class RankLife:
    """One rank's lifecycle: its phase, its current process and what was seen of it (the bot's clock)."""

    phase: RankPhase = RankPhase.REPORTING
    proc: str = ""  # its current process's nonce ("" : not said, an older notifier)
    seq: int | None = None  # the newest heartbeat number seen of that process
    last_seen: float = 0.0
    paused: bool = False
    past: frozenset[str] = frozenset()  # earlier processes of this rank: their messages are stale


def classify(life: RankLife, proc: str, seq: int | None, final: bool) -> list[RankInput]:
    """What one message of a rank means for it (pure): the inputs to apply, in order."""
    if proc and proc != life.proc:
        if proc in life.past:
            return [RankInput.STALE]
        if life.proc:
            return [RankInput.RESTART, RankInput.FINAL if final else RankInput.REPORT]
        # the first process named (an older notifier's "" before it, or nothing yet): the same rank going on
    if life.phase is RankPhase.ENDED and not (proc and proc != life.proc):
        return [RankInput.STALE]  # its process said final: nothing later of it moves the rank back
    if seq is not None and life.seq is not None and seq <= life.seq and (not proc or proc == life.proc):
        return [RankInput.STALE]  # overtaken in flight by a newer heartbeat
    return [RankInput.FINAL if final else RankInput.REPORT]


def step(life: RankLife, inp: RankInput) -> RankPhase:
    try:
        return RANK_TABLE[(life.phase, inp)]
    except KeyError:
        raise LifecycleError(f"a rank in phase {life.phase.value} cannot take {inp.value}") from None


def on_message(life: RankLife, now: float, *, proc: str = "", seq: int | None = None, final: bool = False,
               paused: bool | None = None) -> list[RankInput]:
    """Apply one message of the rank (an envelope: seq None; a heartbeat: its seq, final, paused); the
    inputs it was taken as. STALE leaves everything as it was, its time included."""
    inputs = classify(life, proc, seq, final)
    for inp in inputs:
        life.phase = step(life, inp)
        if inp is RankInput.STALE:
            return inputs
        if inp is RankInput.RESTART:
            life.past = life.past | {life.proc}
            life.proc, life.seq, life.paused = proc, None, False
    if proc and not life.proc:
        life.proc = proc
    if seq is not None:
        life.seq = seq
    if paused is not None:
        life.paused = paused
    life.last_seen = max(life.last_seen, now)
    return inputs


def tick_input(life: RankLife, now: float, others_report: bool, late_after: float,
               missing_after: float) -> RankInput | None:
    """What the clock says of one rank (pure): SILENT when it has been silent for `missing_after` while
    the others report (a rank already missing stays so while silent, whatever the others do), QUIET
    when silent for `late_after`, else nothing."""
    if life.phase is RankPhase.ENDED:
        return None
    silent = now - life.last_seen
    if silent > missing_after and (others_report or life.phase is RankPhase.MISSING):
        return RankInput.SILENT
    return RankInput.QUIET if silent > late_after else None


def tick(lives: Iterable[RankLife], now: float, late_after: float, missing_after: float) -> None:
    """One tick over a run's ranks: late and missing ones marked. The others "go on" for a rank when one was
    heard from within `missing_after` and has not ended, or one said final after this rank fell silent (it
    outlived it: a rank killed just before the others finished is missing, not late for ever); a rank comes
    back only by a message of its own."""
    lives = list(lives)
    going = [x for x in lives if x.phase is not RankPhase.ENDED and now - x.last_seen <= missing_after]
    last_end = max((x.last_seen for x in lives if x.phase is RankPhase.ENDED), default=None)
    for life in lives:
        others = any(o is not life for o in going) or (last_end is not None and last_end > life.last_seen)
        inp = tick_input(life, now, others, late_after, missing_after)
        if inp is not None:
            life.phase = step(life, inp)


def all_ended(lives: Iterable[RankLife], world: int | None) -> bool:
    """A run's ranks all said final (and, when the job said its world's size, that many of them)."""
    lives = list(lives)
    return bool(lives) and all(x.phase is RankPhase.ENDED for x in lives) and len(lives) >= (world or 0)


# -- a run ----------------------------------------------------------------------------------------

class RunPhase(str, enum.Enum):
    RUNNING = "running"
    PAUSED = "paused"
    STALLED = "stalled"  # heartbeats, no progress (job_stalled)
    GONE = "gone"  # no heartbeat (job_gone)
    ENDED = "ended"  # every rank said final, and no ERROR fired then
    FAILED = "failed"  # it ended while an ERROR fired or with a rank missing: it died of them


class RunInput(str, enum.Enum):
    PROGRESS = "progress"  # a message of the current attempt (a step, a heartbeat)
    PAUSE = "pause"  # its ranks say paused
    RESUME = "resume"
    NO_PROGRESS = "no_progress"  # a tick: heartbeats without a step for stall_timeout
    NO_HEARTBEAT = "no_heartbeat"  # a tick: silent for heartbeat_timeout
    ALL_FINAL = "all_final"  # every rank said final
    DIED = "died"  # every rank said final or is missing, while an ERROR fires or a rank is missing (`end_input`)
    NEW_ATTEMPT = "new_attempt"  # a process of a new start of the job
    BOT_RESTART = "bot_restart"  # the bot itself started: what it holds of the run's liveness is old


_RU, _PA, _ST, _GO, _EN = RunPhase.RUNNING, RunPhase.PAUSED, RunPhase.STALLED, RunPhase.GONE, RunPhase.ENDED
_FA = RunPhase.FAILED
_LIVE = (_RU, _PA, _ST, _GO)
RUN_TABLE: dict[tuple[RunPhase, RunInput], RunPhase] = {
    **{(p, RunInput.PROGRESS): _RU for p in (_RU, _ST, _GO)},
    (_PA, RunInput.PROGRESS): _PA,
    **{(p, RunInput.PAUSE): _PA for p in _LIVE},
    **{(p, RunInput.RESUME): _RU for p in _LIVE},
    (_RU, RunInput.NO_PROGRESS): _ST, (_ST, RunInput.NO_PROGRESS): _ST,
    (_PA, RunInput.NO_PROGRESS): _PA,  # a paused run heartbeats without stepping on purpose
    (_GO, RunInput.NO_PROGRESS): _GO,
    **{(p, RunInput.NO_HEARTBEAT): _GO for p in _LIVE},
    **{(p, RunInput.ALL_FINAL): _EN for p in _LIVE},
    **{(p, RunInput.DIED): _FA for p in _LIVE},
    **{(p, RunInput.NEW_ATTEMPT): _RU for p in RunPhase},
    **{(p, RunInput.BOT_RESTART): p for p in (_RU, _PA, _ST)},
    (_GO, RunInput.BOT_RESTART): _RU,  # judged again from the bot's start: the grace period
    # an attempt that ended (normally or not) stays as it ended: a late message, a tick, a bot restart or a second
    # end (a rank's final heartbeat retried) moves nothing; only a new attempt leaves it
    **{(p, i): p for p in (_EN, _FA) for i in RunInput if i is not RunInput.NEW_ATTEMPT},
}


def run_step(phase: RunPhase, inp: RunInput) -> RunPhase:
    try:
        return RUN_TABLE[(phase, inp)]
    except KeyError:
        raise LifecycleError(f"a run in phase {phase.value} cannot take {inp.value}") from None


def end_input(ended: int, missing: int, ranks: int, world: int | None, error_firing: bool) -> RunInput | None:
    """What the ends of a run's ranks say of the run (pure): `ended` of its `ranks` said final, `missing` are silent
    while the others went on; `world`: the job's size, when it said it. ALL_FINAL: every rank said final and no ERROR
    fires; DIED: every rank said final or is missing (one at least said final) while an ERROR fires or a rank is
    missing; None: ranks go on (or too few are known)."""
    if ended == 0 or ended + missing < max(ranks, world or 0):
        return None
    return RunInput.DIED if missing or error_firing else RunInput.ALL_FINAL


def ended_phase(end_reason: str | None) -> RunPhase:
    """The phase of an attempt that ended, from its end reason as stored ("failed: ..." or any other)."""
    return RunPhase.FAILED if (end_reason or "").startswith(FAILED) else RunPhase.ENDED


def silence(last_heartbeat: float | None, last_progress: float | None, paused: bool, now: float,
            heartbeat_timeout: float, stall_timeout: float, since: float = 0.0) -> RunInput | None:
    """What the clock says of a run (pure): NO_HEARTBEAT, NO_PROGRESS or nothing. `since`: the bot's own
    start (the `bot restart` event): silence is counted from it at the earliest, so the runs that went
    on while the bot was down page nothing on its start (they have `heartbeat_timeout` to be heard)."""
    if last_heartbeat is None:
        return None  # never sent a heartbeat (a replay, an older notifier): nothing to judge
    if now - max(last_heartbeat, since) > heartbeat_timeout:
        return RunInput.NO_HEARTBEAT
    if not paused and last_progress is not None and now - max(last_progress, since) > stall_timeout:
        return RunInput.NO_PROGRESS
    return None


def new_attempt(phase: RunPhase, known_procs: frozenset[str], proc: str, restarted_rank: bool) -> bool:
    """Whether a message starts a new attempt of its run (pure): a process the run has not seen, once the
    run ended or is gone; or a new process of a rank that already had one (a re-run or a resume within
    the heartbeat timeout). A message that names no process (an older notifier) starts one only after
    the run ended."""
    if not proc:
        return phase in (RunPhase.ENDED, RunPhase.FAILED)
    if proc in known_procs:
        return False
    return phase in (RunPhase.ENDED, RunPhase.FAILED, RunPhase.GONE) or restarted_rank


__all__ = ["ENDED_NORMALLY", "FAILED", "RANK_TABLE", "RUN_TABLE", "LifecycleError", "RankInput", "RankLife",
           "RankPhase", "RunInput", "RunPhase", "all_ended", "classify", "end_input", "ended_phase", "new_attempt",
           "on_message", "run_step", "silence", "step", "tick", "tick_input"]
