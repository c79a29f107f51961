"""What the job's send queue holds and hands out: an item's drop class and tier, an entry with the bytes
it was queued with, a batch, what an answer changed (`Outcome`), and the queue's bounds (`Limits`).

Pure data: the state machine that moves them is `notifier.sendq.SendQueue` (its docstring has the table
of classes and tiers).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from msmon.contract.wire import ActionResult, Event, Sample, Severity, Status

from .faults import Fault

Item = Event | Sample | ActionResult


class Tier(enum.IntEnum):
    LOW = 0
    MID = 1
    HIGH = 2


def classify(item: Item) -> tuple[str, Tier]:
    """The drop class and tier of an item (see the table in notifier/sendq/queue.py's docstring)."""
    if isinstance(item, Sample):
        return "samples", Tier.LOW
    if isinstance(item, ActionResult):
        return "actions", Tier.HIGH
    tier = Tier.HIGH if item.severity is Severity.ERROR else Tier.MID
    if item.status is Status.RESOLVED:
        return "resolutions", tier
    return ("errors" if tier is Tier.HIGH else "warnings"), tier


@dataclass(eq=False, slots=True)
class Entry:
    seq: int
    item: Item
    cls: str
    tier: Tier
    size: int
    since: float  # when it was queued (the edge's clock)
    in_flight: bool = False
    data: bytes = b""  # its wire JSON where the edge has it (encoded once: for its size, the envelope, the spool)

    @property
    def key(self) -> tuple[str, str, str] | None:
        """The alert an event belongs to (None for samples and action results)."""
        return self.item.fingerprint if isinstance(self.item, Event) else None


@dataclass(eq=False)
class Batch:
    """One request's worth of entries: action results, then events, then samples, each in queue order."""

    id: int
    entries: list[Entry]
    dropped: dict[str, int]  # the drop counts this envelope reports
    probe: bool = False

    @property
    def items(self) -> list[Item]:
        return [e.item for e in self.entries]


@dataclass
class Outcome:
    """What an answer changed, for the edge to log and act on."""

    delivered: int = 0
    dead: list[Entry] = field(default_factory=list)  # refused by the bot on their own: dead letters
    fault: Fault | None = None
    first_of_kind: bool = False  # log this fault: the first time this kind happened
    recovered: bool = False  # the first accepted request after a failure
    reported: dict[str, int] = field(default_factory=dict)  # drop counts the bot now knows
    delay: float = 0.0  # seconds until the next attempt


@dataclass(frozen=True)
class Limits:
    max_queue: int = 10_000  # mid + low items held
    max_bytes: int = 64 << 20  # encoded bytes held, every tier (what the spool may take: spool_max_mb)
    max_high: int = 10_000  # ERROR firings and action results held; reported when reached
    batch_max: int = 500
    batch_max_bytes: int = 1 << 20  # the bot takes 4 MiB by default
    flush_interval: float = 1.0  # low and mid items wait at most this long for company
    backoff: tuple[float, float] = (0.5, 30.0)
    probe_interval: float = 1.0  # while the bot is down, high items are tried this often
    probe_max: int = 4  # entries in a probe batch: one small request
    persist_interval: float = 1.0  # the spool is rewritten at most this often


FRAMING = 12  # a spool line's bytes around an item's own (notifier/transport/spool.py SpoolRecord.line, its newline)


__all__ = ["FRAMING", "Batch", "Entry", "Item", "Limits", "Outcome", "Tier", "classify"]
