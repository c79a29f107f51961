"""A local Feishu/Lark custom bot webhook (POST /open-apis/bot/v2/hook/{token}) that checks each request
as Feishu's custom bot guide documents (https://open.feishu.cn/document/client-docs/bot-v3/add-custom-bot):
the token; the body at most 20 KB and a known `msg_type` with its content (`card` for interactive,
`content.text` for text), else 9499 "Bad Request"; with a secret, `timestamp` (seconds) within an hour
and `sign` = base64(HMAC-SHA256 keyed `timestamp\\n secret` over nothing), else 19021; 100 requests a
minute and 5 a second, else 11232 (frequency limited). Success: code 0, msg "success", data {}.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from tests.fakes.im_robot import FakeRobot, RateWindow

BODY_LIMIT = 20 * 1024
SIGN_FAIL = {"code": 19021, "data": {}, "msg": "sign match fail or timestamp is not within one hour from current time"}
BAD_REQUEST = {"code": 9499, "msg": "Bad Request", "data": {}}
LIMITED = {"code": 11232, "msg": "frequency limited psm[lark.oapi.app_platform_runtime]appID[1]", "data": {}}
TOKEN_INVALID = {"code": 19001, "msg": "param invalid: incoming webhook access token invalid", "data": {}}
SUCCESS = {"code": 0, "msg": "success", "data": {}, "Extra": None, "StatusCode": 0, "StatusMessage": "success"}


def expected_sign(timestamp: str, secret: str) -> str:
    """Feishu's own sample (Python) of the signature, written independently of the receiver's."""
    string_to_sign = f"{timestamp}\n{secret}"
    hmac_code = hmac.new(string_to_sign.encode("utf-8"), digestmod=hashlib.sha256).digest()
    return base64.b64encode(hmac_code).decode("utf-8")


class FeishuBot(FakeRobot):
    routes = ("/open-apis/bot/v2/hook/{token}",)

    def __init__(self, clock: Callable[[], float], token: str = "hook-token", secret: str | None = None,
                 app: tuple[str, str] | None = None) -> None:
        super().__init__(clock)
        self.token, self.secret = token, secret
        self.minute, self.second = RateWindow(100, 60.0, 0.0), RateWindow(5, 1.0, 0.0)
        self.app = app
        self.tokens: list[str] = []
        self.images: list[bytes] = []
        self.replies: list[tuple[str, Any]] = []  # (message replied to, its card)

    def more_routes(self, app: web.Application) -> None:
        """An app's `tenant_access_token` (auth/v3/tenant_access_token/internal: app_id and app_secret, else
        the generic code 10014) and `im/v1/images` (multipart image_type=message and image, a valid Bearer
        token else 99991663, at most 10 MB else 234006); `app` is (app_id, app_secret)."""
        app.router.add_post("/open-apis/auth/v3/tenant_access_token/internal", self._token)
        app.router.add_post("/open-apis/im/v1/images", self._image)
        app.router.add_post("/open-apis/im/v1/messages/{message_id}/reply", self._reply)

    async def _reply(self, request: web.Request) -> web.Response:
        """im/v1/messages/:message_id/reply: a Bearer token, msg_type and content (a JSON string)."""
        if request.headers.get("Authorization", "").removeprefix("Bearer ") not in self.tokens:
            return web.json_response({"code": 99991663, "msg": "Invalid access token for authorization."},
                                     status=400)
        body = await request.json()
        if body.get("msg_type") != "interactive" or not isinstance(body.get("content"), str):
            return web.json_response({"code": 230001, "msg": "Your request contains an invalid request parameter."},
                                     status=400)
        self.replies.append((request.match_info["message_id"], json.loads(body["content"])))
        return web.json_response({"code": 0, "msg": "success", "data": {"message_id": f"om_r{len(self.replies)}"}})

    async def _token(self, request: web.Request) -> web.Response:
        body = await request.json()
        if self.app is None or (body.get("app_id"), body.get("app_secret")) != self.app:
            return web.json_response({"code": 10014, "msg": "app secret invalid"})
        token = f"t-{len(self.tokens) + 1:040d}"
        self.tokens.append(token)
        return web.json_response({"code": 0, "msg": "ok", "tenant_access_token": token, "expire": 7200})

    async def _image(self, request: web.Request) -> web.Response:
        if request.headers.get("Authorization", "").removeprefix("Bearer ") not in self.tokens:
            return web.json_response({"code": 99991663, "msg": "Invalid access token for authorization."},
                                     status=400)
        form = await request.post()
        image = form.get("image")
        if form.get("image_type") != "message" or not isinstance(image, web.FileField):
            return web.json_response({"code": 234001, "msg": "Invalid request param."}, status=400)
        png = image.file.read()
        if len(png) > 10 * 1024 * 1024:
            return web.json_response({"code": 234006, "msg": "The image size exceeds limit."}, status=400)
        self.images.append(png)
        return web.json_response({"code": 0, "data": {"image_key": f"img_v2_{len(self.images)}"}, "msg": "success"})

    def answer(self, path: str, query: dict[str, str], raw: bytes, body: Any, now: float) -> tuple[int, dict[str, Any]]:
        if path.rsplit("/", 1)[-1] != self.token:
            return 200, TOKEN_INVALID
        if len(raw) > BODY_LIMIT or not isinstance(body, dict) or not _schema_ok(body):
            return 400, BAD_REQUEST
        if self.secret is not None:
            ts = str(body.get("timestamp", ""))
            if not ts.isdigit() or abs(now - int(ts)) > 3600 or body.get("sign") != expected_sign(ts, self.secret):
                return 200, SIGN_FAIL
        if not (self.minute.admit(now) and self.second.admit(now)):
            return 200, LIMITED
        return 200, SUCCESS


def _schema_ok(body: dict[str, Any]) -> bool:
    kind = body.get("msg_type")
    if kind == "interactive":
        card = body.get("card")
        return isinstance(card, dict) and isinstance(card.get("elements"), list)
    if kind == "text":
        return isinstance(body.get("content"), dict) and isinstance(body["content"].get("text"), str)
    return False


def encrypt(plain: bytes, encrypt_key: str) -> str:
    """What Feishu sends with an Encrypt Key: base64(IV + AES-256-CBC(SHA-256(key), PKCS7(plain)))."""
    import os

    from cryptography.hazmat.primitives import padding
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    iv = os.urandom(16)
    padder = padding.PKCS7(128).padder()
    enc = Cipher(algorithms.AES(hashlib.sha256(encrypt_key.encode()).digest()), modes.CBC(iv)).encryptor()
    return base64.b64encode(iv + enc.update(padder.update(plain) + padder.finalize()) + enc.finalize()).decode()


def message_event(text: str, token: str, open_id: str = "ou_alice", chat_id: str = "oc_team",
                  event_id: str = "ev-1", message_id: str = "om_1") -> dict[str, Any]:
    """An im.message.receive_v1 event (schema 2.0) of a group text message that @-mentions the bot."""
    return {"schema": "2.0",
            "header": {"event_id": event_id, "token": token, "create_time": "1700000000000",
                       "event_type": "im.message.receive_v1", "tenant_key": "tk", "app_id": "cli_a"},
            "event": {"sender": {"sender_id": {"open_id": open_id, "union_id": "on_x"}, "sender_type": "user",
                                 "tenant_key": "tk"},
                      "message": {"message_id": message_id, "chat_id": chat_id, "chat_type": "group",
                                  "message_type": "text", "create_time": "1700000000000",
                                  "content": json.dumps({"text": f"@_user_1 {text}"}),
                                  "mentions": [{"key": "@_user_1", "id": {"open_id": "ou_bot"}, "name": "msmon"}]}}}


def event_request(event: dict[str, Any], encrypt_key: str | None = None, timestamp: str | None = None,
                  nonce: str = "n0nce") -> tuple[dict[str, str], bytes]:
    """The headers and body Feishu posts for `event`: encrypted and signed when there is an Encrypt Key
    (signed now, unless `timestamp` says when)."""
    timestamp = str(int(time.time())) if timestamp is None else timestamp
    plain = json.dumps(event).encode()
    if encrypt_key is None:
        return {"Content-Type": "application/json"}, plain
    body = json.dumps({"encrypt": encrypt(plain, encrypt_key)}).encode()
    sig = hashlib.sha256((timestamp + nonce + encrypt_key).encode() + body).hexdigest()
    return {"Content-Type": "application/json", "X-Lark-Request-Timestamp": timestamp, "X-Lark-Request-Nonce": nonce,
            "X-Lark-Signature": sig}, body
