"""Group: notifications with the same run, rule, severity and state are one message.

Grouping happens where it cannot lose anything: every notification is written to the durable
outbox at once, keyed by its group; the delivery worker sends all undelivered rows of a key as one
message (or as one update of the message already posted for that key). An ERROR is due at once,
so the first device's message goes out without waiting and the devices that follow within
`group_wait` arrive as an update listing them all; WARNINGs and resolutions are due after
`group_wait`, so a storm of them (64 devices) is one message.
"""

from __future__ import annotations

from msmon.contract.wire import Event, Severity, Status


def group_key(ev: Event) -> str:
    return f"{ev.run_id}|{ev.rule}|{ev.severity.value}|{ev.status.value}"


def firing_key(ev: Event) -> str:
    """The key of the message a resolution or a reminder refers to."""
    return f"{ev.run_id}|{ev.rule}|{ev.severity.value}|{Status.FIRING.value}"


def delay(ev: Event, group_wait: float) -> float:
    """Seconds before a notification is due: none for a firing ERROR, `group_wait` otherwise."""
    if ev.severity is Severity.ERROR and ev.status is Status.FIRING:
        return 0.0
    return group_wait
