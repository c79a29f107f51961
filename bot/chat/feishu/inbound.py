"""Feishu/Lark's way in: an app bot's event subscription (`POST /feishu/events`), the group message
`@msmon pause run-42` as `im.message.receive_v1` (schema 2.0).

Checked as Feishu's event subscription guide says, before anything is acted on, in this order: with an
Encrypt Key, the request's signature first (`X-Lark-Signature` = hex SHA-256 of timestamp + nonce +
Encrypt Key + the raw body) and its `X-Lark-Request-Timestamp` inside a 5-minute window, and only then the
body is decrypted (`{"encrypt": ...}`: AES-256-CBC, the key SHA-256 of the Encrypt Key, the IV the first
16 bytes); the Verification Token in the event must match. Every refusal is the same 401 with one reason
(the cause is only logged), so nothing answers whether a forged ciphertext's padding was good. Feishu
does not sign its url_verification challenge: an unsigned request is decrypted only to be that
challenge. An event_id counts once, remembered in the store for a day (Feishu pushes an unanswered event
again, up to 6 hours later), across restarts. Without an Encrypt Key Feishu signs nothing: the
Verification Token alone says the event is Feishu's (docs/security.md). A bot without a Verification
Token refuses everything. The sender is `feishu:<open_id>` in `commands.allow`; the answer goes through
the outbox to the Feishu receiver, with the chat and the message in its ReplyTo.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import logging
import os
import re
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from bot.chat.replay import ReplayGuard
from bot.commands import jobs
from bot.commands.origin import Origin
from bot.commands.service import CommandService
from bot.config import BotConfig
from bot.receivers import ReplyTo

log = logging.getLogger("msmon.bot")

ROUTE = "/feishu/events"
_MENTION_KEY = re.compile(r"@_user_\d+")


class Refused(Exception):
    """A request that is not Feishu's; answered 401 with REFUSED whatever the cause (logged only)."""


REFUSED = "not a Feishu event for this bot (signature, timestamp, encryption or verification token)"
SIGNED_WINDOW = 300.0  # seconds between X-Lark-Request-Timestamp and the bot's clock
EVENT_MEMORY = 86_400.0  # seconds an event_id is remembered (Feishu re-pushes at 15 s, 5 min, 1 h and 6 h)
MAX_COMMAND = 4000  # characters of a command message's text; a longer one is not a command


def decrypt(encrypt: str, encrypt_key: str) -> bytes:
    """An encrypted event's plaintext: base64, then AES-256-CBC with SHA-256(Encrypt Key), IV first."""
    try:
        raw = base64.b64decode(encrypt, validate=True)
    except (binascii.Error, ValueError):
        raise Refused("the encrypt field is not base64") from None
    if len(raw) < 32 or len(raw) % 16:
        raise Refused("the encrypt field is not AES-CBC ciphertext (IV and whole blocks)")
    try:  # the [feishu] extra: only a bot that takes Feishu's encrypted events needs it
        from cryptography.hazmat.primitives import padding
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
    except ImportError:
        log.error("msmon bot: a Feishu event is encrypted (an Encrypt Key is set) and this bot lacks the "
                  "cryptography package: pip install 'msmon[feishu]'")
        raise Refused("this bot cannot decrypt events: install msmon[feishu]") from None
    key = hashlib.sha256(encrypt_key.encode()).digest()
    dec = Cipher(algorithms.AES(key), modes.CBC(raw[:16])).decryptor()
    unpadder = padding.PKCS7(128).unpadder()
    try:
        return unpadder.update(dec.update(raw[16:]) + dec.finalize()) + unpadder.finalize()
    except ValueError:
        raise Refused("the event does not decrypt with this bot's Encrypt Key") from None


def signature(timestamp: str, nonce: str, encrypt_key: str, body: bytes) -> str:
    """X-Lark-Signature: hex SHA-256 of timestamp + nonce + Encrypt Key + the raw body."""
    return hashlib.sha256((timestamp + nonce + encrypt_key).encode() + body).hexdigest()


def command_text(content: str, prefix: str = "/msmon") -> str:
    """The command in a text message's `content` JSON: the @-mention keys (`@_user_1`) and a leading
    `/msmon` removed."""
    try:
        text = json.loads(content).get("text", "")
    except (ValueError, AttributeError, RecursionError):
        return ""
    text = _MENTION_KEY.sub(" ", str(text)).strip()
    return text[len(prefix):].strip() if text.startswith(prefix) else text


def _json_object(raw: bytes | str, what: str) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        raise Refused(f"{what} is not JSON") from None
    if not isinstance(value, dict):
        raise Refused(f"{what} is not a JSON object")
    return value


class FeishuInbound:
    def __init__(self, svc: CommandService, token: str | None, encrypt_key: str | None,
                 replays: ReplayGuard, clock: Callable[[], float] = time.time) -> None:
        self.svc, self.token, self.encrypt_key, self.replays, self.clock = svc, token, encrypt_key, replays, clock

    def _signed(self, headers: Any, body: bytes) -> bool:
        """Whether the request carries a signature; Refused when it is wrong or outside the window (checked
        on the raw body, before anything is decrypted)."""
        assert self.encrypt_key
        given = headers.get("X-Lark-Signature", "")
        if not given:
            return False
        ts, nonce = headers.get("X-Lark-Request-Timestamp", ""), headers.get("X-Lark-Request-Nonce", "")
        if not hmac.compare_digest(given.encode("utf-8", "replace"),
                                   signature(ts, nonce, self.encrypt_key, body).encode()):
            raise Refused("invalid X-Lark-Signature")
        if not (ts.isascii() and ts.isdigit() and len(ts) <= 12) or abs(self.clock() - int(ts)) > SIGNED_WINDOW:
            raise Refused(f"X-Lark-Request-Timestamp {ts[:20]!r} is not within {SIGNED_WINDOW:.0f} s of the clock")
        return True

    def _plain(self, headers: Any, body: bytes) -> dict[str, Any]:
        """The event as JSON; with an Encrypt Key: its signature and timestamp checked, then decrypted (an
        unsigned request may only be the url_verification challenge)."""
        outer = _json_object(body, "the body")
        if not self.encrypt_key:
            if "encrypt" in outer:
                raise Refused("an encrypted event, and this bot has no Encrypt Key (feishu.encrypt_key_env)")
            return outer
        signed = self._signed(headers, body)
        if not isinstance(outer.get("encrypt"), str) or len(outer["encrypt"]) > (4096 if not signed else 1 << 24):
            raise Refused("this bot has an Encrypt Key: events must be encrypted")
        plain = _json_object(decrypt(outer["encrypt"], self.encrypt_key), "the decrypted event")
        if not signed and plain.get("type") != "url_verification":
            raise Refused("an unsigned event (only the url_verification challenge comes unsigned)")
        return plain

    def _check_token(self, given: Any) -> None:
        if not (self.token and isinstance(given, str)
                and hmac.compare_digest(given.encode("utf-8", "replace"), self.token.encode())):
            raise Refused("invalid verification token")

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        try:
            if not self.token:
                raise Refused("this bot has no Feishu Verification Token (feishu.verification_token_env); it "
                              "refuses every event")
            event = self._plain(request.headers, body)
            if event.get("type") == "url_verification":
                self._check_token(event.get("token"))
                return web.json_response({"challenge": str(event.get("challenge", ""))[:1024]})
            header = _object(event.get("header"))
            self._check_token(header.get("token"))
        except Refused as exc:
            log.warning("msmon bot: refused a Feishu event from %s: %s", request.remote, exc)
            raise web.HTTPUnauthorized(reason=REFUSED) from None
        if header.get("event_type") == "im.message.receive_v1":
            self._message(header, _object(event.get("event")))
        return web.json_response({"msg": "success"})

    def _message(self, header: dict[str, Any], ev: dict[str, Any]) -> None:
        msg = _object(ev.get("message"))
        sender = _object(_object(ev.get("sender")).get("sender_id"))
        open_id = str(sender.get("open_id") or "")[:256]
        if msg.get("message_type") != "text" or not open_id:
            return
        event_id = str(header.get("event_id") or msg.get("message_id") or "")[:256]
        # Remembered from when it came (never from the event's own create_time, which Feishu keeps on a re-push)
        if not self.replays.first("feishu:" + event_id, int(self.clock())):
            log.info("msmon bot: Feishu pushed event %s again; it was taken once, nothing is done twice", event_id)
            return
        reply_to = ReplyTo(channel=str(msg.get("chat_id") or "")[:256], thread=str(msg.get("message_id") or "")[:256])
        origin = Origin(source="feishu", user=f"feishu:{open_id}", receiver="feishu", reply_to=reply_to)
        content = str(msg.get("content") or "")
        text = command_text(content) if len(content) <= 4 * MAX_COMMAND else content
        if len(text) > MAX_COMMAND:
            log.info("msmon bot: ignored a Feishu message of %d characters from %s (not a command)",
                     len(content), origin.who)
            return
        answer = self.svc.submit(text, origin)
        jobs.note(self.svc.state, origin, f"{origin.who}: {answer.text}", private=answer.private)


def _object(value: Any) -> dict[str, Any]:
    """`value` when it is a JSON object, else an empty one (a field Feishu did not send, or sent otherwise)."""
    return value if isinstance(value, dict) else {}


def add_feishu_routes(app: web.Application, cfg: BotConfig, svc: CommandService,
                      clock: Callable[[], float] = time.time) -> FeishuInbound | None:
    """POST /feishu/events, when a route or the config names Feishu (a Verification Token set)."""
    token = os.environ.get(cfg.feishu.verification_token_env) or None
    if token is None:
        return None
    replays = ReplayGuard(clock, window=EVENT_MEMORY, persist=svc.store.commands.first_signed)
    inbound = FeishuInbound(svc, token, os.environ.get(cfg.feishu.encrypt_key_env) or None, replays, clock)
    app.router.add_post(ROUTE, inbound.handle)
    return inbound
