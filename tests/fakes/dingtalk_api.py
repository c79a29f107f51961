"""A local DingTalk custom robot webhook (POST /robot/send?access_token=...) that checks each request as
DingTalk's custom robot docs say: the access token (else 300001); with a secret, `timestamp` (ms) within
an hour and `sign` = URL-encoded base64(HMAC-SHA256 keyed with the secret over `timestamp\\n secret`),
else 310000; a `msgtype` with its content (markdown: title and text; actionCard: title, text and
singleURL or btns; text: content), else 40035; 20 messages a minute per robot, and the 21st throttles
the robot for 10 minutes (errcode 130101, "send too fast, exceed 20 times per minute").
Success: errcode 0, errmsg "ok".
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import urllib.parse
from collections.abc import Callable
from typing import Any

from tests.fakes.im_robot import FakeRobot, RateWindow

OK = {"errcode": 0, "errmsg": "ok"}
SIGN_FAIL = {"errcode": 310000, "errmsg": "sign not match, more: [https://ding-doc.dingtalk.com/doc#/serverapi2/qf2nxq]"}
STALE = {"errcode": 310000, "errmsg": "invalid timestamp, more: [https://ding-doc.dingtalk.com/doc#/serverapi2/qf2nxq]"}
TOO_FAST = {"errcode": 130101, "errmsg": "send too fast, exceed 20 times per minute"}
NO_TOKEN = {"errcode": 300001, "errmsg": "token is not exist"}
BAD_BODY = {"errcode": 40035, "errmsg": "缺少参数 json"}


def expected_sign(timestamp: str, secret: str) -> str:
    """DingTalk's own sample (Python) of the signature, written independently of the receiver's."""
    secret_enc = secret.encode("utf-8")
    string_to_sign_enc = f"{timestamp}\n{secret}".encode()
    hmac_code = hmac.new(secret_enc, string_to_sign_enc, digestmod=hashlib.sha256).digest()
    return urllib.parse.quote_plus(base64.b64encode(hmac_code))


class DingTalkRobot(FakeRobot):
    routes = ("/robot/send", "/robot/sendBySession")

    def __init__(self, clock: Callable[[], float], token: str = "robot-token", secret: str | None = None) -> None:
        super().__init__(clock)
        self.token, self.secret = token, secret
        self.rate = RateWindow(20, 60.0, 600.0)
        self.sessions = {"s-team"}  # the sessionWebhooks handed out with callbacks (valid about 90 minutes)

    def answer(self, path: str, query: dict[str, str], raw: bytes, body: Any, now: float) -> tuple[int, dict[str, Any]]:
        if path.endswith("/sendBySession"):  # a conversation's sessionWebhook: its session is the credential
            if query.get("session") not in self.sessions:
                return 200, NO_TOKEN
        elif query.get("access_token") != self.token:
            return 200, NO_TOKEN
        if self.secret is not None and not path.endswith("/sendBySession"):
            ts = query.get("timestamp", "")
            if not ts.isdigit() or abs(now * 1000 - int(ts)) > 3600_000:
                return 200, STALE
            # aiohttp has URL-decoded the query once: the sign as sent is the quoted form of what is here
            if urllib.parse.quote_plus(query.get("sign", "")) != expected_sign(ts, self.secret):
                return 200, SIGN_FAIL
        if not isinstance(body, dict) or not _schema_ok(body):
            return 200, BAD_BODY
        if not self.rate.admit(now):
            return 200, TOO_FAST
        return 200, OK


def _schema_ok(body: dict[str, Any]) -> bool:
    kind = body.get("msgtype")
    part = body.get(kind) if isinstance(kind, str) else None
    if not isinstance(part, dict):
        return False
    if kind == "markdown":
        return isinstance(part.get("title"), str) and isinstance(part.get("text"), str)
    if kind == "actionCard":
        return all(isinstance(part.get(k), str) for k in ("title", "text")) and ("singleURL" in part or "btns" in part)
    return kind == "text" and isinstance(part.get("content"), str)


def callback_request(text: str, app_secret: str, timestamp_ms: int, staff_id: str = "alice01",
                     msg_id: str = "msg-1", session_webhook: str = "") -> tuple[dict[str, str], bytes]:
    """The headers and body DingTalk posts to an enterprise robot's message URL for a group text message."""
    sign = base64.b64encode(hmac.new(app_secret.encode(), f"{timestamp_ms}\n{app_secret}".encode(),
                                     hashlib.sha256).digest()).decode()
    body = {"msgtype": "text", "text": {"content": f" {text}"}, "msgId": msg_id, "createAt": timestamp_ms,
            "conversationType": "2", "conversationId": "cid-team", "conversationTitle": "team",
            "senderId": "$:LWCP_v1:$x", "senderNick": "Alice", "senderStaffId": staff_id, "chatbotUserId": "$:bot",
            "isAdmin": False, "robotCode": "ding-robot", "sessionWebhook": session_webhook,
            "sessionWebhookExpiredTime": timestamp_ms + 5_400_000}
    return {"Content-Type": "application/json", "timestamp": str(timestamp_ms), "sign": sign}, \
        json.dumps(body).encode()
