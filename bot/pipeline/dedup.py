"""Dedup: a repeat of the same alert at the same severity inside `repeat_interval` is suppressed;
a rise in severity always passes; a resolution passes once after something was sent."""

from __future__ import annotations

import dataclasses

from msmon.contract.wire import Event, Severity, Status


@dataclasses.dataclass
class NotifyState:
    """What was last sent for one fingerprint (the notification log, nflog)."""

    severity: Severity | None = None
    sent_at: float | None = None
    resolved: bool = False


def decide(ev: Event, state: NotifyState, now: float, repeat_interval: float) -> bool:
    """Whether `ev` should become a notification, given what was sent for its fingerprint."""
    if ev.status is Status.RESOLVED:
        return state.severity is not None and not state.resolved
    if state.severity is None or state.resolved or state.sent_at is None:
        return True
    if ev.severity.rank > state.severity.rank:
        return True
    return now - state.sent_at >= repeat_interval


def record(ev: Event, state: NotifyState, now: float) -> NotifyState:
    """The state after `ev` was sent."""
    if ev.status is Status.RESOLVED:
        return NotifyState(state.severity, state.sent_at, resolved=True)
    return NotifyState(ev.severity, now, resolved=False)
