"""The one HTTP client of the job's transport and `msmon cmd`: a JSON POST (or a GET) to the bot, with a
bounded timeout, that either comes back with the bot's answer, whatever its status, or raises
`HTTPFailure` saying which `Fault` kept the answer from arriving. The exceptions of urllib and
http.client are classified here and nowhere else.

Standard library only (plus the send queue's `Fault`): nothing heavy on the notifier's import path.
The caller checks the URL once (`msmon.common.urls.url_problem`); one that is still unusable here is
`Fault.BAD_URL`.
"""

from __future__ import annotations

import http.client
import urllib.error
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


def request(url: str, body: bytes | None, *, token: str | None, timeout: float) -> Response:
    """POST the JSON `body` to `url` (GET when it is None), with a bearer `token` if given, waiting at most
    `timeout` seconds for each socket operation. Never raises anything but `HTTPFailure`."""
    try:
        req = urllib.request.Request(url, data=body, method="GET" if body is None else "POST")
        if body is not None:
            req.add_header("Content-Type", "application/json")
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - a checked http(s) URL
                return Response(resp.status, resp.read(), resp.headers)
        except urllib.error.HTTPError as exc:  # an answer all the same: 4xx, 5xx, a redirect not followed
            return Response(exc.code, _error_body(exc), exc.headers if exc.headers is not None else Message())
    except Exception as exc:  # noqa: BLE001 - whatever the network or the peer did, it is a Fault
        raise HTTPFailure(fault_of(exc), exc) from None


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


__all__ = ["HTTPFailure", "Response", "fault_of", "request"]
