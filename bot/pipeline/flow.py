"""What flows through the two pipelines, and the one shape of a stage.

A `Stage` is a name and a function `(ctx, item) -> item | None`: the item to go on with (the same,
or a copy with what the stage decided filled in), or None: dropped here, counted under the stage's
name. `run_stages` passes an item through a tuple of stages in order. The ingest stages take a
`Context` (one envelope's shared facts) and a `Notification` (one event); the delivery stages take a
`Round` (the worker's memory) and a `Due` (one group of outbox rows). Nothing here reads a clock or a
file: the time and the settings arrive in the context. Silences and rate limits appear by what the
stages ask of them (`Matcher`, `Limiter`), so this module imports no stage and every stage imports it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from typing import Generic, Protocol, TypeVar

import msgspec

from bot.config import PipelineConfig, Route
from bot.pipeline.schedule import OutboxRow, Scheduler
from msmon.contract.wire import Event, Severity

C = TypeVar("C")
T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Stage(Generic[C, T]):
    """One step of a pipeline: `run(ctx, item)` is the item to go on with, or None: dropped here
    (the ingest counts it in msmon_suppressed_total{stage=name})."""

    name: str
    run: Callable[[C, T], T | None]


def run_stages(stages: Iterable[Stage[C, T]], ctx: C, item: T) -> tuple[T, Stage[C, T] | None]:
    """`item` through `stages` in order: (what the last stage returned, None), or, when a stage drops
    it, (the item as that stage saw it, the stage)."""
    for stage in stages:
        out = stage.run(ctx, item)
        if out is None:
            return item, stage
        item = out
    return item, None


# -- ingest ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class NotifyState:
    """What was last sent for one fingerprint (the notification log, nflog)."""

    severity: Severity | None = None
    sent_at: float | None = None
    resolved: bool = False
    step: int | None = None  # the step of the alert posted (a reminder keeps it): what `status` names


NEVER = NotifyState()  # nothing was ever sent


class Matcher(Protocol):
    """A silence as the silence stage sees it (bot.pipeline.silence.Silence)."""

    def matches(self, ev: Event, now: float) -> bool: ...


@dataclasses.dataclass
class Context:
    """What the events of one envelope share: the time they arrived, the settings, the run's project,
    labels and silences in force, and whether the run has an ERROR firing. `error_firing` is the one
    field a stage writes: a firing ERROR that reaches inhibit holds back the WARNINGs after it."""

    now: float
    settings: PipelineConfig
    routes: list[Route]
    project: str
    labels: dict[str, str]
    silences: Sequence[Matcher]
    error_firing: bool


class Notification(msgspec.Struct, frozen=True, gc=False):
    """One event on its way to a message, with what is known of its alert (`sent`, `acked`). The
    stages fill in the rest: dedup `kind`, route `receiver`, `channel` and `thread`, group `key` and
    `due_at`. (Not tracked by the garbage collector: it refers to no object that refers back to it;
    one is made per event and copied by three stages.)"""

    event: Event
    fingerprint: str
    sent: NotifyState = NEVER
    acked: bool = False  # someone said they are on it (ack in chat)
    kind: str = "alert"  # alert | repeat (a reminder) | resolve
    receiver: str = ""
    channel: str = ""
    thread: bool = False  # in the thread of the run's first message in the channel
    key: str = ""  # the group: notifications with one key are one message
    due_at: float = 0.0  # when the delivery worker may send it


# -- delivery ----------------------------------------------------------------------------------


class Limiter(Protocol):
    """Token buckets as the rate_limit stage sees them (bot.pipeline.ratelimit.RateLimiter)."""

    def wait(self, channel: str, run_id: str, now: float) -> float: ...


@dataclasses.dataclass(frozen=True)
class Round:
    """What the delivery stages share: the scheduler's lane pacing (Retry-After), the rate limits (but for
    the receivers that keep their platform's own: a group robot's budget and summaries), and the worker's
    memory: messages it posted whose rows are not updated yet (row id -> reference), rows
    whose verdict SQLite refused to record (not tried until it is written)."""

    scheduler: Scheduler
    limiter: Limiter
    posted: Mapping[int, str]
    unwritten: Container[int]
    self_paced: Container[str] = frozenset()  # receivers that keep their platform's rate themselves (robots)


class Due(msgspec.Struct, frozen=True):
    """One group of outbox rows (one message) at its turn `at`; `wait`: seconds before it may go
    (0: now), set by rate_limit."""

    rows: list[OutboxRow]
    at: float
    wait: float = 0.0
