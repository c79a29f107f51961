"""Job -> bot transport: the training thread only appends to bounded deques; two daemon threads
deliver (batches with retries, backoff and jitter, a disk spool while the bot is unreachable) and
send heartbeats. Standard library only: nothing heavy on the notifier's import path.

Priorities, highest first: ERROR events and action results ("high"), WARNING and resolved events
("mid"), metric samples ("low"). When memory or the spool runs out, low goes first, then mid;
high is never dropped. Whatever was dropped is counted and reported in the next envelope.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import socket
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable
from typing import Any

import msgspec

from .wire import ActionResult, Command, Envelope, Event, Heartbeat, Poll, Sample, Severity, encode

log = logging.getLogger("msmon")

KINDS = ("high", "mid", "low")
_NAMES = {"high": "errors and action results", "mid": "warnings", "low": "metric samples"}


class _Rejected(Exception):
    """The bot answered 4xx: retrying the same data would not help (except after a fix of the token)."""

    def __init__(self, code: int, detail: str) -> None:
        super().__init__(f"HTTP {code}: {detail}")
        self.code, self.detail = code, detail


_TAG: dict[type, bytes] = {Event: b"e", Sample: b"s", ActionResult: b"a"}
_FIELD = {b"e": b"events", b"s": b"samples", b"a": b"actions"}


class Spool:
    """Append-only JSONL files per priority under `directory`, bounded in bytes (high excepted)."""

    def __init__(self, directory: str, stem: str, max_bytes: int) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        os.makedirs(directory, exist_ok=True)
        self.paths = {k: os.path.join(directory, f"{stem}.{k}.jsonl") for k in KINDS}

    def size(self, kind: str | None = None) -> int:
        kinds = KINDS if kind is None else (kind,)
        return sum(os.path.getsize(self.paths[k]) for k in kinds if os.path.exists(self.paths[k]))

    def append(self, kind: str, items: list[bytes]) -> dict[str, int]:
        """Write items (one JSON line each); returns what was dropped to stay in bounds."""
        with open(self.paths[kind], "ab") as f:
            for item in items:
                f.write(item + b"\n")
            f.flush()
            os.fsync(f.fileno())
        dropped: dict[str, int] = {}
        for victim in ("low", "mid"):  # high (ERRORs, action results) is never dropped
            if self.size() <= self.max_bytes:
                break
            n = self.count(victim)
            if n:
                os.remove(self.paths[victim])
                dropped[victim] = n
        return dropped

    def count(self, kind: str) -> int:
        path = self.paths[kind]
        if not os.path.exists(path):
            return 0
        with open(path, "rb") as f:
            return sum(1 for _ in f)

    def read(self, kind: str) -> list[bytes]:
        path = self.paths[kind]
        if not os.path.exists(path):
            return []
        with open(path, "rb") as f:
            return [line.rstrip(b"\n") for line in f if line.strip()]

    def clear(self, kind: str) -> None:
        if os.path.exists(self.paths[kind]):
            os.remove(self.paths[kind])

    def empty(self) -> bool:
        return self.size() == 0


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
        batch_max: int = 500,
        flush_interval: float = 1.0,
        heartbeat_interval: float = 5.0,
        timeout: float = 5.0,
        backoff: tuple[float, float] = (0.5, 30.0),
        on_commands: Callable[[list[Command]], None] | None = None,
        poll_wait: float = 20.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.url = url.rstrip("/")
        self.run_id, self.device = run_id, str(device)
        self._token = token
        self.project, self.labels = project, dict(labels or {})
        self.max_queue, self.batch_max = max_queue, batch_max
        self.flush_interval, self.heartbeat_interval = flush_interval, heartbeat_interval
        self.timeout, self.backoff = timeout, backoff
        self.on_commands = on_commands
        self.poll_wait = poll_wait
        self._cursor = 0  # the bot's command sequence number this job has seen up to
        self._clock = clock
        self._q: dict[str, deque[Any]] = {k: deque() for k in KINDS}
        self.dropped: dict[str, int] = {}
        self.delivered = 0
        self.last_step: int | None = None
        self.paused = False
        self.total_steps: int | None = None  # the run's plan, sent with heartbeats (set by the Monitor)
        self.target_loss: float | None = None
        self.connected: bool | None = None  # None until the first attempt
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in f"{run_id}-{device}")
        self.spool = Spool(spool_dir, safe, spool_max_bytes)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()  # one delivery at a time (sender thread, close())
        self._complained: set[str] = set()
        self._retry_after: float | None = None
        self._sender = threading.Thread(target=self._send_loop, name="msmon-sender", daemon=True)
        self._beater = threading.Thread(target=self._beat_loop, name="msmon-heartbeat", daemon=True)
        self._sender.start()
        self._beater.start()
        self._poller: threading.Thread | None = None

    def listen(self, on_commands: Callable[[list[Command]], None]) -> None:
        """Take chat commands: long-poll the bot for them from a thread of their own and hand each
        batch to `on_commands` (which must only queue them: it runs on that thread)."""
        self.on_commands = on_commands
        if self._poller is None:
            self._poller = threading.Thread(target=self._poll_loop, name="msmon-commands", daemon=True)
            self._poller.start()

    # -- the training thread: O(1), never blocks, never raises ------------------------------

    def event(self, ev: Event) -> None:
        high = ev.severity is Severity.ERROR and ev.status.value == "firing"
        self._put("high" if high else "mid", ev)
        if high:
            self._wake.set()  # an ERROR goes out now, not at the next flush

    def sample(self, s: Sample) -> None:
        self._put("low", s)

    def action(self, r: ActionResult) -> None:
        self._put("high", r)
        self._wake.set()

    def progress(self, step: int, paused: bool = False) -> None:
        self.last_step = step
        self.paused = paused

    def _put(self, kind: str, item: Any) -> None:
        q = self._q
        if len(q["high"]) + len(q["mid"]) + len(q["low"]) >= self.max_queue:
            victim = "low" if q["low"] else "mid" if q["mid"] and kind != "low" else None
            if victim is None:
                if kind != "high":
                    self._count_drop(kind, 1)
                    return
            else:
                q[victim].popleft()
                self._count_drop(victim, 1)
        q[kind].append(item)

    def _count_drop(self, kind: str, n: int) -> None:
        name = {"high": "errors", "mid": "warnings", "low": "samples"}[kind]
        self.dropped[name] = self.dropped.get(name, 0) + n
        if kind == "high":
            log.error("msmon: run %s lost %d ERROR events or action results (see the log above for why)",
                      self.run_id, n)

    # -- delivery -------------------------------------------------------------------------------

    def _take(self) -> dict[str, list[Any]]:
        batch: dict[str, list[Any]] = {k: [] for k in KINDS}
        room = self.batch_max
        for k in KINDS:
            q = self._q[k]
            while q and room:
                batch[k].append(q.popleft())
                room -= 1
        return batch

    def _envelope(self, batch: dict[str, list[Any]], heartbeat: bool = False) -> Envelope:
        # Sent by priority, but listed in the order they happened: the bot's inhibit stage must see a
        # WARNING that came first before the ERROR that followed it.
        events = sorted((x for x in batch["high"] + batch["mid"] if isinstance(x, Event)), key=lambda e: e.step)
        actions = [x for x in batch["high"] if isinstance(x, ActionResult)]
        env = Envelope(run_id=self.run_id, device=self.device, sent_at=self._clock(), project=self.project,
                       labels=self.labels, events=events, samples=list(batch["low"]), actions=actions,
                       dropped=dict(self.dropped))
        if heartbeat:
            env.heartbeats.append(self._heartbeat())
        return env

    def _heartbeat(self) -> Heartbeat:
        return Heartbeat(run_id=self.run_id, device=self.device, time=self._clock(), step=self.last_step,
                         paused=self.paused, host=socket.gethostname(), pid=os.getpid(),
                         total_steps=self.total_steps, target_loss=self.target_loss)

    def _post(self, path: str, body: bytes, timeout: float | None = None) -> dict[str, Any]:
        req = urllib.request.Request(self.url + path, data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
        if self._token:
            req.add_header("Authorization", f"Bearer {self._token}")
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.timeout) as resp:  # noqa: S310 - configured URL
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:300].decode("utf-8", "replace")
            if exc.code == 429 or exc.code >= 500:
                retry = exc.headers.get("Retry-After")
                raise ConnectionError(f"HTTP {exc.code} {detail}", float(retry) if retry else None) from None
            raise _Rejected(exc.code, detail) from None
        try:
            answer = json.loads(raw) if raw else {}
        except ValueError:
            answer = {}
        return answer if isinstance(answer, dict) else {}

    def _deliver(self, env: Envelope) -> None:
        answer = self._post("/v1/ingest", encode(env))
        for name, n in env.dropped.items():  # reported: start counting afresh
            left = self.dropped.get(name, 0) - n
            if left > 0:
                self.dropped[name] = left
            else:
                self.dropped.pop(name, None)
        if env.dropped:
            log.warning("msmon: run %s device %s: the bot is reachable again; %s were dropped while it was not",
                        self.run_id, self.device, ", ".join(f"{n} {k}" for k, n in env.dropped.items()))
        self.delivered += len(env.events) + len(env.samples) + len(env.actions)
        self._commands(answer.get("commands"))

    def _commands(self, raw: Any) -> None:
        """Hand commands from the bot (a poll's or an ingest's answer) to the job; duplicates are
        expected (at-least-once delivery) and dropped by id where they are applied."""
        if not raw or self.on_commands is None:
            return
        try:
            cmds = msgspec.convert(raw, list[Command])
        except msgspec.ValidationError as exc:
            self._complain("bad-commands", f"msmon: run {self.run_id}: the bot sent commands this notifier cannot "
                                           f"read ({exc}); is the bot newer than the job's msmon? Commands ignored.")
            return
        try:
            self.on_commands(cmds)
        except Exception:  # noqa: BLE001 - the job's handler must not end the thread
            log.exception("msmon: on_commands hook failed")

    def _poll_loop(self) -> None:
        """Long-polls the bot for chat commands to this run (at-least-once: the cursor only moves
        once an answer arrived)."""
        delay = self.backoff[0]
        while not self._stop.is_set():
            poll = Poll(run_id=self.run_id, device=self.device, after=self._cursor, wait=self.poll_wait)
            try:
                answer = self._post("/v1/commands/poll", encode(poll), timeout=self.poll_wait + 10.0)
            except _Rejected as exc:
                self._complain("poll-rejected", f"msmon: run {self.run_id}: the bot refused the command poll "
                                                f"(HTTP {exc.code}: {exc.detail}); chat commands will not reach "
                                                "this job. Check the job's token and the bot's version.")
                self._stop.wait(60.0)
                continue
            except Exception:  # noqa: BLE001 - unreachable: try again later, as the sender does
                self._stop.wait(delay * (0.5 + random.random()))
                delay = min(delay * 2.0, self.backoff[1])
                continue
            delay = self.backoff[0]
            cursor = answer.get("cursor")
            if isinstance(cursor, int):
                self._cursor = max(self._cursor, cursor)
            self._commands(answer.get("commands"))

    def _drain_spool(self) -> None:
        """Deliver what was spooled, most important first; stops at the first failure. Items keep
        their wire encoding on disk (a type tag, then the item's JSON) and are sent as envelopes."""
        for kind in KINDS:
            lines = self.spool.read(kind)
            if not lines:
                continue
            for i in range(0, len(lines), self.batch_max):
                chunk = lines[i:i + self.batch_max]
                parts: dict[bytes, list[bytes]] = {b"events": [], b"samples": [], b"actions": []}
                for line in chunk:
                    field = _FIELD.get(line[:1])
                    if field is not None:
                        parts[field].append(line[1:])
                head = encode(Envelope(run_id=self.run_id, device=self.device, sent_at=self._clock(),
                                       project=self.project, labels=self.labels))[:-1]
                body = head + b"".join(b',"%s":[%s]' % (f, b",".join(v)) for f, v in parts.items() if v) + b"}"
                try:
                    self._post("/v1/ingest", body)
                except _Rejected as exc:
                    if exc.code in (401, 403):
                        raise
                    self._complain(f"bad-{kind}", f"msmon: the bot refused {len(chunk)} spooled {_NAMES[kind]} of "
                                   f"run {self.run_id} as invalid ({exc}); they are dropped")
                    self._count_drop(kind, len(chunk))
                self.delivered += len(chunk)
            self.spool.clear(kind)

    def _spool_batch(self, batch: dict[str, list[Any]]) -> None:
        for kind in KINDS:
            items = batch[kind]
            if items:
                lost = self.spool.append(kind, [_TAG[type(x)] + encode(x) for x in items])
                for k, n in lost.items():
                    self._count_drop(k, n)

    def _once(self, heartbeat: bool = False) -> bool:
        """One delivery attempt of the spool and the queues; False if the bot was unreachable."""
        with self._lock:
            batch = self._take()
            try:
                if not self.spool.empty():
                    self._drain_spool()
                env = self._envelope(batch, heartbeat)
                if env.events or env.samples or env.actions or env.heartbeats or env.dropped:
                    self._deliver(env)
                    while any(self._q.values()):
                        self._deliver(self._envelope(self._take()))
            except _Rejected as exc:
                if exc.code in (401, 403):
                    self._complain("auth", f"msmon: the bot at {self.url} refused run {self.run_id}: {exc}. Check the "
                                   "job token (the environment variable named by bot.token_env); data is kept in "
                                   f"{self.spool.directory} until it is accepted")
                    self._spool_batch(batch)
                    self.connected = False
                    self._retry_after = None
                    return False
                self._complain("invalid", f"msmon: the bot at {self.url} refused a batch from run {self.run_id} as "
                               f"invalid ({exc}); it is dropped. This is a bug: please report it")
                for kind in KINDS:
                    if batch[kind]:
                        self._count_drop(kind, len(batch[kind]))
                return True
            except (OSError, ConnectionError) as exc:
                retry_after = exc.args[1] if len(exc.args) > 1 and isinstance(exc.args[1], float) else None
                self._spool_batch(batch)
                if self.connected is not False:
                    log.warning("msmon: cannot reach the bot at %s (%s); run %s keeps training and spools to %s",
                                self.url, exc.args[0] if exc.args else exc, self.run_id, self.spool.directory)
                self.connected = False
                self._retry_after = retry_after
                return False
        if self.connected is False:
            log.info("msmon: delivering to the bot at %s again", self.url)
        self.connected = True
        return True

    def _complain(self, key: str, message: str) -> None:
        if key not in self._complained:
            self._complained.add(key)
            log.error("%s", message)

    def _send_loop(self) -> None:
        delay = self.backoff[0]
        while not self._stop.is_set():
            self._wake.wait(self.flush_interval)
            self._wake.clear()
            if self._stop.is_set():
                break
            if not any(self._q.values()) and self.spool.empty() and not self.dropped:
                continue
            if self._once():
                delay = self.backoff[0]
                continue
            wait = self._retry_after if self._retry_after is not None else delay * (0.5 + random.random())
            delay = min(delay * 2.0, self.backoff[1])
            self._stop.wait(wait)

    def _beat_loop(self) -> None:
        while not self._stop.wait(self.heartbeat_interval):
            with contextlib.suppress(Exception):  # a missed heartbeat is what the bot watches for
                self._post("/v1/heartbeat", encode(self._heartbeat()))

    def flush(self, timeout: float = 10.0) -> bool:
        """Try to deliver everything now (from the calling thread); True if all went out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._once() and not any(self._q.values()) and self.spool.empty():
                return True
            time.sleep(min(0.2, max(deadline - time.monotonic(), 0)))
        return False

    def close(self, timeout: float = 5.0) -> None:
        """Stop the threads; deliver what is left, or keep it in the spool for the next start."""
        ok = self.flush(timeout)
        self._stop.set()
        self._wake.set()
        self._sender.join(timeout=timeout)
        self._beater.join(timeout=1.0)
        if not ok:
            with self._lock:
                self._spool_batch(self._take())
            log.warning("msmon: run %s: the bot was not reachable at exit; undelivered data stays in %s and "
                        "goes out when a job with the same run id and device starts again", self.run_id,
                        self.spool.directory)


__all__ = ["BotTransport", "Spool"]
