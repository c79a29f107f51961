"""The one HTTP client of the job's transport and `msmon cmd`: a JSON POST (or a GET) to the bot, with a
bounded timeout, that either comes back with the bot's answer, whatever its status, or raises
`HTTPFailure` saying which `Fault` kept the answer from arriving. The exceptions of urllib and
http.client are classified here and nowhere else.

Connections are kept alive: each thread keeps one connection per host (the transport's sender, heartbeat and
poll threads each have their own, so a long poll never holds an envelope back), reused while the server
keeps it open; a reused connection the server closed meanwhile (its keep-alive timeout) is opened afresh
once, since nothing was read from it. Where a proxy applies to the URL (`http_proxy` and kin), urllib
sends it as before, a connection per request.

Standard library only (plus the send queue's `Fault`): nothing heavy on the notifier's import path.
The caller checks the URL once (`msmon.common.urls.url_problem`); one that is still unusable here is
`Fault.BAD_URL`.
"""

from __future__ import annotations

import http.client
import threading
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from email.message import Message

from .sendq import Fault


@dataclass(frozen=True)
class Response:
    """A complete HTTP answer: 2xx or not (`judge` or the caller decides what it means)."""

    status: int
    body: bytes
    headers: Message = field(default_factory=Message)  # case-insensitive `.get("Retry-After")`


class HTTPFailure(Exception):
    """No complete answer came back; `fault` says why, the message says what happened."""

    def __init__(self, fault: Fault, cause: BaseException) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.fault = fault
        self.cause = cause


_local = threading.local()  # this thread's open connections: (scheme, host, port) -> HTTPConnection
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ConnectionAbortedError)


def request(url: str, body: bytes | None, *, token: str | None, timeout: float) -> Response:
    """POST the JSON `body` to `url` (GET when it is None), with a bearer `token` if given, waiting at most
    `timeout` seconds for each socket operation. Never raises anything but `HTTPFailure`."""
    headers = {"Content-Type": "application/json"} if body is not None else {}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname or _proxied(parts):
            return _via_urllib(url, body, headers, timeout)
        return _kept_alive(parts, body, headers, timeout)
    except Exception as exc:  # noqa: BLE001 - whatever the network or the peer did, it is a Fault
        raise HTTPFailure(fault_of(exc), exc) from None


def _kept_alive(parts: urllib.parse.SplitResult, body: bytes | None, headers: dict[str, str],
                timeout: float) -> Response:
    key = (parts.scheme, parts.hostname or "", parts.port)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    method = "GET" if body is None else "POST"
    conns: dict[tuple[str, str, int | None], http.client.HTTPConnection] = _local.__dict__.setdefault("conns", {})
    conn = conns.pop(key, None)
    for fresh in ((False, True) if conn is not None else (True,)):
        if fresh:
            cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
            conn = cls(parts.hostname or "", parts.port, timeout=timeout)
        assert conn is not None
        conn.timeout = timeout
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        try:
            conn.request(method, target, body=body, headers=headers)
            resp = conn.getresponse()
        except _STALE:
            conn.close()
            if fresh:
                raise
            continue  # the server closed the kept connection (its keep-alive timeout): nothing was read, try anew
        except BaseException:
            conn.close()
            raise
        try:
            data = resp.read()
        except BaseException:
            conn.close()
            raise
        if resp.will_close:
            conn.close()
        else:
            conns[key] = conn
        return Response(resp.status, data, resp.msg)
    raise AssertionError("unreachable")  # pragma: no cover


def _proxied(parts: urllib.parse.SplitResult) -> bool:
    """Whether urllib would send this URL through a proxy (the environment's http_proxy, no_proxy...)."""
    proxies = urllib.request.getproxies()
    return parts.scheme in proxies and not urllib.request.proxy_bypass(parts.hostname or "")


def _via_urllib(url: str, body: bytes | None, headers: dict[str, str], timeout: float) -> Response:
    req = urllib.request.Request(url, data=body, method="GET" if body is None else "POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - a checked http(s) URL
            return Response(resp.status, resp.read(), resp.headers)
    except urllib.error.HTTPError as exc:  # an answer all the same: 4xx, 5xx, a redirect not followed
        return Response(exc.code, _error_body(exc), exc.headers if exc.headers is not None else Message())


def close_connections() -> None:
    """Close this thread's kept connections (a thread that ends calls it; the OS closes them at exit anyway)."""
    conns = _local.__dict__.pop("conns", {})
    for conn in conns.values():
        conn.close()


def _error_body(exc: urllib.error.HTTPError) -> bytes:
    try:
        return exc.read()
    except Exception:  # noqa: BLE001 - the error page itself is broken: the status is enough
        return b""


def fault_of(exc: BaseException) -> Fault:
    """The fault of a request that raised `exc` instead of answering."""
    if isinstance(exc, urllib.error.URLError) and not isinstance(exc, urllib.error.HTTPError):
        reason = exc.reason
        if isinstance(reason, BaseException):
            return fault_of(reason)
        return Fault.BAD_URL if "unknown url type" in str(reason) else Fault.UNREACHABLE
    if isinstance(exc, TimeoutError):
        return Fault.TIMEOUT
    if isinstance(exc, http.client.IncompleteRead):
        return Fault.TRUNCATED
    if isinstance(exc, OSError):  # refused, reset, closed without a word, no route
        return Fault.UNREACHABLE
    if isinstance(exc, http.client.HTTPException):  # a status line or headers that are not HTTP
        return Fault.NOT_HTTP
    if isinstance(exc, ValueError):  # http.client.InvalidURL and kin
        return Fault.BAD_URL
    return Fault.BUG


__all__ = ["HTTPFailure", "Response", "close_connections", "fault_of", "request"]
