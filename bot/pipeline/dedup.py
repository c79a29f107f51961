"""Dedup: a repeat of the same alert at the same severity inside `repeat_interval` is suppressed;
a rise in severity always passes; a resolution passes once after something was sent."""

from __future__ import annotations

import msgspec

from msmon.contract.wire import Event, Status

from .flow import Context, Notification, NotifyState


def decide(ev: Event, state: NotifyState, now: float, repeat_interval: float) -> bool:
    """Whether `ev` should become a notification, given what was sent for its fingerprint."""
    if ev.status is Status.RESOLVED:
        return state.severity is not None and not state.resolved
    if state.severity is None or state.resolved or state.sent_at is None:
        return True
    if ev.severity is not state.severity and ev.severity.rank > state.severity.rank:  # a rise
        return True
    return now - state.sent_at >= repeat_interval


def kind(ev: Event, state: NotifyState) -> str:
    """What a notification that passed is: a resolution, a reminder of what was sent (same severity,
    still firing) or a new alert."""
    if ev.status is Status.RESOLVED:
        return "resolve"
    return "repeat" if state.severity is ev.severity and not state.resolved else "alert"


def record(ev: Event, state: NotifyState, now: float) -> NotifyState:
    """The state after `ev` was sent."""
    if ev.status is Status.RESOLVED:
        return NotifyState(state.severity, state.sent_at, True, state.step)
    step = state.step if kind(ev, state) == "repeat" else ev.step  # a reminder is of the alert posted before
    return NotifyState(ev.severity, now, False, step)


def stage(ctx: Context, n: Notification) -> Notification | None:
    if not decide(n.event, n.sent, ctx.now, ctx.settings.repeat_interval):
        return None
    return msgspec.structs.replace(n, kind=kind(n.event, n.sent))
