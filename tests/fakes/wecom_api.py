"""A local WeCom group robot webhook (POST /cgi-bin/webhook/send?key=...) that checks each request as
WeCom's group robot doc says (https://developer.work.weixin.qq.com/document/path/91770): the key (else
93000, invalid webhook url); markdown.content at most 4,096 bytes of UTF-8 (else 40058); an image's
base64 decoding to at most 2 MB (else 40009, invalid image size) whose MD5 is `md5` (else 40035,
invalid parameter); a known msgtype (else 40008); 20 messages a minute (else 45009, api freq out of
limit). Success: errcode 0, errmsg "ok".
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Callable
from typing import Any

from tests.fakes.im_robot import FakeRobot, RateWindow

OK = {"errcode": 0, "errmsg": "ok"}
BAD_KEY = {"errcode": 93000, "errmsg": "invalid webhook url"}
TOO_LONG = {"errcode": 40058, "errmsg": "markdown.content exceed max length 4096"}
BAD_IMAGE_SIZE = {"errcode": 40009, "errmsg": "invalid image size"}
BAD_PARAM = {"errcode": 40035, "errmsg": "invalid parameter: md5 not match"}
BAD_TYPE = {"errcode": 40008, "errmsg": "invalid message type"}
LIMITED = {"errcode": 45009, "errmsg": "api freq out of limit"}


class WeComRobot(FakeRobot):
    routes = ("/cgi-bin/webhook/send",)

    def __init__(self, clock: Callable[[], float], key: str = "robot-key") -> None:
        super().__init__(clock)
        self.key = key
        self.rate = RateWindow(20, 60.0, 0.0)

    def answer(self, path: str, query: dict[str, str], raw: bytes, body: Any, now: float) -> tuple[int, dict[str, Any]]:
        if query.get("key") != self.key:
            return 200, BAD_KEY
        problem = _problem(body)
        if problem is not None:
            return 200, problem
        if not self.rate.admit(now):
            return 200, LIMITED
        return 200, OK

    def images(self) -> list[bytes]:
        return [base64.b64decode(c.body["image"]["base64"]) for c in self.delivered if c.body["msgtype"] == "image"]


def _problem(body: Any) -> dict[str, Any] | None:
    kind = body.get("msgtype") if isinstance(body, dict) else None
    if kind == "markdown":
        content = body["markdown"].get("content") if isinstance(body.get("markdown"), dict) else None
        if not isinstance(content, str):
            return BAD_PARAM
        return TOO_LONG if len(content.encode()) > 4096 else None
    if kind == "image":
        image = body.get("image") if isinstance(body.get("image"), dict) else {}
        try:
            png = base64.b64decode(str(image.get("base64", "")), validate=True)
        except (binascii.Error, ValueError):
            return BAD_PARAM
        if not png or len(png) > 2 * 1024 * 1024:
            return BAD_IMAGE_SIZE
        return None if hashlib.md5(png).hexdigest() == image.get("md5") else BAD_PARAM  # noqa: S324
    return BAD_TYPE
