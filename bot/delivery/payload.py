"""The payload of an alert's outbox row: written by ingest, read by the delivery worker.

    {"project": ..., "labels": {...}, "rank": r, "ranks": n, "received_at": t, "thread": true|false,
     "event": <the event's JSON>}

`rank`: the sender's rank in its job (null: not known); `ranks`: how many ranks the bot knew in the run
when the event came (bot/ranks), for a storm's "on 64/64 ranks".

The bot decodes a job's envelope once (bot/app.py); an event that passes the stages is encoded once into
its outbox row here (the store is a boundary: another replica may deliver it), and the delivery worker
decodes it once. Most events of a storm are suppressed before this, so few are encoded.
"""

from __future__ import annotations

import msgspec

from msmon.contract.wire import Event, encode


class Payload(msgspec.Struct):
    """An alert's outbox payload, decoded."""

    event: Event
    project: str = "default"
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    rank: int | None = None
    ranks: int = 0
    received_at: float | None = None
    thread: bool = False


class Payloads:
    """The payloads of one envelope's events: its project and labels encoded once for all of them."""

    __slots__ = ("head",)

    def __init__(self, project: str, labels: dict[str, str], rank: int | None = None, ranks: int = 0) -> None:
        self.head = b'{"project":%s,"labels":%s' % (encode(project), encode(labels))
        if rank is not None or ranks:
            self.head += b',"rank":%s,"ranks":%d' % (encode(rank), ranks)

    def payload(self, event_json: bytes, received_at: float, thread: bool) -> str:
        """The outbox payload around an event's JSON (what `Payload` decodes)."""
        return (self.head + b',"received_at":%r,"thread":%s,"event":%s}' % (
            received_at, b"true" if thread else b"false", event_json)).decode()
