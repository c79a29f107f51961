"""The payload of an alert's outbox row: written by ingest, read by the delivery worker.

    {"project": ..., "labels": {...}, "rank": r, "ranks": n, "received_at": t, "thread": true|false,
     "event": <the event's JSON>}

`rank`: the sender's rank in its job (null: not known); `ranks`: how many ranks the bot knew in the run
when the event came (bot/ranks), for a storm's "on 64/64 ranks".

The event's JSON is the job's own, cut out of the request body as received and never re-encoded
(most events of a storm are suppressed, and the ones that are not would pay for encoding a window
of metrics twice): `Payloads` decodes the body's event list on first need, to raw JSON only.
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


class _RawEvents(msgspec.Struct):
    """The events of an envelope as the job encoded them."""

    events: list[msgspec.Raw] = msgspec.field(default_factory=list)


class Payloads:
    """The payloads of one envelope's events: its project and labels encoded once; each event's JSON
    from `body` (the envelope as received) when there is one, else encoded."""

    __slots__ = ("head", "body", "_raws")

    def __init__(self, project: str, labels: dict[str, str], body: bytes | None = None, rank: int | None = None,
                 ranks: int = 0) -> None:
        self.head = b'{"project":%s,"labels":%s' % (encode(project), encode(labels))
        if rank is not None or ranks:
            self.head += b',"rank":%s,"ranks":%d' % (encode(rank), ranks)
        self.body = body
        self._raws: list[msgspec.Raw] | None = None

    def event_json(self, i: int, ev: Event) -> bytes:
        """Event `i` of the envelope (`ev`, decoded) as JSON."""
        if self.body is None:
            return encode(ev)
        if self._raws is None:
            self._raws = msgspec.json.decode(self.body, type=_RawEvents).events
        return bytes(self._raws[i])

    def payload(self, event_json: bytes, received_at: float, thread: bool) -> str:
        """The outbox payload around an event's JSON (what `Payload` decodes)."""
        return (self.head + b',"received_at":%r,"thread":%s,"event":%s}' % (
            received_at, b"true" if thread else b"false", event_json)).decode()
