"""What went wrong with one request to the bot, as far as the job can tell: the `Fault` kinds, and
`judge`, which reads the fault in a complete HTTP answer.

Pure code: the send queue (`notifier.sendq`) decides by these what a failure does, the HTTP client
(`notifier.http`) and the NATS backend say which one kept an answer from arriving.
"""

from __future__ import annotations

import enum

import msgspec


class Fault(str, enum.Enum):
    """What went wrong with one request, as far as the job can tell."""

    UNREACHABLE = "unreachable"  # refused, reset, DNS, no route
    TIMEOUT = "timeout"  # no answer within the timeout
    NOT_HTTP = "not-http"  # the peer answered something that is not HTTP
    TRUNCATED = "truncated"  # the answer's body ended early
    BAD_ANSWER = "bad-answer"  # 2xx, but not the bot's JSON object: a proxy, a captive portal
    SERVER = "server-error"  # 5xx
    RATE_LIMITED = "rate-limited"  # 429
    AUTH = "auth"  # 401 / 403: the job's token
    TOO_LARGE = "too-large"  # 413: the batch is over the bot's byte limit
    REJECTED = "rejected"  # any other 4xx: the bot refuses the data itself
    BAD_URL = "bad-url"  # the configured URL cannot be used
    BUG = "bug"  # anything else: contained, retried

    @property
    def refuses_data(self) -> bool:
        """The bot looked at this batch and will not take it: retrying it whole cannot help."""
        return self in (Fault.TOO_LARGE, Fault.REJECTED)


def judge(status: int, body: bytes) -> Fault | None:
    """The fault in a complete HTTP answer, or None when the bot accepted the request."""
    if 200 <= status < 300:
        try:
            answer = msgspec.json.decode(body)
        except msgspec.DecodeError:
            return Fault.BAD_ANSWER
        return None if isinstance(answer, dict) else Fault.BAD_ANSWER
    if status in (401, 403):
        return Fault.AUTH
    if status == 413:
        return Fault.TOO_LARGE
    if status == 429:
        return Fault.RATE_LIMITED
    if 400 <= status < 500:
        return Fault.REJECTED
    return Fault.SERVER  # 5xx, and 1xx/3xx the client did not follow: try again later


__all__ = ["Fault", "judge"]
