"""The delivery worker: takes due outbox rows, sends each group as one message through its
receiver within the rate limits, and marks the rows delivered only after the receiver said OK.

Rows stay in SQLite until then, so a crash, a restart or a Slack outage loses nothing; a retry
after a failure re-sends. A message is re-sent only if the process dies between the receiver's
OK and the commit right after it (a window of one SQLite write).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import msgspec

from notifier.wire import Event, Severity, Status, decode

from .metrics import BotMetrics
from .pipeline.group import firing_key
from .pipeline.ratelimit import RateLimiter
from .receivers import DeliveryError, Message, Note, Receiver
from .store import Store

log = logging.getLogger("msmon.bot")

BACKOFF = (1.0, 300.0)


class Payload(msgspec.Struct):
    """An outbox row's payload, as `bot.dispatch` writes it."""

    event: Event
    project: str = "default"
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    received_at: float | None = None
    thread: bool = False


def _payload(row: dict[str, Any]) -> Payload:
    return decode(row["payload"], Payload)


def _events(rows: list[dict[str, Any]]) -> list[Event]:
    """Latest event per device, in order of arrival."""
    by_device: dict[str, Event] = {}
    for r in rows:
        ev = _payload(r).event
        by_device[ev.device] = ev
    return list(by_device.values())


def _message(key: str, rows: list[dict[str, Any]], repeat: bool = False) -> Message:
    events = _events(rows)
    lead = events[0]
    return Message(key=key, run_id=lead.run_id, project=_payload(rows[0]).project, rule=lead.rule,
                   severity=lead.severity, status=lead.status, events=events, repeat=repeat)


class Outbox:
    def __init__(self, store: Store, receivers: dict[str, Receiver], limiter: RateLimiter, metrics: BotMetrics,
                 clock: Callable[[], float] = time.time) -> None:
        self.store, self.receivers, self.limiter, self.metrics, self.clock = store, receivers, limiter, metrics, clock
        self.doorbell = asyncio.Event()

    def wake(self) -> None:
        self.doorbell.set()

    async def run(self, stop: asyncio.Event) -> None:
        waiting = self.store.depth()
        if waiting:
            self.store.due_now(self.clock())
            log.info("msmon bot: %d undelivered messages in the outbox from before; delivering them now", waiting)
        while not stop.is_set():
            try:
                await self.deliver_due()
            except Exception:  # noqa: BLE001 - the worker must outlive any one bad row
                log.exception("msmon bot: delivery round failed; retrying")
            nxt = self.store.next_due_at()
            wait = 1.0 if nxt is None else min(max(nxt - self.clock(), 0.01), 1.0)
            self.doorbell.clear()
            stop_task = asyncio.ensure_future(stop.wait())
            bell_task = asyncio.ensure_future(self.doorbell.wait())
            await asyncio.wait({stop_task, bell_task}, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
            for t in (stop_task, bell_task):
                t.cancel()

    async def deliver_due(self) -> int:
        """One pass over the due rows; returns how many messages went out."""
        now = self.clock()
        sent = 0
        done: set[tuple[str, str, str, str]] = set()
        for row in self.store.due(now):
            gk = (row["receiver"], row["channel"], row["key"], row["kind"])
            if gk in done:
                continue
            done.add(gk)
            rows = self.store.pending(*gk)
            if not rows:
                continue
            wait = self.limiter.wait(row["channel"], row["run_id"], now)
            if wait > 0.0:
                self.store.retry_later([r["id"] for r in rows], now + wait, "rate limited", count_attempt=False)
                continue
            if await self._send(rows):
                sent += 1
        self.metrics.outbox_depth.set(self.store.depth())
        return sent

    async def _send(self, rows: list[dict[str, Any]]) -> bool:
        head = rows[0]
        receiver = self.receivers.get(head["receiver"]) or self.receivers["console"]
        channel, key, kind = head["channel"], head["key"], head["kind"]
        ids = [r["id"] for r in rows]
        try:
            if kind == "alert":
                await self._alert(receiver, channel, key, rows)
            elif kind == "note":
                for r in rows:
                    await receiver.note(channel, decode(r["payload"], Note))
            elif kind == "repeat":
                msg = _message(key, rows, repeat=True)
                ref = self.store.message(key)
                if ref is not None:
                    await receiver.reply(channel, ref["ts"], msg)
                else:
                    ts = await receiver.post(channel, msg)
                    self.store.save_message(key, receiver.name, channel, ts, self.clock())
            else:
                await self._resolve(receiver, channel, key, rows)
        except DeliveryError as exc:
            attempts = max(r["attempts"] for r in rows) + 1
            delay = exc.retry_after if exc.retry_after else min(BACKOFF[0] * 2 ** (attempts - 1), BACKOFF[1])
            self.store.retry_later(ids, self.clock() + delay, str(exc))
            self.metrics.delivery_errors.labels(receiver.name).inc()
            log.warning("msmon bot: delivery to %s %s failed (attempt %d, retry in %.0f s): %s", receiver.name,
                        channel, attempts, delay, exc)
            return False
        now = self.clock()
        self.store.delivered(ids, now)
        self.metrics.sent.labels(receiver.name, kind).inc()
        if kind == "alert":
            for r in rows:
                p = _payload(r)
                if p.event.severity is Severity.ERROR and p.received_at is not None:
                    self.metrics.error_latency.observe(max(now - p.received_at, 0.0))
        return True

    async def _alert(self, receiver: Receiver, channel: str, key: str, rows: list[dict[str, Any]]) -> None:
        ref = self.store.message(key)
        if ref is None:
            msg = _message(key, rows)
            root_key = f"{msg.run_id}|root|{receiver.name}|{channel}"
            root = self.store.message(root_key)
            if _payload(rows[0]).thread and root is not None:
                # A WARNING goes in the thread of the run's first message in this channel.
                await receiver.reply(channel, root["ts"], msg)
                self.store.save_message(key, receiver.name, channel, root["ts"], self.clock())
                return
            ts = await receiver.post(channel, msg)
            now = self.clock()
            self.store.save_message(key, receiver.name, channel, ts, now)
            if root is None:
                self.store.save_message(root_key, receiver.name, channel, ts, now)
            return
        # More devices joined the group: rewrite the message with all of them.
        earlier = self.store.delivered_since(receiver.name, channel, key, "alert", ref["created_at"])
        await receiver.update(channel, ref["ts"], _message(key, earlier + rows))

    async def _resolve(self, receiver: Receiver, channel: str, key: str, rows: list[dict[str, Any]]) -> None:
        msg = _message(key, rows)
        fkey = firing_key(msg.lead)
        ref = self.store.message(fkey)
        if ref is None:
            return  # nothing was posted for this episode: nothing to resolve
        fired = self.store.delivered_since(receiver.name, channel, fkey, "alert", ref["created_at"])
        firing_devices = {e.device for e in _events(fired)} if fired else set(msg.devices)
        resolved_before = self.store.delivered_since(receiver.name, channel, key, "resolve", ref["created_at"])
        resolved = {e.device for e in _events(resolved_before + rows)}
        await receiver.reply(channel, ref["ts"], msg)
        if firing_devices <= resolved:
            view = _message(fkey, fired or rows)
            view.status = Status.RESOLVED
            await receiver.update(channel, ref["ts"], view)
            self.store.retire_message(fkey, self.clock())

