"""Group: notifications with the same run, rule, severity and state are one message.

Grouping happens where it cannot lose anything: every notification is written to the durable
outbox at once, keyed by its group (`stage`, at ingest); the delivery worker sends all undelivered
rows of a key as one message, or as one update of the message already posted for that key (`due`,
at delivery). An ERROR is due at once, so the first device's message goes out without waiting and
the devices that follow within `group_wait` arrive as an update listing them all; WARNINGs and
resolutions are due after `group_wait`, so a storm of them (64 devices) is one message.
"""

from __future__ import annotations

import msgspec

from bot.pipeline.flow import Context, Due, Notification, Round
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


def stage(ctx: Context, n: Notification) -> Notification:
    """The ingest stage: `n`'s group and when it is due."""
    return msgspec.structs.replace(n, key=group_key(n.event), due_at=ctx.now + delay(n.event, ctx.settings.group_wait))


def due(rnd: Round, d: Due) -> Due | None:
    """The delivery stage: the rows that go as one message are all pending rows of a due group (not
    only the due ones), less those whose last verdict is still to be written; each carries the
    reference of a message this process already posted for it (so it is not posted again). None when
    no row is left."""
    rows = [r if r.posted_ref is not None or r.id not in rnd.posted
            else msgspec.structs.replace(r, posted_ref=rnd.posted[r.id])
            for r in d.rows if r.id not in rnd.unwritten]
    return msgspec.structs.replace(d, rows=rows) if rows else None
