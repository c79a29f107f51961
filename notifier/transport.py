"""Job -> bot transport: the edge around `notifier.sendq.SendQueue`, the pure state machine that
decides what is sent, when, and what a full queue drops. Here live the threads and the spool file
(the requests go through `notifier.http`, the client `msmon cmd` uses too); nothing here decides
anything the state machine can.

* The training thread only appends an item to the inbox; the sender encodes it once, queues it with its
  bytes (its size, the envelope's part, the spool's line) under a lock that is never held across I/O.
* The sender thread asks the queue for a batch, POSTs it, and tells the queue what came back. Any
  answer, or no answer, becomes a `Fault`: nothing from the network or the peer ends the thread.
  Each kind of fault is logged once, with what to do about it.
* The heartbeat and command long-poll threads are as hard to kill.
* The spool (one JSONL file per run and device, one `SpoolRecord` a line through the wire codec) is
  a snapshot of what the bot has not taken yet, rewritten atomically while the bot is down and at
  close; a job that starts with the same run id and device sends it first.

Standard library and msgspec only: nothing heavy on the notifier's import path.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import itertools
import logging
import math
import os
import random
import socket
import threading
import time
import uuid
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec

from msmon.common.retry import retry_after
from msmon.common.safenames import inside, slug
from msmon.common.urls import redacted, url_problem
from msmon.contract.wire import (
    ActionRequest,
    ActionResult,
    Command,
    Envelope,
    Event,
    Heartbeat,
    Poll,
    PollAnswer,
    RingCheckpoint,
    Sample,
    Severity,
    decode,
    encode,
)

from .http import HTTPFailure, request
from .sendq import FRAMING, Batch, Entry, Fault, Item, Limits, Outcome, SendQueue, judge

log = logging.getLogger("msmon")

_EMPTY_LISTS = b',"events":[],"samples":[],"heartbeats":[],"actions":[],'  # in an Envelope's JSON, in its field order
_NAMES = {"errors": "ERROR events", "actions": "action results", "resolutions": "resolutions",
          "warnings": "WARNING events", "samples": "metric samples"}


class SpoolRecord(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One line of the spool: exactly one of the three kinds of item."""

    event: Event | None = None
    sample: Sample | None = None
    action: ActionResult | None = None

    @classmethod
    def of(cls, item: Item) -> SpoolRecord:
        if isinstance(item, Event):
            return cls(event=item)
        if isinstance(item, Sample):
            return cls(sample=item)
        return cls(action=item)

    @property
    def item(self) -> Item | None:
        return self.event or self.sample or self.action

    @staticmethod
    def line(item: Item, data: bytes) -> bytes:
        """`encode(SpoolRecord.of(item))` for an item already encoded as `data`, without encoding it again."""
        if isinstance(item, Event):
            return b'{"event":' + data + b"}"
        if isinstance(item, Sample):
            return b'{"sample":' + data + b"}"
        return b'{"action":' + data + b"}"


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


def _line(entry: Entry) -> bytes:
    """The spool's (and the batch key's) line of a queued entry: from its bytes where it has them."""
    return SpoolRecord.line(entry.item, entry.data) if entry.data else encode(SpoolRecord.of(entry.item))


SPOOL_MAX_AGE = 7 * 86_400.0  # seconds a spool of another run and device may sit untouched before a job removes it


class Spool:
    """What the bot has not taken yet, on disk: `<run>@<device>.spool.jsonl` under `directory`
    (names from `safenames.slug`, checked with `inside`), rewritten whole and atomically."""

    def __init__(self, directory: str, run_id: str, device: str) -> None:
        self.directory = directory
        os.makedirs(directory, exist_ok=True)
        stem = f"{slug(run_id)}@{slug(device)}"  # '@' never occurs in a slug: no two jobs share a file
        self.path = inside(directory, stem + ".spool.jsonl")
        self.dead_path = inside(directory, stem + ".dead.jsonl")
        self._legacy_stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in f"{run_id}-{device}")
        self.bad_lines = 0

    def empty(self) -> bool:
        try:
            return os.path.getsize(self.path) == 0
        except OSError:
            return True

    def load(self) -> list[Item]:
        """The spooled items, oldest first; unreadable lines (a torn write, a disk fault) are counted
        in `bad_lines` and skipped. Spools of earlier msmon versions are read too, then removed."""
        items: list[Item] = []
        for path, parse in [(self.path, self._record), *self._legacy()]:
            try:
                with open(path, "rb") as f:
                    lines = f.read().splitlines()
            except OSError:
                continue
            for line in lines:
                if not line.strip():
                    continue
                try:
                    items.append(parse(line))
                except (msgspec.ValidationError, msgspec.DecodeError, ValueError, KeyError):
                    self.bad_lines += 1
            if path != self.path:
                with contextlib.suppress(OSError):
                    os.remove(path)
        return items

    @staticmethod
    def _record(line: bytes) -> Item:
        item = decode(line, SpoolRecord).item
        if item is None:
            raise ValueError("an empty spool record")
        return item

    def _legacy(self) -> list[tuple[str, Callable[[bytes], Item]]]:
        kinds: dict[bytes, type[Event] | type[Sample] | type[ActionResult]] = {
            b"e": Event, b"s": Sample, b"a": ActionResult}

        def parse(line: bytes) -> Item:
            return decode(line[1:], kinds[line[:1]])

        paths = [inside(self.directory, f"{self._legacy_stem}.{k}.jsonl") for k in ("high", "mid", "low")]
        return [(p, parse) for p in paths if os.path.exists(p)]

    def write(self, items: list[Item] | list[Entry]) -> int:
        """Replace the spool with `items` (queued entries: from the bytes they were queued with; none: remove it);
        returns the bytes written."""
        if not items:
            with contextlib.suppress(FileNotFoundError):
                os.remove(self.path)
            return 0
        data = b"\n".join(_line(x) if isinstance(x, Entry) else encode(SpoolRecord.of(x)) for x in items) + b"\n"
        tmp = self.path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        return len(data)

    def prune_others(self, max_age: float, now: float) -> list[str]:
        """Remove the spools of other runs and devices in this directory untouched for `max_age` seconds (a
        run id that never comes back would keep its spool for ever); the names removed. Dead letters stay."""
        removed: list[str] = []
        try:
            names = os.listdir(self.directory)
        except OSError:
            return removed
        for name in names:
            path = os.path.join(self.directory, name)
            if path == self.path or not name.endswith((".spool.jsonl", ".spool.jsonl.tmp")):
                continue
            with contextlib.suppress(OSError):
                if now - os.stat(path).st_mtime > max_age:
                    os.remove(path)
                    removed.append(name)
        return removed

    def dead_letter(self, entries: list[Entry]) -> None:
        """Keep what the bot refuses on its own, for a person to look at (appended, never sent again)."""
        with open(self.dead_path, "ab") as f:
            for e in entries:
                f.write(_line(e) + b"\n")


def _bounded(name: str, value: float, lo: float, hi: float, default: float) -> float:
    """`value` within [lo, hi] (NaN: `default`), with a warning when it had to be changed."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        v = math.nan
    if v != v:
        log.warning("msmon: BotTransport %s %r is not a number; using %g", name, value, default)
        return default
    if not lo <= v <= hi:
        log.warning("msmon: BotTransport %s %g is outside [%g, %g]; using %g", name, v, lo, hi, min(max(v, lo), hi))
    return min(max(v, lo), hi)


def check_url(url: str) -> str:
    """The bot's base URL without a trailing slash, or ValueError saying what is wrong with it."""
    problem = url_problem(url)
    if problem is not None:
        raise ValueError(f"bot.url {problem} (e.g. http://msmon-bot:8080)")
    return url.rstrip("/")


@dataclass
class Reply:
    """What one request came to: an answer (status, body, Retry-After) and its fault, if any."""

    fault: Fault | None
    status: int = 0
    body: bytes = b""
    retry_after: str | None = None
    detail: str = ""


class Backend(Protocol):
    """Where the threads' requests go instead of HTTP (notifier/nats_transport.py): the same paths and
    bodies, the same `Reply`s; it never raises. `key`: an ingest batch's dedup key (`batch_key`)."""

    def exchange(self, path: str, body: bytes, timeout: float, key: str | None) -> Reply: ...

    def close(self, timeout: float) -> None: ...


def batch_key(run_id: str, device: str, batch: Batch) -> str:
    """The dedup key of one batch: a digest of the run, the device and what the batch carries, so the same
    items sent again (a retry after a lost answer, a restart from the spool) get the same key."""
    h = hashlib.blake2b(f"{run_id}\0{device}\0".encode(), digest_size=16)
    h.update(encode(sorted(batch.dropped.items())))
    for e in batch.entries:
        h.update(b"\0" + _line(e))
    return h.hexdigest()


_ADVICE = {
    Fault.UNREACHABLE: "is the bot running and is bot.url right?",
    Fault.TIMEOUT: "the bot or the network is overloaded; delivery goes on when it answers",
    Fault.NOT_HTTP: "something other than the msmon bot listens at bot.url (another service, a TLS port?)",
    Fault.TRUNCATED: "the answer was cut short: a proxy or the network dropped the connection",
    Fault.BAD_ANSWER: "a proxy or captive portal answered instead of the bot; check bot.url",
    Fault.SERVER: "the bot failed; see its log",
    Fault.RATE_LIMITED: "the bot asked the job to slow down",
    Fault.AUTH: "check the job token (the environment variable named by bot.token_env)",
    Fault.TOO_LARGE: "a batch was over the bot's byte limit; smaller batches are tried",
    Fault.REJECTED: "the bot refused data as invalid; this is a bug, please report it",
    Fault.BAD_URL: "fix bot.url",
    Fault.BUG: "this is a bug in msmon, please report it",
}


def _close_at_exit(ref: weakref.ReferenceType[BotTransport]) -> None:
    """A job that ends without close() (an exception out of the training loop) still spools what
    the bot has not taken: the daemon threads would just vanish with it."""
    t = ref()
    if t is not None and not t._closed:
        t.close(timeout=2.0)


_INBOX = 256  # items the training thread appends before it moves them into the queue itself
_AGAIN = 0.25  # the least time between two command polls that brought nothing
_ASKS = 64  # configured actions waiting for the bot at most (a rule's actions fire once per alert)


class BotTransport:
    """Delivers a job's events, samples, action results and heartbeats to the msmon bot."""

    def __init__(
        self,
        url: str,
        run_id: str,
        device: str = "0",
        token: str | None = None,
        *,
        project: str = "default",
        labels: dict[str, str] | None = None,
        spool_dir: str = "./msmon_spool",
        spool_max_bytes: int = 64 << 20,
        max_queue: int = 10_000,
        max_errors: int = 10_000,
        batch_max: int = 500,
        batch_max_bytes: int = 1 << 20,
        flush_interval: float = 1.0,
        heartbeat_interval: float = 5.0,
        timeout: float = 5.0,
        backoff: tuple[float, float] = (0.5, 30.0),
        probe_interval: float = 1.0,
        rank: int | None = None,
        world: int | None = None,
        host: str | None = None,
        on_commands: Callable[[list[Command]], None] | None = None,
        poll_wait: float = 20.0,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        backend: Backend | None = None,
    ) -> None:
        # `backend`: where requests go instead of HTTP to `url` (notifier/nats_transport.py); it checks its URL
        self._backend = backend
        self.url = check_url(url) if backend is None else url
        self._public_url = redacted(self.url)
        self.run_id, self.device = run_id, str(device)
        self._token = token
        self.project, self.labels = project, dict(labels or {})
        # Who sends, in every envelope and heartbeat (the bot's view across ranks): the rank in the job's world
        # (notifier.world; None for a single process) and the host.
        self.rank = rank if rank is None or 0 <= rank <= 2**31 - 1 else None
        self.world = world if world is None or 1 <= world <= 2**31 else None
        self.host = (socket.gethostname() if host is None else host)[:256]
        # This process's own start (a nonce) and its heartbeats' numbers: the bot tells a re-run (a new attempt)
        # from a late message of this one, and a heartbeat overtaken in flight from a newer one (bot/runs/lifecycle.py).
        self.proc = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self._seq = itertools.count(1)
        # The health checkpoints and the attempt, sent with every heartbeat (`ring`, from notifier/control; a rewind
        # renews `proc` through `new_attempt`)
        self.checkpoints: list[RingCheckpoint] | None = None
        self.attempt: int | None = None
        # Every wait a thread makes is bounded here, whoever built the transport: Event.wait(1e12) raises
        # OverflowError in the thread, and a poll wait the bot refuses would end chat commands.
        heartbeat_interval = _bounded("heartbeat_interval", heartbeat_interval, 0.05, 3600.0, 5.0)
        timeout = _bounded("timeout", timeout, 0.1, 600.0, 5.0)
        flush_interval = _bounded("flush_interval", flush_interval, 0.001, 3600.0, 1.0)
        probe_interval = _bounded("probe_interval", probe_interval, 0.05, 60.0, 1.0)
        poll_wait = _bounded("poll_wait", poll_wait, 0.0, 3600.0, 20.0)
        backoff = (_bounded("backoff[0]", backoff[0], 0.01, 3600.0, 0.5),
                   _bounded("backoff[1]", backoff[1], 0.01, 3600.0, 30.0))
        self.heartbeat_interval, self.timeout, self.backoff = heartbeat_interval, timeout, backoff
        self.on_commands = on_commands
        self.poll_wait = poll_wait
        self._cursor = 0  # the bot's command sequence number this job has seen up to
        self._clock, self._mono = clock, monotonic
        self.last_step: int | None = None
        self.paused = False
        self.total_steps: int | None = None  # the run's plan, sent with heartbeats (`plan`, from the Monitor)
        self.target_loss: float | None = None
        self._rng = rng or random.Random()
        self.limits = Limits(max_queue=max_queue, max_bytes=spool_max_bytes, max_high=max_errors,
                             batch_max=batch_max, batch_max_bytes=batch_max_bytes, flush_interval=flush_interval,
                             backoff=backoff, probe_interval=probe_interval)
        self._q = SendQueue(self.limits, self._rng)
        self._lock = threading.Lock()  # the queue's; never held across I/O
        self._changed = threading.Condition(self._lock)  # an answer came: flush() and close() wait on it
        self._spool_lock = threading.Lock()  # one spool write at a time
        self._inbox: deque[Item] = deque()  # the training thread's appends, not yet in the queue
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._stop_beats = threading.Event()  # close(): the heartbeats end before the final one goes
        # A heartbeat due before the next flush rides in the envelope going now instead of a request of its own; the
        # heartbeat thread sends one only when no envelope carried one for heartbeat_interval (a paused or idle job).
        self._last_beat = monotonic()
        self._beat_lock = threading.Lock()  # a folded heartbeat is numbered before the final one, never after
        self._closed = False
        self._complained: set[str] = set()
        self.spool = Spool(spool_dir, run_id, self.device)
        stale = self.spool.prune_others(SPOOL_MAX_AGE, time.time())
        if stale:
            log.warning("msmon: removed %d spool(s) untouched for %.0f days from %s (runs that never came back: "
                        "their unsent items are gone): %s", len(stale), SPOOL_MAX_AGE / 86400, spool_dir,
                        ", ".join(stale[:5]) + (" ..." if len(stale) > 5 else ""))
        self._restore()
        self._sender = threading.Thread(target=self._send_loop, name="msmon-sender", daemon=True)
        self._beater = threading.Thread(target=self._beat_loop, name="msmon-heartbeat", daemon=True)
        self._poller: threading.Thread | None = None
        self._asks: deque[ActionRequest] = deque()  # configured actions for the bot to apply on every rank
        self._asked = threading.Event()
        self._asker: threading.Thread | None = None
        self.asks_lost = 0  # requests refused by the bot, or still unsent at close (each logged)
        self._sender.start()
        self._beater.start()
        atexit.register(_close_at_exit, weakref.ref(self))

    # -- what tests and the status line read ----------------------------------------------------

    @property
    def dropped(self) -> dict[str, int]:
        """Items dropped since start, by class (errors, actions, resolutions, warnings, samples)."""
        with self._lock:
            return dict(self._q.dropped)

    @property
    def delivered(self) -> int:
        return self._q.delivered

    @property
    def connected(self) -> bool | None:
        return self._q.connected

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {**self._q.stats(), "dropped": dict(self._q.dropped), "dead": dict(self._q.dead),
                    "refused": dict(self._q.refused), "connected": self._q.connected}

    def listen(self, on_commands: Callable[[list[Command]], None]) -> None:
        """Take chat commands: long-poll the bot for them from a thread of their own and hand each
        batch to `on_commands` (which must only queue them: it runs on that thread)."""
        self.on_commands = on_commands
        if self._poller is None:
            self._poller = threading.Thread(target=self._poll_loop, name="msmon-commands", daemon=True)
            self._poller.start()

    # -- the training thread: O(1), never blocks on the network, never raises --------------------

    def event(self, ev: Event) -> None:
        self._put(ev)

    def sample(self, s: Sample) -> None:
        """A sampled step's metrics, and the step the next heartbeat reports."""
        self.last_step = s.step
        self._put(s)

    def plan(self, total_steps: int | None, target_loss: float | None) -> None:
        """The run's plan from its config, sent with every heartbeat (the bot's forecast and progress)."""
        self.total_steps, self.target_loss = total_steps, target_loss

    def ring(self, checkpoints: list[RingCheckpoint], attempt: int) -> None:
        """The job's health checkpoints and its attempt, sent with every heartbeat (the bot's `checkpoints`)."""
        self.checkpoints, self.attempt = checkpoints, attempt

    def new_attempt(self) -> None:
        """A rewind: the bot sees a new attempt of the same run from here on (a fresh process nonce)."""
        self.proc = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"

    def action(self, r: ActionResult) -> None:
        self._put(r)

    def ask(self, req: ActionRequest) -> None:
        """Ask the bot to have every rank of the run apply a configured action (a multi-rank run's rule
        fired here). O(1) on the training thread; a thread of its own sends it, retrying with backoff
        until the bot answers; what it answers is the command every rank then polls."""
        if len(self._asks) >= _ASKS:
            self.asks_lost += 1
            self._complain("asks-full", f"msmon: run {self.run_id} device {self.device}: {_ASKS} configured actions "
                                        "wait for the bot already; newer ones are dropped (is the bot down?)")
            return
        self._asks.append(req if req.project is not None else msgspec.structs.replace(req, project=self.project))
        if self._asker is None:
            self._asker = threading.Thread(target=self._ask_loop, name="msmon-asks", daemon=True)
            self._asker.start()
        self._asked.set()

    def _ask_loop(self) -> None:
        failures = 0
        while not self._stop.is_set():
            if not self._asks:
                self._asked.wait(1.0)
                self._asked.clear()
                continue
            try:
                wait = self._ask_once(self._asks[0])
            except Exception:  # noqa: BLE001 - a bug must not end the requests
                self._complain("ask-bug", "msmon: the action request thread hit a bug (please report it); it goes on")
                wait = None
            if wait == 0.0:
                failures = 0
                continue
            failures += 1
            lo, hi = self.backoff
            delay = min(hi, lo * 2.0 ** min(failures - 1, 64)) * (0.5 + self._rng.random())
            self._stop.wait(min(wait if wait is not None else delay, hi * 2))

    def _ask_once(self, req: ActionRequest) -> float | None:
        """Send the oldest request; 0.0 once the bot answered it (taken, or refused and logged)."""
        reply = self._exchange("/v1/actions/request", encode(req), self.timeout)
        where = f"run {self.run_id} step {req.step} device {self.device}"
        if reply.fault is None:
            self._asks.popleft()
            try:
                answer = msgspec.json.decode(reply.body)
                cmd = answer["command"]
                log.warning("msmon: [%s] %s (rule %s %s): the bot queued it as %s; every rank applies it at step %s",
                            where, req.action, req.rule, req.severity.value, cmd["id"], cmd["apply_step"])
            except (msgspec.DecodeError, KeyError, TypeError):
                log.warning("msmon: [%s] %s (rule %s): the bot took the request", where, req.action, req.rule)
            return 0.0
        if reply.status == 409:  # the run's first report has not reached the bot yet: ask again
            self._note("action request", reply)
            return retry_after(reply.retry_after, self._clock(), self.backoff[1])
        if reply.fault.refuses_data or reply.fault is Fault.AUTH:  # an older bot without the route: 404, rejected
            self._asks.popleft()
            self.asks_lost += 1
            log.error("msmon: [%s] the bot at %s refused the configured action %s of rule %s (HTTP %s: %s); it is NOT "
                      "applied on any rank. %s", where, self._public_url, req.action, req.rule, reply.status,
                      reply.detail, _ADVICE[reply.fault])
            return 0.0
        self._note("action request", reply)
        return retry_after(reply.retry_after, self._clock(), self.backoff[1])

    def progress(self, step: int, paused: bool = False) -> None:
        self.last_step = step
        self.paused = paused

    def _put(self, item: Item) -> None:
        # The training thread only appends; the sender moves the inbox into the queue (encoding each
        # item once: its bytes are its size and its part of the envelope). An ERROR, an action result or a full inbox
        # is moved at once.
        self._inbox.append(item)
        high = not isinstance(item, Sample) and (isinstance(item, ActionResult) or item.severity is Severity.ERROR)
        if len(self._inbox) == _INBOX // 2:
            self._wake.set()  # the sender moves them before the training thread has to
        if high or len(self._inbox) >= _INBOX:
            self._take_inbox()
            if high:
                self._wake.set()  # an ERROR goes out now, not at the next flush (or at the next probe)

    def _take_inbox(self) -> None:
        """Move what the training thread queued into the send queue, in order (under its lock)."""
        bad: list[str] = []
        with self._lock:
            now = self._mono()
            while self._inbox:
                item = self._inbox.popleft()
                try:
                    data = encode(item)  # the wire's bytes, sent as they are (the envelope splices them in)
                except (TypeError, ValueError, OverflowError, msgspec.EncodeError) as exc:
                    self._q.lost(item)
                    bad.append(f"{type(item).__name__} ({exc})")
                    continue
                self._q.enqueue(item, now, len(data) + FRAMING, data)  # as its spool line: the bound is the file's
            cap = self._q.cap_reached
        if bad:
            self._complain("unencodable", f"msmon: run {self.run_id}: a {bad[0]} could not be encoded for the bot "
                                          "and is not sent (counted as dropped); this is a bug, please report it")
        if cap:
            self._complain("cap", f"msmon: run {self.run_id}: the ERROR events and action results waiting for the "
                                  f"bot at {self._public_url} reached {self.limits.max_high} or the spool's "
                                  f"{self.limits.max_bytes / 2**20:.3g} MB (spool_max_mb); newer ones are dropped "
                                  "and counted until it takes them. Is the bot down? (BotTransport max_errors)")

    # -- the sender thread -----------------------------------------------------------------------

    def _send_loop(self) -> None:
        while not self._stop.is_set():
            try:
                wait = self._cycle()
            except Exception:  # noqa: BLE001 - a bug must not end delivery: say so once, go on
                if "sender-bug" not in self._complained:
                    self._complained.add("sender-bug")
                    log.exception("msmon: run %s: the sender hit a bug (please report it); it goes on", self.run_id)
                wait = 1.0
            if wait > 0:
                self._wake.wait(wait)
                self._wake.clear()

    def _cycle(self) -> float:
        """One step of the sender: send a due batch and apply its answer, or persist, or say how long
        to sleep. Returns the seconds to wait before the next step (0: go on at once)."""
        self._take_inbox()
        now = self._mono()
        with self._lock:
            if self._closed:
                return 1.0
            batch = self._q.take(now)
            if batch is None:
                due = self._q.next_due(now)
                persist = self._q.persist_due(now)
        if batch is None:
            if persist:
                self._persist()
            idle = 1.0 if self._q.connected is False else self.limits.flush_interval
            return min(idle, max(due - now, 0.01)) if due is not None else idle
        key = batch_key(self.run_id, self.device, batch) if self._backend is not None else None
        beats = self._folded_beat(now)
        reply = self._exchange("/v1/ingest", self._envelope_body(batch, beats), self.timeout, key)
        if beats and reply.fault is None:
            self._last_beat = now
        with self._changed:
            if self._closed:
                return 1.0
            now = self._mono()
            if reply.fault is None:
                out = self._q.accepted(batch, now)
            else:
                wait = retry_after(reply.retry_after, self._clock(), self.backoff[1])
                out = self._q.failed(batch, now, reply.fault, wait)
            self._changed.notify_all()
            persist = self._q.persist_due(now)
        self._report(batch, reply, out)
        if persist:
            self._persist()
        return 0.0

    def _envelope_body(self, batch: Batch, heartbeats: list[Heartbeat] | None = None) -> bytes:
        return envelope_body(self._envelope(Batch(batch.id, [], batch.dropped)), batch.entries, heartbeats)

    def _folded_beat(self, now: float) -> list[Heartbeat]:
        """A heartbeat for the envelope going now, when one is due within two flushes anyway (an envelope goes about
        every flush_interval, so the next one may come too late), or half an interval has passed; none once close()
        has stopped the heartbeats: the final one is the last."""
        interval = self.heartbeat_interval
        if now - self._last_beat < max(interval - 2 * self.limits.flush_interval, interval / 2):
            return []
        with self._beat_lock:
            return [] if self._stop_beats.is_set() else [self._heartbeat()]

    def _envelope(self, batch: Batch) -> Envelope:
        env = Envelope(run_id=self.run_id, device=self.device, sent_at=self._clock(), project=self.project,
                       proc=self.proc, rank=self.rank, host=self.host, labels=self.labels, dropped=dict(batch.dropped))
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
        if out.fault is not None and out.first_of_kind:
            what = f"HTTP {reply.status}" if reply.status else out.fault.value
            if out.fault is Fault.AUTH:
                log.error("msmon: the bot at %s refused run %s: %s %s. %s; data is kept in %s until it is accepted",
                          self._public_url, self.run_id, what, reply.detail, _ADVICE[out.fault], self.spool.directory)
            elif out.fault.refuses_data:
                log.error("msmon: the bot at %s refused a batch of run %s device %s (%s %s): %s",
                          self._public_url, self.run_id, self.device, what, reply.detail, _ADVICE[out.fault])
            else:
                log.warning("msmon: cannot reach the bot at %s (%s: %s); run %s keeps training, retries with backoff "
                            "and spools to %s. %s", self._public_url, what, reply.detail, self.run_id,
                            self.spool.directory, _ADVICE[out.fault])
        if out.dead:
            self._write_dead(out.dead)
            kinds = ", ".join(f"{n} {_NAMES[k]}" for k, n in self._q.dead.items())
            self._complain(f"dead-{out.dead[0].cls}", f"msmon: the bot at {self._public_url} refuses some data of run "
                           f"{self.run_id} ({reply.detail}); so far {kinds}; kept in {self.spool.dead_path}. "
                           f"{_ADVICE[Fault.REJECTED]}")
        if out.recovered:
            log.info("msmon: delivering run %s to the bot at %s again", self.run_id, self._public_url)
        if out.reported:
            log.warning("msmon: run %s device %s: the bot is reachable again; %s were dropped while it was not",
                        self.run_id, self.device, ", ".join(f"{n} {_NAMES.get(k, k)}" for k, n in out.reported.items()))

    def _write_dead(self, entries: list[Entry]) -> None:
        try:
            self.spool.dead_letter(entries)
        except (OSError, TypeError, ValueError, msgspec.EncodeError) as exc:
            self._complain("dead-write", f"msmon: cannot write dead letters to {self.spool.dead_path}: {exc}")

    def _persist(self) -> None:
        """Rewrite the spool from the queue's snapshot (at most one writer; the queue is not held)."""
        with self._spool_lock:
            with self._lock:
                items = self._q.spool_entries()
            start = self._mono()
            try:
                self.spool.write(items)
            except (OSError, TypeError, ValueError, msgspec.EncodeError) as exc:
                self._complain("spool", f"msmon: run {self.run_id}: cannot write the spool {self.spool.path} ({exc}); "
                                        "undelivered data is only in memory. Check the disk and bot.spool_dir")
                return
            with self._lock:
                self._q.persisted(self._mono(), len(items), self._mono() - start)

    def _restore(self) -> None:
        items = self.spool.load()
        if self.spool.bad_lines:
            log.warning("msmon: run %s: %d unreadable lines in the spool %s were skipped", self.run_id,
                        self.spool.bad_lines, self.spool.path)
        if not items:
            return
        sized = []
        for item in items:
            with contextlib.suppress(TypeError, ValueError, msgspec.EncodeError):
                sized.append((item, encode(item)))
        with self._lock:
            self._q.restore(sized, self._mono())
        log.info("msmon: run %s: %d items spooled by an earlier start go to the bot first", self.run_id, len(sized))

    # -- HTTP: every outcome is a Reply, nothing raises ---------------------------------------------

    def _exchange(self, path: str, body: bytes, timeout: float, key: str | None = None) -> Reply:
        if self._backend is not None:
            try:
                return self._backend.exchange(path, body, timeout, key)
            except Exception as exc:  # noqa: BLE001 - a backend's bug is a fault like any other
                return Reply(Fault.BUG, detail=f"{type(exc).__name__}: {exc}"[:300])
        try:
            answer = request(self.url + path, body, token=self._token, timeout=timeout)
        except HTTPFailure as exc:
            return Reply(exc.fault, detail=str(exc)[:300])
        fault = judge(answer.status, answer.body)
        detail = "" if fault is None else answer.body[:200].decode("utf-8", "replace").strip()
        return Reply(fault, answer.status, answer.body, answer.headers.get("Retry-After"), detail)

    def _commands(self, cmds: list[Command]) -> None:
        """Hand commands from the bot (a poll's answer) to the job; duplicates are
        expected (at-least-once delivery) and dropped by id where they are applied."""
        if not cmds or self.on_commands is None:
            return
        try:
            self.on_commands(cmds)
        except Exception:  # noqa: BLE001 - the job's handler must not end the thread
            log.exception("msmon: on_commands hook failed")

    def _complain(self, key: str, message: str) -> None:
        if key not in self._complained:
            self._complained.add(key)
            log.error("%s", message)

    def _note(self, thread: str, reply: Reply) -> None:
        """A heartbeat or poll fault: logged once per kind, at WARNING (the sender says the rest)."""
        assert reply.fault is not None
        key = f"{thread}-{reply.fault.value}"
        if key not in self._complained:
            self._complained.add(key)
            what = f"HTTP {reply.status}" if reply.status else reply.fault.value
            log.warning("msmon: run %s: the %s to %s failed (%s: %s); it goes on. %s", self.run_id, thread,
                        self._public_url, what, reply.detail, _ADVICE[reply.fault])

    # -- the heartbeat and command threads ----------------------------------------------------------

    def _heartbeat(self) -> Heartbeat:
        return Heartbeat(run_id=self.run_id, device=self.device, time=self._clock(), step=self.last_step,
                         paused=self.paused, host=self.host, pid=os.getpid(),
                         total_steps=self.total_steps, target_loss=self.target_loss, project=self.project,
                         rank=self.rank, world=self.world, proc=self.proc, seq=next(self._seq),
                         checkpoints=self.checkpoints, attempt=self.attempt)

    def _beat_loop(self) -> None:
        while not self._stop_beats.wait(max(self._last_beat + self.heartbeat_interval - self._mono(), 0.05)):
            if self._mono() - self._last_beat < self.heartbeat_interval * 0.99:
                continue  # an envelope carried one meanwhile
            self._last_beat = self._mono()
            try:
                reply = self._exchange("/v1/heartbeat", encode(self._heartbeat()), min(self.timeout,
                                                                                       self.heartbeat_interval))
                if reply.fault is not None:
                    self._note("heartbeat", reply)  # a missed heartbeat is what the bot watches for
            except Exception:  # noqa: BLE001 - a bug must not end the heartbeats
                self._complain("heartbeat-bug", "msmon: the heartbeat thread hit a bug (please report it); it goes on")

    def _poll_loop(self) -> None:
        """Long-polls the bot for chat commands to this run (at-least-once: the cursor only moves
        once an answer arrived)."""
        failures = 0
        while not self._stop.is_set():
            try:
                wait = self._poll_once()
            except Exception:  # noqa: BLE001 - a bug must not end the command poll
                self._complain("poll-bug", "msmon: the command poll hit a bug (please report it); it goes on")
                wait = None
            if wait == 0.0:
                failures = 0
                continue
            if wait == _AGAIN:
                failures = 0
                self._stop.wait(_AGAIN)
                continue
            failures += 1
            lo, hi = self.backoff
            delay = min(hi, lo * 2.0 ** min(failures - 1, 64)) * (0.5 + self._rng.random())
            self._stop.wait(min(wait if wait is not None else delay, hi * 2))

    def _poll_once(self) -> float | None:
        """One long poll; 0.0 when it worked, else the seconds to wait (None: the usual backoff)."""
        poll = Poll(run_id=self.run_id, device=self.device, after=self._cursor, wait=self.poll_wait,
                    project=self.project)
        start = self._mono()
        reply = self._exchange("/v1/commands/poll", encode(poll), self.poll_wait + 10.0)
        if reply.fault is not None:
            if reply.fault in (Fault.AUTH, Fault.REJECTED):
                self._complain("poll-rejected", f"msmon: run {self.run_id}: the bot refused the command poll "
                                                f"(HTTP {reply.status}: {reply.detail}); chat commands will not "
                                                "reach this job. Check the job's token and the bot's version.")
                return 60.0
            self._note("command poll", reply)
            return retry_after(reply.retry_after, self._clock(), self.backoff[1])
        try:
            answer = decode(reply.body, PollAnswer)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            self._complain("bad-poll", f"msmon: run {self.run_id}: the bot's answer to the command poll cannot be "
                                       f"read ({exc}); is the bot newer than the job's msmon? Commands ignored.")
            return None
        self._cursor = max(self._cursor, answer.cursor)
        self._commands(answer.commands)
        if not answer.commands and self._mono() - start < _AGAIN:
            return _AGAIN  # an empty answer at once: the peer does not long-poll; do not hammer it
        return 0.0

    # -- the end --------------------------------------------------------------------------------

    def flush(self, timeout: float = 10.0) -> bool:
        """Deliver everything now (the sender does, this waits); True if all went out in time."""
        deadline = self._mono() + max(timeout, 0.0)
        self._take_inbox()
        with self._changed:
            self._q.hurry(self._mono())  # once: a refused or failed batch keeps its backoff (no flood at close)
            self._wake.set()
            while self._q.pending() or self._q.unreported():
                left = deadline - self._mono()
                if left <= 0 or self._closed:
                    return False
                self._changed.wait(min(left, 0.05))
        return True

    def close(self, timeout: float = 5.0, final: bool = False) -> None:
        """Deliver what is left within `timeout` seconds, or keep it in the spool for the next start;
        returns in time even when the bot hangs (a request in flight is left to its daemon thread).
        `final`: the job ended normally; a last heartbeat says so (the bot then raises no job_gone)."""
        start = self._mono()
        margin = min(0.25, timeout / 4)
        ok = self.flush(max(timeout - margin, 0.0))
        # The heartbeats end first (one in flight is waited for), so the final one is the last this process sends
        # (its number is the highest too: one overtaken in flight never makes the bot think the rank went on).
        with self._beat_lock:
            self._stop_beats.set()
        self._beater.join(timeout=max(min(self.timeout, timeout - (self._mono() - start)), 0.0))
        if final and ok:
            hb = msgspec.structs.replace(self._heartbeat(), final=True)
            self._exchange("/v1/heartbeat", encode(hb), max(min(self.timeout, timeout - (self._mono() - start)), 0.1))
        self._take_inbox()
        with self._lock:
            self._closed = True
        self._stop.set()
        self._wake.set()

        def left() -> float:
            return max(timeout - margin / 2 - (self._mono() - start), 0.0)

        self._sender.join(timeout=left())
        self._beater.join(timeout=min(left(), 1.0))
        if self._asks:
            self.asks_lost += len(self._asks)
            log.error("msmon: run %s device %s: %d configured action(s) never reached the bot at %s (%s) and are not "
                      "applied", self.run_id, self.device, len(self._asks), self._public_url,
                      ", ".join(f"{r.action} of rule {r.rule} at step {r.step}" for r in self._asks))
        if self._backend is not None:
            self._backend.close(min(left(), 1.0))
        with self._spool_lock:
            with self._lock:
                items = self._q.spool_entries()
            try:
                self.spool.write(items)
            except (OSError, TypeError, ValueError, msgspec.EncodeError) as exc:
                log.error("msmon: run %s: cannot write the spool %s at exit (%s); %d undelivered items are lost",
                          self.run_id, self.spool.path, exc, len(items))
                return
        if not ok or items:
            log.warning("msmon: run %s: the bot at %s did not take everything before exit; %d items stay in %s and "
                        "go out when a job with the same run id and device starts again", self.run_id,
                        self._public_url, len(items), self.spool.path)


__all__ = ["Backend", "BotTransport", "Reply", "Spool", "SpoolRecord", "batch_key", "check_url"]
