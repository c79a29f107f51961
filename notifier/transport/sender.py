"""The sender: the training thread's inbox, the send queue under its lock, and the thread that sends what
the queue hands out (one envelope at a time), applies each answer, reports faults and keeps the spool.

* The training thread only appends an item to the inbox; the sender encodes it once, queues it with its
  bytes (its size, the envelope's part, the spool's line) under a lock that is never held across I/O.
* The sender thread asks the queue for a batch, POSTs it, and tells the queue what came back. Any
  answer, or no answer, becomes a `Fault`: nothing from the network or the peer ends the thread.
  Each kind of fault is logged once, with what to do about it.
* The spool is a snapshot of what the bot has not taken yet, rewritten while the bot is down and at close.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import random
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import msgspec

from msmon.common.retry import retry_after
from msmon.contract.wire import ActionResult, Envelope, Event, Heartbeat, Sample, Severity, encode

from ..sendq import FRAMING, Batch, Entry, Fault, Item, Limits, Outcome, SendQueue
from .heartbeat import Heartbeats
from .link import ADVICE, Link, Origin, Reply
from .spool import Spool, entry_line
from .timing import Timing

log = logging.getLogger("msmon")

_EMPTY_LISTS = b',"events":[],"samples":[],"heartbeats":[],"actions":[],'  # in an Envelope's JSON, in its field order
_NAMES = {"errors": "ERROR events", "actions": "action results", "resolutions": "resolutions",
          "warnings": "WARNING events", "samples": "metric samples"}
_INBOX = 256  # items the training thread appends before it moves them into the queue itself


def envelope_body(head: Envelope, entries: list[Entry], heartbeats: list[Heartbeat] | None = None) -> bytes:
    """`encode` of `head` with the entries' items in its lists, from the bytes each was queued with: the envelope's
    own fields encoded with empty lists, the items' bytes spliced into them (each item is encoded once, when it is
    queued)."""
    body = encode(head)
    at = body.find(_EMPTY_LISTS)  # the first: every string before it is JSON-escaped, "dropped" counts numbers
    if at < 0 or head.events or head.samples or head.actions or head.heartbeats or any(not e.data for e in entries):
        head.heartbeats = list(heartbeats or ())
        for e in entries:  # pragma: no cover - every queued item has its bytes, every head is empty
            (head.events if isinstance(e.item, Event) else head.samples if isinstance(e.item, Sample)
             else head.actions).append(e.item)  # type: ignore[arg-type]
        return encode(head)
    events: list[bytes] = []
    samples: list[bytes] = []
    actions: list[bytes] = []
    for e in entries:
        (events if isinstance(e.item, Event) else samples if isinstance(e.item, Sample) else actions).append(e.data)
    lists = b"".join((b',"events":[', b",".join(events), b'],"samples":[', b",".join(samples),
                      b'],"heartbeats":[', b",".join(encode(hb) for hb in heartbeats or ()), b'],"actions":[',
                      b",".join(actions), b"],"))
    return body[:at] + lists + body[at + len(_EMPTY_LISTS):]


def batch_key(run_id: str, device: str, batch: Batch) -> str:
    """The dedup key of one batch: a digest of the run, the device and what the batch carries, so the same
    items sent again (a retry after a lost answer, a restart from the spool) get the same key."""
    h = hashlib.blake2b(f"{run_id}\0{device}\0".encode(), digest_size=16)
    h.update(encode(sorted(batch.dropped.items())))
    for e in batch.entries:
        h.update(b"\0" + entry_line(e))
    return h.hexdigest()



class Sender:
    """The inbox, the send queue and its lock, the spool's writes, and the sender thread."""

    def __init__(self, link: Link, origin: Origin, timing: Timing, limits: Limits, rng: random.Random,
                 beats: Heartbeats, spool: Spool, stop: threading.Event, clock: Callable[[], float],
                 monotonic: Callable[[], float]) -> None:
        self._link, self._origin, self._timing, self.limits, self._beats = link, origin, timing, limits, beats
        self.spool, self._stop, self._clock, self._mono = spool, stop, clock, monotonic
        self.queue = SendQueue(limits, rng)
        self._lock = threading.Lock()  # the queue's; never held across I/O
        self._changed = threading.Condition(self._lock)  # an answer came: flush() and close() wait on it
        self._spool_lock = threading.Lock()  # one spool write at a time
        self._inbox: deque[Item] = deque()  # the training thread's appends, not yet in the queue
        self._wake = threading.Event()
        self.closed = False
        self._restore()  # what an earlier start spooled goes first
        self.thread: threading.Thread | None = None

    def start(self, owner: object) -> None:
        """Start the sender thread. It holds `owner` (the transport) while it runs: a job that drops its transport
        without close() still has it closed at exit (`atexit` holds it weakly)."""
        self.thread = threading.Thread(target=self._run, args=(owner,), name="msmon-sender", daemon=True)
        self.thread.start()

    # -- what the transport's readers see ------------------------------------------------------------

    @property
    def dropped(self) -> dict[str, int]:
        with self._lock:
            return dict(self.queue.dropped)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            q = self.queue
            return {**q.stats(), "dropped": dict(q.dropped), "dead": dict(q.dead), "refused": dict(q.refused),
                    "connected": q.connected}

    # -- the training thread: O(1), never blocks on the network, never raises ------------------------

    def put(self, item: Item) -> None:
        # The training thread only appends; the sender moves the inbox into the queue (encoding each
        # item once: its bytes are its size and its part of the envelope). An ERROR, an action result or a full inbox
        # is moved at once.
        self._inbox.append(item)
        high = not isinstance(item, Sample) and (isinstance(item, ActionResult) or item.severity is Severity.ERROR)
        if len(self._inbox) == _INBOX // 2:
            self._wake.set()  # the sender moves them before the training thread has to
        if high or len(self._inbox) >= _INBOX:
            self.take_inbox()
            if high:
                self._wake.set()  # an ERROR goes out now, not at the next flush (or at the next probe)

    def take_inbox(self) -> None:
        """Move what the training thread queued into the send queue, in order (under its lock)."""
        bad: list[str] = []
        with self._lock:
            now = self._mono()
            while self._inbox:
                item = self._inbox.popleft()
                try:
                    data = encode(item)  # the wire's bytes, sent as they are (the envelope splices them in)
                except (TypeError, ValueError, OverflowError, msgspec.EncodeError) as exc:
                    self.queue.lost(item)
                    bad.append(f"{type(item).__name__} ({exc})")
                    continue
                self.queue.enqueue(item, now, len(data) + FRAMING, data)  # as its spool line: the bound is the file's
            cap = self.queue.cap_reached
        run = self._origin.run_id
        if bad:
            self._link.complain("unencodable", f"msmon: run {run}: a {bad[0]} could not be encoded for the bot "
                                               "and is not sent (counted as dropped); this is a bug, please report it")
        if cap:
            self._link.complain("cap", f"msmon: run {run}: the ERROR events and action results waiting for the "
                                       f"bot at {self._link.public_url} reached {self.limits.max_high} or the spool's "
                                       f"{self.limits.max_bytes / 2**20:.3g} MB (spool_max_mb); newer ones are dropped "
                                       "and counted until it takes them. Is the bot down? (BotTransport max_errors)")

    # -- the sender thread ---------------------------------------------------------------------------

    def _run(self, owner: object) -> None:
        while not self._stop.is_set():
            try:
                wait = self._cycle()
            except Exception:  # noqa: BLE001 - a bug must not end delivery: say so once, go on
                if self._link.once("sender-bug"):
                    log.exception("msmon: run %s: the sender hit a bug (please report it); it goes on",
                                  self._origin.run_id)
                wait = 1.0
            if wait > 0:
                self._wake.wait(wait)
                self._wake.clear()

    def _cycle(self) -> float:
        """One step of the sender: send a due batch and apply its answer, or persist, or say how long
        to sleep. Returns the seconds to wait before the next step (0: go on at once)."""
        self.take_inbox()
        now = self._mono()
        with self._lock:
            if self.closed:
                return 1.0
            batch = self.queue.take(now)
            if batch is None:
                due = self.queue.next_due(now)
                persist = self.queue.persist_due(now)
        if batch is None:
            if persist:
                self.persist()
            idle = 1.0 if self.queue.connected is False else self.limits.flush_interval
            return min(idle, max(due - now, 0.01)) if due is not None else idle
        key = batch_key(self._origin.run_id, self._origin.device, batch) if self._link.has_backend else None
        beats = self._beats.folded(now)
        reply = self._link.exchange("/v1/ingest", self._envelope_body(batch, beats), self._timing.timeout, key)
        if beats and reply.fault is None:
            self._beats.carried(now)
        with self._changed:
            if self.closed:
                return 1.0
            now = self._mono()
            if reply.fault is None:
                out = self.queue.accepted(batch, now)
            else:
                wait = retry_after(reply.retry_after, self._clock(), self.limits.backoff[1])
                out = self.queue.failed(batch, now, reply.fault, wait)
            self._changed.notify_all()
            persist = self.queue.persist_due(now)
        self._report(batch, reply, out)
        if persist:
            self.persist()
        return 0.0

    def _envelope_body(self, batch: Batch, heartbeats: list[Heartbeat] | None = None) -> bytes:
        return envelope_body(self._envelope(Batch(batch.id, [], batch.dropped)), batch.entries, heartbeats)

    def _envelope(self, batch: Batch) -> Envelope:
        o = self._origin
        env = Envelope(run_id=o.run_id, device=o.device, sent_at=self._clock(), project=o.project,
                       proc=self._beats.proc, rank=o.rank, host=o.host, labels=o.labels, dropped=dict(batch.dropped))
        for e in batch.entries:
            if isinstance(e.item, Event):
                env.events.append(e.item)
            elif isinstance(e.item, Sample):
                env.samples.append(e.item)
            else:
                env.actions.append(e.item)
        return env

    def _report(self, batch: Batch, reply: Reply, out: Outcome) -> None:
        """Log what an answer means for the person on call: each kind of fault once, recovery, drops."""
        o, url = self._origin, self._link.public_url
        if out.fault is not None and out.first_of_kind:
            what = f"HTTP {reply.status}" if reply.status else out.fault.value
            if out.fault is Fault.AUTH:
                log.error("msmon: the bot at %s refused run %s: %s %s. %s; data is kept in %s until it is accepted",
                          url, o.run_id, what, reply.detail, ADVICE[out.fault], self.spool.directory)
            elif out.fault.refuses_data:
                log.error("msmon: the bot at %s refused a batch of run %s device %s (%s %s): %s",
                          url, o.run_id, o.device, what, reply.detail, ADVICE[out.fault])
            else:
                log.warning("msmon: cannot reach the bot at %s (%s: %s); run %s keeps training, retries with backoff "
                            "and spools to %s. %s", url, what, reply.detail, o.run_id,
                            self.spool.directory, ADVICE[out.fault])
        if out.dead:
            self._write_dead(out.dead)
            kinds = ", ".join(f"{n} {_NAMES[k]}" for k, n in self.queue.dead.items())
            self._link.complain(f"dead-{out.dead[0].cls}", f"msmon: the bot at {url} refuses some data of run "
                                f"{o.run_id} ({reply.detail}); so far {kinds}; kept in {self.spool.dead_path}. "
                                f"{ADVICE[Fault.REJECTED]}")
        if out.recovered:
            log.info("msmon: delivering run %s to the bot at %s again", o.run_id, url)
        if out.reported:
            log.warning("msmon: run %s device %s: the bot is reachable again; %s were dropped while it was not",
                        o.run_id, o.device, ", ".join(f"{n} {_NAMES.get(k, k)}" for k, n in out.reported.items()))

    # -- the spool -----------------------------------------------------------------------------------

    def _write_dead(self, entries: list[Entry]) -> None:
        try:
            self.spool.dead_letter(entries)
        except (OSError, TypeError, ValueError, msgspec.EncodeError) as exc:
            self._link.complain("dead-write", f"msmon: cannot write dead letters to {self.spool.dead_path}: {exc}")

    def persist(self) -> None:
        """Rewrite the spool from the queue's snapshot (at most one writer; the queue is not held)."""
        with self._spool_lock:
            with self._lock:
                items = self.queue.spool_entries()
            start = self._mono()
            try:
                self.spool.write(items)
            except (OSError, TypeError, ValueError, msgspec.EncodeError) as exc:
                self._link.complain("spool", f"msmon: run {self._origin.run_id}: cannot write the spool "
                                             f"{self.spool.path} ({exc}); undelivered data is only in memory. Check "
                                             "the disk and bot.spool_dir")
                return
            with self._lock:
                self.queue.persisted(self._mono(), len(items), self._mono() - start)

    def _restore(self) -> None:
        items = self.spool.load()
        run = self._origin.run_id
        if self.spool.bad_lines:
            log.warning("msmon: run %s: %d unreadable lines in the spool %s were skipped", run,
                        self.spool.bad_lines, self.spool.path)
        if not items:
            return
        sized = []
        for item in items:
            with contextlib.suppress(TypeError, ValueError, msgspec.EncodeError):
                sized.append((item, encode(item)))
        with self._lock:
            self.queue.restore(sized, self._mono())
        log.info("msmon: run %s: %d items spooled by an earlier start go to the bot first", run, len(sized))

    # -- the end -------------------------------------------------------------------------------------

    def flush(self, timeout: float) -> bool:
        """Deliver everything now (the sender does, this waits); True if all went out in time."""
        deadline = self._mono() + max(timeout, 0.0)
        self.take_inbox()
        with self._changed:
            self.queue.hurry(self._mono())  # once: a refused or failed batch keeps its backoff (no flood at close)
            self._wake.set()
            while self.queue.pending() or self.queue.unreported():
                left = deadline - self._mono()
                if left <= 0 or self.closed:
                    return False
                self._changed.wait(min(left, 0.05))
        return True

    def close(self) -> None:
        """No more sending: what the training thread queued last goes into the queue, the sender stops."""
        self.take_inbox()
        with self._lock:
            self.closed = True

    def wake(self) -> None:
        self._wake.set()

    def join(self, timeout: float) -> None:
        if self.thread is not None:
            self.thread.join(timeout=timeout)

    def spool_at_exit(self, ok: bool) -> None:
        """Write what the bot has not taken to the spool for the next start (`ok`: everything went out in time)."""
        with self._spool_lock:
            with self._lock:
                items = self.queue.spool_entries()
            try:
                self.spool.write(items)
            except (OSError, TypeError, ValueError, msgspec.EncodeError) as exc:
                log.error("msmon: run %s: cannot write the spool %s at exit (%s); %d undelivered items are lost",
                          self._origin.run_id, self.spool.path, exc, len(items))
                return
        if not ok or items:
            log.warning("msmon: run %s: the bot at %s did not take everything before exit; %d items stay in %s and "
                        "go out when a job with the same run id and device starts again", self._origin.run_id,
                        self._link.public_url, len(items), self.spool.path)


__all__ = ["Sender", "batch_key", "envelope_body"]
