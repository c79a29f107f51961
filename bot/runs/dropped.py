"""What a job dropped before the bot could take it, shown where operators look (issue 36).

A job's send queue (notifier/sendq/) drops what its spool cannot hold while the bot is unreachable or slow:
metric samples first, then WARNINGs, then ERRORs' chart windows, and ERRORs themselves only at their cap. It
counts each by class and reports the counts in the next envelope the bot takes (`Envelope.dropped`: what was
dropped since the last report). Here the bot sums them per run and device and says so:

- in chat, through the durable outbox like any note, on the run's route for ERRORs (in its thread when it has
  one): one note when the counts of what chat would have shown grow (`CHAT`: ERRORs, action results, ERRORs'
  charts), at most one per run every `NOTE_EVERY` seconds (growth in between is in the next note, which the run's
  next envelope after the pause queues); samples and WARNINGs dropped in an outage are said in the next note and
  in status, never in a note of their own (a job sends tens of thousands of samples through any outage);
- in `status` (bot/commands/service.py) and the console's run detail: `dropped_line`.

The counts live in memory (a restart starts them at zero; the notes already queued stay in the outbox).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

NOTE_EVERY = 60.0  # seconds between two chat notes of one run's drops
MAX_RUNS = 10_000  # runs whose drops are remembered (the oldest reported first forgotten)
MAX_DEVICES = 1_024  # devices per run kept apart (the rest summed under "other devices")
MAX_CLASSES = 16  # classes per device (a job names at most a handful; more are summed under "other")

CHAT = frozenset({"errors", "actions", "windows"})  # drops that chat would have shown: their growth makes a note due

# The job's drop classes (notifier/sendq/), as a sentence names them, in the order they matter.
NAMES = {"errors": "ERROR events", "actions": "action results", "resolutions": "resolutions",
         "windows": "ERROR chart windows", "warnings": "WARNING events", "samples": "metric samples"}
WHY = {"errors": "refused at the job's ERROR cap (BotTransport max_errors) or the spool's bound (spool_max_mb)",
       "actions": "refused at the same cap", "windows": "shed to keep the ERRORs within the spool's bound",
       "warnings": "dropped from the full spool", "samples": "dropped from the full spool",
       "resolutions": "dropped from the full spool"}


@dataclass
class _Run:
    by_device: dict[str, dict[str, int]] = field(default_factory=dict)
    told: dict[str, int] = field(default_factory=dict)  # the run's totals the last chat note said
    noted_at: float | None = None

    def totals(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for counts in self.by_device.values():
            for cls, n in counts.items():
                out[cls] = out.get(cls, 0) + n
        return out


def _clean(dropped: dict[str, int]) -> dict[str, int]:
    return {cls: int(n) for cls, n in dropped.items() if isinstance(n, int) and n > 0}


class JobDrops:
    """Every run's reported drops, and whether a chat note about them is due."""

    def __init__(self, note_every: float = NOTE_EVERY) -> None:
        self.note_every = note_every
        self._runs: OrderedDict[str, _Run] = OrderedDict()

    def due(self, run_id: str, dropped: dict[str, int], now: float) -> bool:
        """Whether the envelope now taken for `run_id` (reporting `dropped`) should queue a chat note: the run's
        totals of a `CHAT` class with these counts are above what the last note said, and its last note is
        `note_every` old."""
        run = self._runs.get(run_id)
        new = _clean(dropped)
        if run is None:
            return any(cls in CHAT for cls in new)
        if run.noted_at is not None and now - run.noted_at < self.note_every:
            return False
        totals = run.totals()
        return any(totals.get(cls, 0) + new.get(cls, 0) > run.told.get(cls, 0) for cls in CHAT)

    def add(self, run_id: str, device: str, dropped: dict[str, int], now: float, noted: bool) -> None:
        """Count what an envelope reported, once it is committed (a 503'd envelope comes again with the same
        counts); `noted`: its transaction queued the note (`note_text`)."""
        new = _clean(dropped)
        run = self._runs.get(run_id)
        if run is None:
            if not new:
                return
            run = self._runs[run_id] = _Run()
            while len(self._runs) > MAX_RUNS:
                self._runs.popitem(last=False)
        self._runs.move_to_end(run_id)
        if device not in run.by_device and len(run.by_device) >= MAX_DEVICES:
            device = "other devices"
        counts = run.by_device.setdefault(device, {})
        for cls, n in new.items():
            if cls not in counts and len(counts) >= MAX_CLASSES:
                cls = "other"
            counts[cls] = counts.get(cls, 0) + n
        if noted:
            run.told, run.noted_at = run.totals(), now

    def totals(self, run_id: str) -> dict[str, int]:
        run = self._runs.get(run_id)
        return run.totals() if run is not None else {}

    def note_text(self, run_id: str, device: str, rank: int | None, dropped: dict[str, int]) -> str:
        """The chat note for the run's totals with the envelope's `dropped` added (it is queued in the
        envelope's own transaction, before `add`)."""
        run = self._runs.get(run_id)
        totals = run.totals() if run is not None else {}
        told = run.told if run is not None else {}
        for cls, n in _clean(dropped).items():
            totals[cls] = totals.get(cls, 0) + n
        who = f"rank {rank} (device {device})" if rank is not None else f"device {device}"
        grown = [cls for cls in totals if totals[cls] > told.get(cls, 0)]
        lost_errors = totals.get("errors", 0)
        head = (f"run `{run_id}`: the job DROPPED {lost_errors:,} ERROR event(s) before the bot could take them"
                if lost_errors else f"run `{run_id}`: the job dropped data before the bot could take it")
        parts = [f"{totals[cls]:,} {NAMES.get(cls, cls)} ({WHY.get(cls, 'dropped by the job')})"
                 for cls in _ordered(totals)]
        since = f"; new since the last note: {', '.join(NAMES.get(c, c) for c in _ordered(grown))}" if told else ""
        return (f"{head}. So far, reported last by {who}: {'; '.join(parts)}{since}. The job's spool was full: the "
                "bot was unreachable or too slow for it. Look at the job's log for the outage; raise bot.spool_max_mb "
                "if it recurs, and check the run's curves in the console for what its ERRORs would have said.")

    def line(self, run_id: str) -> str | None:
        """`status`'s line for the run's drops, or None when it reported none."""
        return describe(self.totals(run_id))


def describe(totals: dict[str, int]) -> str | None:
    """One line for a run's drop totals (status, the console's run page), or None for none."""
    if not totals:
        return None
    what = ", ".join(f"{totals[cls]:,} {NAMES.get(cls, cls)}" for cls in _ordered(totals))
    warn = "DROPPED BY THE JOB" if totals.get("errors") else "dropped by the job"
    return f"{warn} before the bot took them: {what} (its spool was full: the bot unreachable or slow)"


def _ordered(classes: Iterable[str]) -> list[str]:
    order = list(NAMES)
    return sorted(classes, key=lambda c: (order.index(c) if c in order else len(order), c))
