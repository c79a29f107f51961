"""The transport's one way to the bot: every request of its threads, over HTTP or through a `Backend`,
comes back as a `Reply` and never raises; and each kind of trouble is said once.

Also who sends (`Origin`: the run, the device, the rank in its world, the host), in every envelope,
heartbeat, poll and action request.
"""

from __future__ import annotations

import logging
import socket
from dataclasses import dataclass, field
from typing import Protocol

from msmon.common.urls import redacted, url_problem

from ..http import HTTPFailure, request
from ..sendq.faults import Fault, judge

log = logging.getLogger("msmon")

ADVICE = {
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


@dataclass(frozen=True)
class Origin:
    """Who sends, in every envelope and heartbeat (the bot's view across ranks): the run and device, the project and
    labels, the rank in the job's world (notifier.world; None for a single process) and the host."""

    run_id: str
    device: str
    project: str = "default"
    labels: dict[str, str] = field(default_factory=dict)
    rank: int | None = None
    world: int | None = None
    host: str = ""

    @classmethod
    def of(cls, run_id: str, device: str, project: str, labels: dict[str, str] | None, rank: int | None,
           world: int | None, host: str | None) -> Origin:
        """The origin from a transport's arguments: a rank or world out of range is None, the host at most 256."""
        return cls(run_id, str(device), project, dict(labels or {}),
                   rank if rank is None or 0 <= rank <= 2**31 - 1 else None,
                   world if world is None or 1 <= world <= 2**31 else None,
                   (socket.gethostname() if host is None else host)[:256])


class Link:
    """The requests of the transport's threads and what they say about trouble (each kind once)."""

    def __init__(self, url: str, token: str | None, backend: Backend | None, run_id: str) -> None:
        # `backend`: where requests go instead of HTTP to `url` (notifier/nats_transport.py); it checks its URL
        self._backend = backend
        self.url = check_url(url) if backend is None else url
        self.public_url = redacted(self.url)
        self._token = token
        self._run_id = run_id
        self._complained: set[str] = set()

    @property
    def has_backend(self) -> bool:
        return self._backend is not None

    def exchange(self, path: str, body: bytes, timeout: float, key: str | None = None) -> Reply:
        """POST `body` to the bot's `path` (`key`: a backend's dedup key); every outcome is a Reply."""
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

    def close(self, timeout: float) -> None:
        """Close the backend, if there is one."""
        if self._backend is not None:
            self._backend.close(timeout)

    def once(self, key: str) -> bool:
        """True the first time `key` comes: the trouble it names is to be said now, and never again."""
        if key in self._complained:
            return False
        self._complained.add(key)
        return True

    def complain(self, key: str, message: str) -> None:
        """Log `message` as an ERROR, the first time `key` comes."""
        if self.once(key):
            log.error("%s", message)

    def note(self, thread: str, reply: Reply) -> None:
        """A heartbeat or poll fault: logged once per kind, at WARNING (the sender says the rest)."""
        assert reply.fault is not None
        if self.once(f"{thread}-{reply.fault.value}"):
            what = f"HTTP {reply.status}" if reply.status else reply.fault.value
            log.warning("msmon: run %s: the %s to %s failed (%s: %s); it goes on. %s", self._run_id, thread,
                        self.public_url, what, reply.detail, ADVICE[reply.fault])


__all__ = ["ADVICE", "Backend", "Link", "Origin", "Reply", "check_url"]
