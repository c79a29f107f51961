"""The job's send queue as a pure state machine: what waits, what goes in the next batch, what is in
flight, what an answer does, when to try again, what a full queue drops, and what the spool holds.

No threads, sockets, files or clock in here: the edge (`notifier.transport.sender`) calls it under one lock
with `now` from its clock and does the I/O it asks for. Every rule below is a unit test away. What it
holds and hands out (entries, batches, outcomes, limits) is `notifier.sendq.entries`; the faults it judges
answers by, `notifier.sendq.faults`.

Items and their classes (the names the envelope's `dropped` counts use):

| item                          | class         | tier | bounded by                              |
|-------------------------------|---------------|------|-----------------------------------------|
| ERROR event, firing           | `errors`      | high | `max_high` and `max_bytes` (refused then) |
| action result                 | `actions`     | high | `max_high` and `max_bytes`              |
| ERROR event, resolved         | `resolutions` | high | never dropped (a newer one replaces it) |
| an ERROR's chart window       | `windows`     |  -   | shed under `max_bytes` before the ERROR itself is refused |
| WARNING event, firing         | `warnings`    | mid  | `max_queue` items / `max_bytes`          |
| WARNING event, resolved       | `resolutions` | mid  | same, dropped only after every firing   |
| metric sample                 | `samples`     | low  | same, dropped first                     |

Guarantees (tests/notifier/transport/test_sendq.py checks them for any sequence of inputs):

* an item leaves the queue only when the bot accepted it (`accepted`), or as a counted drop, or as a
  dead letter the bot refused on its own (never for a fault of the network or of the answer);
* an item is in at most one batch at a time, so one process never delivers it twice;
* events go out in the order they were queued (one run's episodes keep firing -> resolved order),
  across failures, partial acceptance and a restart from the spool;
* a high item the queue took is never dropped; a resolution is never dropped while a firing event
  of the same alert is still queued (an ERROR's resolution replaced by a newer one of its alert, none of
  its firings queued between, is not dropped: the bot hears the alert resolved all the same);
* the spool's bound (`max_bytes`) holds every tier: when ERRORs fill it, their chart windows (`Event.window`,
  the bot's chart of the minutes before) are shed first, the oldest resolutions' first, and only then is a
  new ERROR refused; windows shed and ERRORs refused are counted (`windows`, `errors`) and reported; lower entries in
  flight never count against an ERROR (the queue may pass the bound by them until their request settles, when they
  are evicted first; the spool file never does: `spool_entries` leaves out those that do not fit);
* every drop is counted by class and reported in the next accepted envelope.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Iterable

import msgspec

from msmon.contract.wire import Event, Sample, encode

from .entries import FRAMING, Batch, Entry, Item, Limits, Outcome, Tier, classify
from .faults import Fault, judge

_STREAMS = ("actions", "events", "samples")  # a batch lists them in this order


def _stream(item: Item) -> str:
    if isinstance(item, Event):
        return "events"
    return "samples" if isinstance(item, Sample) else "actions"


class SendQueue:
    """The pure state machine. Not thread-safe: the edge calls it under one lock.

    Entries wait in three streams (action results, events, samples), each oldest first. A batch takes
    from the front of each; a failed or partly accepted batch puts what is left back at the front, so
    the order in which things were queued is the order in which they reach the bot.
    """

    def __init__(self, limits: Limits | None = None, rng: random.Random | None = None) -> None:
        self.limits = limits or Limits()
        self._rng = rng or random.Random()
        self._free: dict[str, OrderedDict[int, Entry]] = {s: OrderedDict() for s in _STREAMS}
        # eviction pools, oldest first, of free (not in flight) mid entries
        self._pool: dict[str, OrderedDict[int, Entry]] = {"warnings": OrderedDict(), "resolutions": OrderedDict()}
        self._seq = 0
        self._batch_id = 0
        self._in_flight: Batch | None = None
        self._firing: dict[tuple[str, str, str], int] = {}  # queued firing events per alert
        self._held = {Tier.LOW: 0, Tier.MID: 0, Tier.HIGH: 0}
        self._held_bytes = 0  # mid + low
        self._high_bytes = 0  # high: within max_bytes too, mid and low making room for it
        self._unreported: dict[str, int] = {}
        self.dropped: dict[str, int] = {}  # every drop since start, by class
        self.refused: dict[str, int] = {}  # high items refused at the max_high cap, by class
        self.dead: dict[str, int] = {}  # dead letters, by class
        self.delivered = 0
        self.connected: bool | None = None  # None: nothing tried yet
        self._failures = 0
        self._not_before = 0.0  # no attempt before this
        self._backoff_until = 0.0  # the end of the backoff proper (probes for high items may come sooner)
        self._limit: int | None = None  # a shrunken batch size while isolating a refused item
        self._faults_seen: set[Fault] = set()
        self._hurry = False
        self._dirty = False
        self._spooled = False  # the spool holds records (of this or an earlier process)
        self._next_persist = 0.0
        self.cap_reached = False  # max_high was hit (the edge reports it)

    # -- the job's side -----------------------------------------------------------------------

    def enqueue(self, item: Item, now: float, size: int, data: bytes = b"") -> bool:
        """Queue an item (size: its encoded bytes; data: those bytes, kept with it for the edge to send and spool
        without encoding it again). False when it was refused or dropped at once."""
        cls, tier = classify(item)
        entry = Entry(self._seq + 1, item, cls, tier, size, now, data=data)
        if tier is Tier.HIGH and self._kept_bytes() + size > self.limits.max_bytes:
            self._make_room(entry)  # chart windows shed, older resolutions of its alert replaced
        if tier is Tier.HIGH and cls != "resolutions" and (self._held[Tier.HIGH] >= self.limits.max_high or
                                                           self._kept_bytes() + entry.size > self.limits.max_bytes):
            self.refused[cls] = self.refused.get(cls, 0) + 1
            self._count_drop(cls, 1)
            self.cap_reached = True
            return False
        self._seq += 1
        self._account(entry, +1)
        self._put(entry)
        self._dirty = True
        if tier is Tier.HIGH:
            # an ERROR rings the sender: now when connected, at the next probe while the bot is down
            soon = now if self.connected is not False else now + self.limits.probe_interval
            self._not_before = min(self._not_before, soon)
            self._evict()  # samples and warnings make room for it within max_bytes
            return True
        self._evict()
        return entry.seq in self._free[_stream(item)]

    def restore(self, items: Iterable[tuple[Item, bytes]], now: float) -> None:
        """Rebuild the queue from what a previous process spooled ((item, its encoded bytes), oldest first): it
        goes out before anything queued since."""
        restored: list[Entry] = []
        for item, data in items:
            self._seq += 1
            restored.append(Entry(self._seq, item, *classify(item), len(data) + FRAMING, now, data=data))
        for entry in reversed(restored):
            self._account(entry, +1)
            self._put(entry, front=True)
        if restored:
            self._spooled = True
            self._evict()

    def lost(self, item: Item) -> None:
        """The edge could not queue an item at all (it cannot be encoded): counted as a drop."""
        self._count_drop(classify(item)[0], 1)

    def hurry(self, now: float) -> None:
        """Everything is due now (flush, close): no waiting for the flush interval or the backoff."""
        self._hurry = True
        self._not_before = min(self._not_before, now)

    # -- the sender's side --------------------------------------------------------------------

    def pending(self) -> int:
        """Entries not yet accepted (in flight included)."""
        return sum(self._held.values())

    def has_high(self) -> bool:
        return self._held[Tier.HIGH] > 0

    def next_due(self, now: float) -> float | None:
        """When the next batch is due (<= now: at once); None when nothing is to be sent."""
        if self._in_flight is not None:
            return None
        if not self.pending() and not self._unreported:
            self._hurry = False
            return None
        if self.connected is False or self._hurry or self.has_high() or self._unreported:
            return self._not_before
        if self._held[Tier.LOW] + self._held[Tier.MID] >= self.limits.batch_max:
            return self._not_before
        oldest = min((next(iter(q.values())).since for q in self._free.values() if q), default=now)
        return max(self._not_before, oldest + self.limits.flush_interval)

    def take(self, now: float) -> Batch | None:
        """The next batch to send, or None if none is due. One batch is in flight at a time. While
        the bot is down and its backoff runs, a due batch is a probe: a few high-priority entries."""
        due = self.next_due(now)
        if due is None or due > now:
            return None
        probe = self.connected is False and not self._hurry and now < self._backoff_until
        room = self.limits.batch_max if self._limit is None else self._limit
        if probe:
            room = min(room, self.limits.probe_max)
        budget = self.limits.batch_max_bytes
        chosen: list[Entry] = []
        for name in _STREAMS if not probe else _STREAMS[:2]:
            q = self._free[name]
            while q and len(chosen) < room:
                entry = next(iter(q.values()))
                if chosen and entry.size > budget:
                    break
                self._unput(entry)
                chosen.append(entry)
                budget -= entry.size
        if not chosen and not self._unreported:
            return None
        for entry in chosen:
            entry.in_flight = True
        self._batch_id += 1
        self._in_flight = Batch(self._batch_id, chosen, dict(self._unreported), probe)
        return self._in_flight

    def accepted(self, batch: Batch, now: float, count: int | None = None) -> Outcome:
        """The bot took the batch (or its first `count` entries: the rest go back, in place)."""
        self._check(batch)
        n = len(batch.entries) if count is None else max(0, min(count, len(batch.entries)))
        for entry in batch.entries[:n]:
            entry.in_flight = False
            self._account(entry, -1)
        self._give_back(batch.entries[n:])
        self.delivered += n
        out = Outcome(delivered=n, recovered=self.connected is False, reported=dict(batch.dropped))
        for cls, k in batch.dropped.items():
            left = self._unreported.get(cls, 0) - k
            if left > 0:
                self._unreported[cls] = left
            else:
                self._unreported.pop(cls, None)
        self.connected = True
        self._failures = 0
        self._not_before = self._backoff_until = now
        if self._limit is not None and n == len(batch.entries) and n:  # (a batch of drop counts only: unchanged)
            self._limit = None if 2 * n >= self.limits.batch_max else 2 * n
        self._dirty = self._dirty or n > 0
        return out

    def failed(self, batch: Batch, now: float, fault: Fault, wait: float | None = None) -> Outcome:
        """The request failed: the entries go back in place; or, when the bot refused the data itself,
        the batch is halved until the one entry it refuses is found, and that one is a dead letter.
        `wait`: the peer's Retry-After in seconds (already bounded by `msmon.common.retry.retry_after`)."""
        self._check(batch)
        out = Outcome(fault=fault, first_of_kind=fault not in self._faults_seen)
        self._faults_seen.add(fault)
        if fault.refuses_data:
            if len(batch.entries) <= 1:
                for entry in batch.entries:
                    entry.in_flight = False
                    self._account(entry, -1)
                    self.dead[entry.cls] = self.dead.get(entry.cls, 0) + 1
                    out.dead.append(entry)
                if not batch.entries:  # only drop counts, and those refused: stop reporting them
                    self._unreported.clear()
                self._limit = 1  # one at a time until an answer is good again (then it doubles)
            else:
                self._give_back(batch.entries)
                self._limit = max(1, len(batch.entries) // 2)
            self._not_before = now  # the bot is up: go on at once
            self._dirty = True
            return out
        self._give_back(batch.entries)
        self.connected = False
        self._failures += 1
        lo, hi = self.limits.backoff
        # exponential, bounded, jittered to [half, whole] (at the bound too: jobs do not stampede the bot)
        delay = min(hi, lo * 2.0 ** min(self._failures - 1, 64)) * (0.5 + 0.5 * self._rng.random())
        if wait is not None:
            delay = min(max(wait, 0.0), hi)
        self._backoff_until = now + delay
        if self._hurry:
            delay = min(delay, lo)
        elif self.has_high():
            delay = min(delay, self.limits.probe_interval)
        self._not_before = now + delay
        out.delay = delay
        return out

    def _check(self, batch: Batch) -> None:
        if batch is not self._in_flight:
            raise ValueError(f"batch {batch.id} is not the one in flight")
        self._in_flight = None

    # -- the spool ----------------------------------------------------------------------------

    def persist_due(self, now: float) -> bool:
        """The spool should be rewritten now: the queue changed while the bot is down, or the spool
        holds records the bot has taken since."""
        if not self._dirty or now < self._next_persist:
            return False
        return self.connected is False or self._spooled

    def snapshot(self) -> list[Item]:
        """Every item not yet accepted, in queue order (the batch in flight included: its fate is open)."""
        return [e.item for e in self.snapshot_entries()]

    def snapshot_entries(self) -> list[Entry]:
        """`snapshot()`'s entries, with the bytes each was queued with."""
        flying = self._in_flight.entries if self._in_flight is not None else []
        out: list[Entry] = []
        for name in _STREAMS:
            out.extend(e for e in flying if _stream(e.item) == name)
            out.extend(self._free[name].values())
        return out

    def spool_entries(self) -> list[Entry]:
        """What the spool file holds: `snapshot_entries()` within `max_bytes`. Samples and WARNINGs in flight may pass
        the bound until their request settles (`_kept_bytes`); the file never does: the lower entries in flight that do
        not fit are left out of it (samples first, then WARNINGs, the newest first). They are in the request; when it
        settles they are taken, or back in the queue and evicted first: the next write is within the bound anyway."""
        entries = self.snapshot_entries()
        over = self._held_bytes + self._high_bytes - self.limits.max_bytes  # every entry's, in flight included
        if over <= 0 or self._in_flight is None:
            return entries
        lower = [e for e in self._in_flight.entries if e.tier is not Tier.HIGH]
        left_out: set[int] = set()
        for e in sorted(reversed(lower), key=lambda e: e.tier is not Tier.LOW):  # samples first, newest first
            if over <= 0:
                break
            left_out.add(id(e))
            over -= e.size
        return [e for e in entries if id(e) not in left_out]

    def persisted(self, now: float, count: int, took: float = 0.0) -> None:
        """The edge wrote `count` records (a snapshot) to the spool in `took` seconds; the next write
        waits at least `persist_interval`, and 20 times as long as this one took (a big spool on a
        slow disk is not rewritten back to back)."""
        self._dirty = False
        self._spooled = count > 0
        self._next_persist = now + max(self.limits.persist_interval, 20.0 * took)

    # -- bookkeeping --------------------------------------------------------------------------

    def stats(self) -> dict[str, int]:
        return {"queued": self.pending(), "high": self._held[Tier.HIGH], "mid": self._held[Tier.MID],
                "low": self._held[Tier.LOW], "bytes": self._held_bytes + self._high_bytes, "delivered": self.delivered}

    def unreported(self) -> dict[str, int]:
        return dict(self._unreported)

    def _put(self, entry: Entry, front: bool = False) -> None:
        targets = [self._free[_stream(entry.item)]]
        if entry.tier is Tier.MID:
            targets.append(self._pool[entry.cls])
        for q in targets:
            q[entry.seq] = entry
            if front:
                q.move_to_end(entry.seq, last=False)

    def _unput(self, entry: Entry) -> None:
        del self._free[_stream(entry.item)][entry.seq]
        if entry.tier is Tier.MID:
            del self._pool[entry.cls][entry.seq]

    def _give_back(self, entries: list[Entry]) -> None:
        for entry in reversed(entries):
            entry.in_flight = False
            self._put(entry, front=True)
        if entries and self._over():  # room taken while they flew (an ERROR's): back within the bounds
            self._evict()

    def _account(self, entry: Entry, sign: int) -> None:
        self._held[entry.tier] += sign
        if entry.tier is not Tier.HIGH:
            self._held_bytes += sign * entry.size
        else:
            self._high_bytes += sign * entry.size
        key = entry.key
        if key is not None and entry.cls != "resolutions":
            left = self._firing.get(key, 0) + sign
            if left:
                self._firing[key] = left
            else:
                self._firing.pop(key, None)

    def _over(self) -> bool:
        held = self._held[Tier.LOW] + self._held[Tier.MID]
        return held > self.limits.max_queue or self._held_bytes + self._high_bytes > self.limits.max_bytes

    def _evict(self) -> None:
        """Drop to the bounds: the oldest samples first, then the oldest WARNING firings, then the
        oldest resolutions whose alert has no firing event queued. High and in-flight entries stay."""
        for q in (self._free["samples"], self._pool["warnings"], self._pool["resolutions"]):
            held, size = self._held[Tier.LOW] + self._held[Tier.MID], self._held_bytes + self._high_bytes
            victims: list[Entry] = []
            for entry in q.values():
                if held <= self.limits.max_queue and size <= self.limits.max_bytes:
                    break
                if entry.cls == "resolutions" and entry.key in self._firing:
                    continue  # its firing event is still queued (in flight): keep the pair
                victims.append(entry)
                held, size = held - 1, size - entry.size
            for entry in victims:
                self._unput(entry)
                self._account(entry, -1)
                self._count_drop(entry.cls, 1)
                self._dirty = True
            if not self._over():
                return

    def _kept_bytes(self) -> int:
        """The bytes that can make an ERROR wait for room: the high entries'. Lower entries in flight are not counted:
        their batch settles soon (taken, or back and evicted first, `_give_back`), so the bound may be passed by them
        for one request; a sample in flight never refuses an ERROR (with a 20 KB spool, a batch of samples in flight
        when the bot went down made the ERRORs raised meanwhile refused)."""
        return self._high_bytes

    def _make_room(self, new: Entry) -> None:
        """Room among the high entries for `new` within `max_bytes`, taking nothing an ERROR needs to be seen: the
        chart windows of the queued ERROR events (resolutions' first, then firings', oldest first; never one in
        flight), then `new`'s own; a resolution replaces its alert's last queued event when that is a resolution
        too (its firing in between was refused: the bot hears the same, later). ERROR resolutions are then bounded
        by the alerts with a firing queued."""
        over = self._kept_bytes() + new.size - self.limits.max_bytes
        high = [e for e in self._free["events"].values() if e.tier is Tier.HIGH]
        for e in sorted(high, key=lambda e: e.cls != "resolutions"):
            if over <= 0:
                return
            over -= self._shed_window(e)
        if over > 0:
            over -= self._shed_window(new, queued=False)
        if over > 0 and new.cls == "resolutions":
            same = [e for e in high if e.key == new.key]
            if same and same[-1].cls == "resolutions":  # its alert's last queued event: replaced by the newer one
                self._unput(same[-1])
                self._account(same[-1], -1)
                self._dirty = True

    def _shed_window(self, entry: Entry, queued: bool = True) -> int:
        """Drop an ERROR event's chart window (counted under `windows`); the bytes it freed."""
        item = entry.item
        if not isinstance(item, Event) or item.window is None:
            return 0
        stripped = msgspec.structs.replace(item, window=None)
        data = encode(stripped)
        freed = max(len(entry.data or encode(item)) - len(data), 0)  # its size keeps the spool line's framing
        if queued:
            self._account(entry, -1)
        entry.item, entry.size = stripped, entry.size - freed
        if entry.data:
            entry.data = data
        if queued:
            self._account(entry, +1)
            self._dirty = True
        self._count_drop("windows", 1)
        return freed

    def _count_drop(self, cls: str, n: int) -> None:
        self.dropped[cls] = self.dropped.get(cls, 0) + n
        self._unreported[cls] = self._unreported.get(cls, 0) + n


__all__ = ["FRAMING", "Batch", "Entry", "Fault", "Item", "Limits", "Outcome", "SendQueue", "Tier", "classify", "judge"]
