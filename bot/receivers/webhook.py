"""The plain webhook receiver (`webhook` in routes): one signed JSON document per alert message.

The body's schema, the signature and the replay window are documented in docs/webhook.md. The
signature is HMAC-SHA256 over `<timestamp>.<body>` with a secret from the environment, sent as
`X-Msmon-Signature: sha256=<hex>` with `X-Msmon-Timestamp: <unix seconds>`; `verify` is the check a
consumer makes (and the tests make). `post_json` and `HttpReceiver` are the HTTP edge the
Alertmanager receivers share: a 429 or 5xx is a DeliveryError (retried, Retry-After honoured),
another 4xx an error of the data (a few tries, then a dead letter), so an outage never loses an alert.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
import msgspec

from bot.receivers import DeliveryError, Message, Note, retry_after

SCHEMA = "msmon.webhook/1"
REPLAY_WINDOW = 300.0  # seconds a consumer accepts a timestamp away from its own clock (docs/webhook.md)
SIGNATURE_HEADER = "X-Msmon-Signature"
TIMESTAMP_HEADER = "X-Msmon-Timestamp"


def sign(secret: bytes, timestamp: str, body: bytes) -> str:
    """The signature header's value: `sha256=` and the hex HMAC-SHA256 of `<timestamp>.<body>`."""
    return "sha256=" + hmac.new(secret, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()


def verify(secret: bytes, headers: Mapping[str, str], body: bytes, now: float,
           window: float = REPLAY_WINDOW) -> str | None:
    """Why a delivery is not msmon's (a missing header, a stale timestamp, a wrong signature), or None."""
    stamp, given = headers.get(TIMESTAMP_HEADER, ""), headers.get(SIGNATURE_HEADER, "")
    if not stamp or not given:
        return f"missing {TIMESTAMP_HEADER} or {SIGNATURE_HEADER}"
    try:
        age = abs(now - int(stamp))
    except ValueError:
        return f"{TIMESTAMP_HEADER} is not a whole number of seconds"
    if age > window:
        return f"timestamp {age:.0f} s away from now (more than the {window:.0f} s replay window)"
    if not hmac.compare_digest(given, sign(secret, stamp, body)):
        return "signature does not match the body"
    return None


async def post_json(url: str, body: bytes, headers: Mapping[str, str] | None = None, timeout: float = 10.0) -> None:
    """POST `body` as JSON; DeliveryError to be retried (no answer, 429, 5xx), or permanent for a refusal (4xx).
    A session per message: alerts are rate-limited to a few a second, and nothing is left open at exit."""
    try:
        async with aiohttp.ClientSession() as session, session.post(
                url, data=body, headers={"Content-Type": "application/json", **(headers or {})},
                timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            if resp.status < 300:
                return
            text = (await resp.text(errors="replace"))[:300]
            if resp.status == 429 or resp.status >= 500:
                raise DeliveryError(f"{url} answered {resp.status}: {text}",
                                    retry_after(resp.headers.get("Retry-After")))
            # A 4xx (but 429) is the receiver refusing this request: the same again cannot succeed (as Alertmanager).
            raise DeliveryError(f"{url} refused the message with {resp.status}: {text}", permanent=True)
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise DeliveryError(f"{url} not reached: {type(exc).__name__}: {exc}") from None


class HttpReceiver:
    """What the HTTP receivers share: a timeout, no charts, and post/update/reply as one `send`."""

    name = "http"
    charts = False

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout

    async def send(self, msg: Message, action: str, ref: str) -> None:
        """Deliver `msg`; `action` is post, update (more devices, resolved) or reply (a reminder, a resolution)."""
        raise NotImplementedError

    async def post(self, channel: str, msg: Message) -> str:
        await self.send(msg, "post", msg.key)
        return msg.key

    async def update(self, channel: str, ref: str, msg: Message) -> None:
        await self.send(msg, "update", ref)

    async def reply(self, channel: str, ref: str, msg: Message) -> None:
        await self.send(msg, "reply", ref)

    async def attach(self, channel: str, ref: str, msg: Message) -> None:
        """Nothing: no chart goes over a webhook."""


def alert_document(msg: Message, action: str, ref: str) -> dict[str, Any]:
    """The JSON of one alert message (docs/webhook.md): who, what, the numbers per device."""
    return {"schema": SCHEMA, "action": action, "ref": ref, "key": msg.key, "run_id": msg.run_id,
            "project": msg.project, "rule": msg.rule, "severity": msg.severity.value, "status": msg.status.value,
            "repeat": msg.repeat, "devices": msg.devices,
            "events": [{"device": e.device, "step": e.step, "time": e.time, "value": e.value,
                        "threshold": e.threshold, "metric": e.metric, "phase": e.phase, "message": e.message,
                        "hint": e.hint} for e in msg.events]}


class WebhookReceiver(HttpReceiver):
    name = "webhook"

    def __init__(self, url: str, secret: str, timeout: float = 10.0, clock: Callable[[], float] = time.time) -> None:
        super().__init__(timeout)
        self.url, self.secret, self.clock = url, secret.encode(), clock

    async def _signed(self, doc: dict[str, Any]) -> None:
        body = msgspec.json.encode(doc)
        stamp = str(int(self.clock()))
        await post_json(self.url, body, {TIMESTAMP_HEADER: stamp,
                                                       SIGNATURE_HEADER: sign(self.secret, stamp, body)}, self.timeout)

    async def send(self, msg: Message, action: str, ref: str) -> None:
        await self._signed(alert_document(msg, action, ref))

    async def note(self, note: Note) -> None:
        await self._signed({"schema": SCHEMA, "action": "note", "text": note.text, "command_id": note.command_id,
                            "thread": note.reply_to.thread})
