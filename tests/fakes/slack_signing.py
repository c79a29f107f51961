"""Requests signed as Slack signs them (slack-sdk's own signature code), for the bot's Slack endpoints."""

from __future__ import annotations

import itertools
import json
import time
import urllib.request
from typing import Any
from urllib.parse import urlencode

from slack_sdk.signature import SignatureVerifier

from tests.fakes.bot_server import send

SECRET = "8f742231b10e8888abcd99yyyzzz85a5"  # Slack's published example secret


def signed_post(url: str, body: bytes, secret: str | None = SECRET, ts: int | None = None,
                signature: str | None = None) -> tuple[int, Any]:
    ts = int(time.time()) if ts is None else ts
    req = urllib.request.Request(url, data=body, method="POST",
                                 headers={"Content-Type": "application/x-www-form-urlencoded"})
    if secret is not None:
        sig = signature or SignatureVerifier(secret).generate_signature(timestamp=str(ts), body=body)
        req.add_header("X-Slack-Request-Timestamp", str(ts))
        req.add_header("X-Slack-Signature", sig)
    return send(req)


_TRIGGERS = itertools.count(1)


def _trigger_id() -> str:
    """Slack gives every slash command and click a trigger_id of its own, so no two requests are the same
    bytes (the bot refuses a replayed signature)."""
    return f"{time.time_ns()}.{next(_TRIGGERS)}.msmon"


def slash(bot_url: str, text: str, user: str = "U0ALICE", channel: str = "C0CHAT", response_url: str = "",
          **kw: Any) -> tuple[int, Any]:
    form = {"token": "x", "team_id": "T0MSMON01", "channel_id": channel, "user_id": user, "user_name": user.lower(),
            "command": "/msmon", "text": text, "response_url": response_url, "trigger_id": _trigger_id()}
    return signed_post(bot_url + "/slack/commands", urlencode(form).encode(), **kw)


def click(bot_url: str, value: str, user: str = "U0ALICE", channel: str = "C0ALERTS", message_ts: str = "1.000100",
          response_url: str = "", **kw: Any) -> tuple[int, Any]:
    payload = {"type": "block_actions", "trigger_id": _trigger_id(), "user": {"id": user, "username": user.lower()},
               "channel": {"id": channel}, "container": {"type": "message", "message_ts": message_ts,
                                                         "channel_id": channel},
               "message": {"ts": message_ts, "text": "alert"}, "response_url": response_url,
               "actions": [{"action_id": "msmon_2", "block_id": "msmon_actions", "type": "button", "value": value}]}
    return signed_post(bot_url + "/slack/interactions", urlencode({"payload": json.dumps(payload)}).encode(), **kw)
