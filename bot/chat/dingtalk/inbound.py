"""DingTalk's way in: an enterprise (app) robot's message callback (`POST /dingtalk/callback`), a group
message `@msmon pause run-42` as DingTalk posts it to the robot's HTTP message URL.

Checked as DingTalk's robot callback doc says, and tighter: the `timestamp` header (ms) within 5 minutes
of the bot's clock (DingTalk allows an hour) and the `sign` header = base64(HMAC-SHA256 keyed with the
app's AppSecret over `timestamp\nAppSecret`). DingTalk's sign covers the timestamp only, never the
body: what can be bound is bound here: each (timestamp, sign) is taken once (a captured pair carries
no second body), and a msgId counts once for a day, both remembered in the store across restarts. What
the platform cannot protect (a body swapped in flight under a fresh pair) is said in docs/security.md.
A bot without the AppSecret refuses everything. The sender is `dingtalk:<senderStaffId>` (or its
senderId) in `commands.allow`. The immediate answer is the HTTP response (DingTalk posts a response
body that is a message into the conversation); later results go through the outbox to the DingTalk
receiver, to the conversation's sessionWebhook while it is valid.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from bot.chat.replay import ReplayGuard
from bot.commands.origin import Origin
from bot.commands.service import CommandService
from bot.config import BotConfig
from bot.receivers import ReplyTo
from bot.receivers.render import escape_dingtalk

log = logging.getLogger("msmon.bot")

ROUTE = "/dingtalk/callback"
WINDOW = 300.0  # seconds between the timestamp header and the bot's clock (DingTalk's own limit is an hour)
MESSAGE_MEMORY = 86_400.0  # seconds a msgId is remembered
MAX_COMMAND = 4000  # characters of a message's text; a longer one is not a command


def callback_sign(timestamp: str, app_secret: str) -> str:
    """The `sign` header of a robot callback: base64(HMAC-SHA256(AppSecret, timestamp + "\\n" + AppSecret))."""
    mac = hmac.new(app_secret.encode(), f"{timestamp}\n{app_secret}".encode(), hashlib.sha256).digest()
    return base64.b64encode(mac).decode()


class DingTalkInbound:
    def __init__(self, svc: CommandService, app_secret: str | None, clock: Callable[[], float],
                 replays: ReplayGuard, signs: ReplayGuard | None = None) -> None:
        self.svc, self.app_secret, self.clock, self.replays = svc, app_secret, clock, replays
        self.signs = signs if signs is not None else ReplayGuard(clock, window=WINDOW)  # each (timestamp, sign) once

    def _verify(self, headers: Any) -> None:
        ts, given = headers.get("timestamp", ""), headers.get("sign", "")
        if not self.app_secret:
            raise web.HTTPUnauthorized(reason="this bot has no DingTalk AppSecret (dingtalk.app_secret_env); it "
                                              "refuses every callback")
        if not (ts.isascii() and ts.isdigit() and len(ts) <= 15) or not given:
            raise web.HTTPUnauthorized(reason="unsigned callback: the timestamp (ms) and sign headers are required")
        if abs(self.clock() * 1000 - int(ts)) > WINDOW * 1000:
            raise web.HTTPUnauthorized(reason=f"stale callback (timestamp more than {WINDOW:.0f} s away)")
        if not hmac.compare_digest(given.encode("utf-8", "replace"), callback_sign(ts, self.app_secret).encode()):
            raise web.HTTPUnauthorized(reason="invalid sign")
        if not self.signs.first(f"dingtalk-sign:{ts}", int(ts) // 1000):
            raise web.HTTPUnauthorized(reason="replayed callback: this (timestamp, sign) was already taken once")

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        try:
            self._verify(request.headers)
        except web.HTTPUnauthorized as exc:
            log.warning("msmon bot: refused a DingTalk callback from %s: %s", request.remote, exc.reason)
            raise
        try:
            msg = json.loads(body)
        except (ValueError, RecursionError):
            raise web.HTTPBadRequest(reason="not a robot message: the body is not JSON") from None
        if not isinstance(msg, dict) or msg.get("msgtype") != "text" or not isinstance(msg.get("text"), dict):
            return web.json_response({})  # another message type: nothing to do
        user = str(msg.get("senderStaffId") or msg.get("senderId") or "")[:256]
        msg_id = str(msg.get("msgId") or "")[:256]
        if not user or (msg_id and not self.replays.first("dingtalk:" + msg_id, int(self.clock()))):
            return web.json_response({})
        text = str(msg["text"].get("content", "")).strip()
        if len(text) > MAX_COMMAND:
            log.info("msmon bot: ignored a DingTalk message of %d characters from %s (not a command)", len(text), user)
            return web.json_response({})
        text = text[len("/msmon"):].strip() if text.startswith("/msmon") else text
        reply_to = ReplyTo(channel=str(msg.get("conversationId") or "")[:256],
                           url=str(msg.get("sessionWebhook") or "")[:2048])
        origin = Origin(source="dingtalk", user=f"dingtalk:{user}", user_name=str(msg.get("senderNick") or "")[:256],
                        receiver="dingtalk", reply_to=reply_to)
        answer = self.svc.submit(text, origin)
        return web.json_response({"msgtype": "markdown", "markdown": {
            "title": "msmon", "text": "\n\n".join(escape_dingtalk(line) for line in answer.text.splitlines())}})


def add_dingtalk_routes(app: web.Application, cfg: BotConfig, svc: CommandService,
                        clock: Callable[[], float] = time.time) -> DingTalkInbound | None:
    """POST /dingtalk/callback, when the enterprise robot's AppSecret is set."""
    secret = os.environ.get(cfg.dingtalk.app_secret_env) or None
    if secret is None:
        return None
    persist = svc.store.commands.first_signed
    inbound = DingTalkInbound(svc, secret, clock, ReplayGuard(clock, window=MESSAGE_MEMORY, persist=persist),
                              ReplayGuard(clock, window=WINDOW, persist=persist))
    app.router.add_post(ROUTE, inbound.handle)
    return inbound
