"""WeCom (企业微信) group robot: a markdown message per alert (its content at most 4,096 bytes of UTF-8)
and, for a firing ERROR, the chart as an image message (the PNG as base64 with the MD5 of its raw
bytes, at most 2 MB before encoding) to `.../cgi-bin/webhook/send?key=...`. 20 messages a minute per
robot; errcode 45009 (over the limit) is a DeliveryError retried after the minute. Job text is escaped
for WeCom's markdown (render.escape_wecom): no `<@userid>` mention, colour or link from job data.
A group robot cannot receive messages: commands come through Slack, Feishu, DingTalk or `msmon cmd`.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable
from typing import Any

from bot.chat.robot import Budget, ChatWebhookReceiver, Pace, WebhookPoster
from bot.receivers import Message
from bot.receivers.render import escape_wecom

MARKDOWN_LIMIT = 4096  # bytes of markdown.content
IMAGE_LIMIT = 2 * 1024 * 1024  # bytes of the image before base64
RATES = ((20, 60.0),)
PACE = Pace(direct=15, spacing=12.0)  # 15 alone a minute, then a summary every 12 s (5 a minute)
THROTTLED = {45009: 60.0}  # "api freq out of limit"
PERMANENT = {  # codes no retry can fix: a dead letter at once, with what to fix
    93000: "the webhook key is not a robot's (check WECOM_WEBHOOK_URL; was the robot removed?)",
    40008: "WeCom does not take this message type",
    40009: "the image is over WeCom's 2 MB",
    40035: "WeCom refused a parameter of the message",
    40058: "the message is over WeCom's 4,096 bytes",
}


def image_body(png: bytes) -> dict[str, Any]:
    return {"msgtype": "image", "image": {"base64": base64.b64encode(png).decode(),
                                          "md5": hashlib.md5(png).hexdigest()}}  # noqa: S324 - WeCom's checksum


class WeComReceiver(ChatWebhookReceiver):
    name = "wecom"
    charts = True
    limit_text = "WeCom's 20 messages a minute per robot"
    # The content's limit, plus the body around it: JSON is never shorter than the text it encodes.
    body_limit = MARKDOWN_LIMIT + len('{"msgtype": "markdown", "markdown": {"content": ""}}')

    def __init__(self, url: str, clock: Callable[[], float], timeout: float = 10.0) -> None:
        super().__init__(url, WebhookPoster("WeCom", Budget(RATES), clock, "errcode", THROTTLED, timeout, PERMANENT),
                         PACE)

    def escape(self, value: str) -> str:
        return escape_wecom(value)

    def markdown_body(self, head: str, text: str, msg: Message | None = None) -> dict[str, Any]:
        return {"msgtype": "markdown", "markdown": {"content": text}}

    async def attach(self, channel: str, ref: str, msg: Message) -> None:
        """The chart as an image message, when it is within WeCom's 2 MB and the robot has room for it."""
        if msg.chart is not None and len(msg.chart) <= IMAGE_LIMIT and self.has_room():
            await self._send(image_body(msg.chart), "chart")
