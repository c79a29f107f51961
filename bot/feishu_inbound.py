"""Feishu/Lark's way in: an app bot's event subscription (`POST /feishu/events`), the group message
`@msmon pause run-42` as `im.message.receive_v1` (schema 2.0).

Checked as Feishu's event subscription guide says, before anything is acted on: with an Encrypt Key,
the body is `{"encrypt": ...}` (AES-256-CBC, the key SHA-256 of the Encrypt Key, the IV the first 16
bytes) and the request is signed (`X-Lark-Signature` = hex SHA-256 of timestamp + nonce + Encrypt Key +
body); the Verification Token in the event (or in the url_verification challenge) must match; an
event_id counts once (Feishu pushes an event again when it got no 200 in time). A bot without a
Verification Token refuses everything. The sender is `feishu:<open_id>` in `commands.allow`; the answer
goes through the outbox to the Feishu receiver, with the chat and the message in its ReplyTo.
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
from cryptography.hazmat.primitives import padding
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from .commands import jobs
from .commands.origin import Origin
from .commands.service import CommandService
from .config import BotConfig
from .receivers import ReplyTo
from .slack_inbound import ReplayGuard

log = logging.getLogger("msmon.bot")

ROUTE = "/feishu/events"
WINDOW = 3600.0  # seconds an event_id is remembered in memory (Feishu retries within the hour, then at 6 h)
_MENTION_KEY = re.compile(r"@_user_\d+")


class Refused(Exception):
    """A request that is not Feishu's (the message says why); answered 401."""


def decrypt(encrypt: str, encrypt_key: str) -> bytes:
    """An encrypted event's plaintext: base64, then AES-256-CBC with SHA-256(Encrypt Key), IV first."""
    try:
        raw = base64.b64decode(encrypt, validate=True)
    except (binascii.Error, ValueError):
        raise Refused("the encrypt field is not base64") from None
    if len(raw) < 32 or len(raw) % 16:
        raise Refused("the encrypt field is not AES-CBC ciphertext (IV and whole blocks)")
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
    except (ValueError, AttributeError):
        return ""
    text = _MENTION_KEY.sub(" ", str(text)).strip()
    return text[len(prefix):].strip() if text.startswith(prefix) else text


class FeishuInbound:
    def __init__(self, svc: CommandService, token: str | None, encrypt_key: str | None,
                 replays: ReplayGuard) -> None:
        self.svc, self.token, self.encrypt_key, self.replays = svc, token, encrypt_key, replays

    def _plain(self, headers: Any, body: bytes) -> dict[str, Any]:
        """The event as JSON, decrypted and its signature checked when the bot has an Encrypt Key."""
        try:
            outer = json.loads(body)
        except (ValueError, RecursionError):
            raise web.HTTPBadRequest(reason="not an event: the body is not JSON") from None
        if not isinstance(outer, dict):
            raise web.HTTPBadRequest(reason="not an event: the body is not a JSON object")
        if self.encrypt_key:
            if "encrypt" not in outer:
                raise Refused("this bot has an Encrypt Key: events must be encrypted")
            try:
                plain = json.loads(decrypt(str(outer["encrypt"]), self.encrypt_key))
            except (ValueError, RecursionError):
                raise Refused("the decrypted event is not JSON") from None
            if not isinstance(plain, dict):
                raise Refused("the decrypted event is not a JSON object")
            if plain.get("type") != "url_verification":
                ts, nonce = headers.get("X-Lark-Request-Timestamp", ""), headers.get("X-Lark-Request-Nonce", "")
                given = headers.get("X-Lark-Signature", "")
                if not hmac.compare_digest(given.encode(), signature(ts, nonce, self.encrypt_key, body).encode()):
                    raise Refused("invalid X-Lark-Signature")
            return plain
        if "encrypt" in outer:
            raise Refused("an encrypted event, and this bot has no Encrypt Key (feishu.encrypt_key_env)")
        return outer

    def _check_token(self, given: Any) -> None:
        if not (self.token and isinstance(given, str) and hmac.compare_digest(given.encode(), self.token.encode())):
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
                return web.json_response({"challenge": str(event.get("challenge", ""))})
            header = _object(event.get("header"))
            self._check_token(header.get("token"))
        except Refused as exc:
            log.warning("msmon bot: refused a Feishu event from %s: %s", request.remote, exc)
            raise web.HTTPUnauthorized(reason=str(exc)) from None
        if header.get("event_type") == "im.message.receive_v1":
            self._message(header, _object(event.get("event")))
        return web.json_response({"msg": "success"})

    def _message(self, header: dict[str, Any], ev: dict[str, Any]) -> None:
        msg = _object(ev.get("message"))
        sender = _object(_object(ev.get("sender")).get("sender_id"))
        open_id = str(sender.get("open_id") or "")
        if msg.get("message_type") != "text" or not open_id:
            return
        event_id = str(header.get("event_id") or msg.get("message_id") or "")
        created = str(header.get("create_time") or "0")
        ts = int(created) // 1000 if created.isdigit() else int(self.svc.clock())
        if not self.replays.first("feishu:" + event_id, ts):
            log.info("msmon bot: Feishu pushed event %s again; it was taken once, nothing is done twice", event_id)
            return
        reply_to = ReplyTo(channel=str(msg.get("chat_id") or ""), thread=str(msg.get("message_id") or ""))
        origin = Origin(source="feishu", user=f"feishu:{open_id}", receiver="feishu", reply_to=reply_to)
        answer = self.svc.submit(command_text(str(msg.get("content") or "")), origin)
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
    replays = ReplayGuard(clock, window=WINDOW, persist=svc.store.commands.first_signed)
    inbound = FeishuInbound(svc, token, os.environ.get(cfg.feishu.encrypt_key_env) or None, replays)
    app.router.add_post(ROUTE, inbound.handle)
    return inbound
