"""Dedup: a repeat of the same alert at the same severity inside `repeat_interval` is suppressed;
a rise in severity always passes; a resolution passes once after something was sent. What was
given up (a dead letter) does not count as sent (`given_up`)."""

from __future__ import annotations

import msgspec

from bot.pipeline.flow import Context, Notification, NotifyState
from msmon.contract.wire import Event, Severity, Status


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


def given_up(state: NotifyState, kind: str, queued_at: float | None, severity: Severity) -> NotifyState | None:
    """The state after the notification of `kind` queued at `queued_at` was given up (a dead letter), or
    None to leave it: as Alertmanager's notification log, only what was delivered counts as sent. Ingest
    records a notification when it queues it (so that the job's next events do not queue it again while
    it waits); when it is given up and nothing was queued for the alert since (`sent_at` and the severity
    are still its own), that record is taken back: a reminder is due again (the same severity, never sent at),
    a new alert or a rise is as if nothing was sent, so the alert's next event goes out at once."""
    if state.sent_at is None or state.sent_at != queued_at or state.severity is not severity or kind == "resolve":
        return None
    if kind == "repeat":
        return NotifyState(state.severity, None, False, state.step)
    return NotifyState()


def stage(ctx: Context, n: Notification) -> Notification | None:
    if not decide(n.event, n.sent, ctx.now, ctx.settings.repeat_interval):
        return None
    return msgspec.structs.replace(n, kind=kind(n.event, n.sent))
