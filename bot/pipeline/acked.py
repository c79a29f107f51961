"""Acked: someone said in chat they are on an alert, so its reminders stop. A rise in severity
still goes out, and so does the resolution (the next episode is not acknowledged)."""

from __future__ import annotations

from bot.pipeline.flow import Context, Notification
from msmon.contract.wire import Status


def stage(ctx: Context, n: Notification) -> Notification | None:
    ev = n.event
    if n.acked and ev.status is not Status.RESOLVED and n.sent.severity is ev.severity:
        return None
    return n
