"""The store's rows as the rest of the bot reads them: a run and a command are typed (their keys and value
types checked by mypy wherever they are used), and their states are Enums whose values are what the store
keeps. An alert as it is read is an `AlertView`; what ingest writes is sqlite.py's `AlertRow`; the outbox's
delivery view is bot/pipeline/schedule.py's OutboxRow."""

from __future__ import annotations

import enum
from typing import Any, TypedDict


class _Word(str, enum.Enum):
    """A state word: equal to, hashed like and formatted as its value (what the store and the API carry)."""

    def __str__(self) -> str:
        return str.__str__(self)

    def __format__(self, spec: str) -> str:
        return str.__format__(str.__str__(self), spec)


class RunState(_Word):
    """What a run is doing now, as status, the console and /v1/runs say it (bot/runs/lifecycle.py decides)."""

    RUNNING = "running"
    PAUSED = "paused"
    GONE = "gone"  # no heartbeat for a while: dead, or cut off from the bot
    ENDED = "ended"  # its attempt ended (normally, or a new attempt started)
    FAILED = "failed"  # its attempt ended while an ERROR fired or a rank was missing (bot/ingest/runs.py)


class CommandStatus(_Word):
    """Where a command is: waiting for the job's ranks, carried out (by all, some or none), or never queued."""

    PENDING = "pending"  # queued: the ranks apply it at its apply step
    DONE = "done"  # every rank applied it (or the bot answered it itself: status, ack, silence, help)
    FAILED = "failed"  # every rank answered, one at least with a failure
    PARTIAL = "partial"  # it expired with some ranks' answers in
    EXPIRED = "expired"  # no rank answered within commands.expire_after
    INVALID = "invalid"  # not a command msmon knows (the parser said why)
    REJECTED = "rejected"  # no such run, or nothing to act on
    DENIED = "denied"  # its sender is not in commands.allow for the run's project


FINAL: frozenset[CommandStatus] = frozenset(
    {CommandStatus.DONE, CommandStatus.FAILED, CommandStatus.EXPIRED, CommandStatus.PARTIAL})


class RunRow(TypedDict):
    """A run, with its current attempt."""

    run_id: str
    project: str
    labels: dict[str, str]
    devices: list[str]
    first_seen: float
    last_seen: float | None
    last_step: int | None
    last_heartbeat: float | None
    last_progress: float | None
    paused: bool
    gone: bool
    attempt: int
    attempt_started: float
    ended_at: float | None
    end_reason: str | None
    ended: bool
    state: RunState


class CommandRow(TypedDict):
    """A command: what was asked, by whom, of which run, and what each rank answered."""

    seq: int
    id: str
    created_at: float
    user: str
    source: str
    project: str | None
    run_id: str | None
    text: str
    verb: str
    action: str | None
    params: dict[str, Any]
    apply_step: int | None
    status: CommandStatus
    detail: str
    results: dict[str, Any]  # device -> {"ok", "step", "detail", "path"}
    origin: dict[str, Any]  # the stored Origin (bot/commands/origin.py)
    expires_at: float | None
    updated_at: float


class AlertView(TypedDict):
    """An alert (a rule on a device of a run, its episode) as `Store.alerts` reads it, its event left out."""

    fingerprint: str
    run_id: str
    rule: str
    device: str
    severity: str  # "WARNING" or "ERROR" (msmon.contract.wire.Severity's values)
    status: str  # "firing" or "resolved"
    first_step: int
    last_step: int
    updated_at: float
    sent_severity: str | None  # what was last sent for it (the notification log)
    sent_at: float | None
    sent_resolved: int | None
    acked_by: str | None
    sent_step: int | None
