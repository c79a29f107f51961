"""Feishu/Lark custom bot: an interactive card per alert to the group's webhook, signed
(`timestamp` + `sign` in the body, see im_webhook.feishu_sign), within Feishu's documented limits:
100 messages a minute and 5 a second per bot, request bodies of at most 20 KB
(https://open.feishu.cn/document/client-docs/bot-v3/add-custom-bot). Code 11232 (frequency limited) and
HTTP 429 are DeliveryErrors with Retry-After; 19021 (a bad signature or a clock an hour off) names the
cause. Job text is escaped for lark_md (render.escape_feishu); the card's header is plain text.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from msmon.contract.wire import Severity, Status

from ..chart_links import ChartLinks
from . import Message
from .im_webhook import Budget, ChatWebhookReceiver, Pace, WebhookPoster, feishu_sign
from .render import escape_feishu, escape_plain_im, title

BODY_LIMIT = 20 * 1024  # bytes of a request body
RATES = ((100, 60.0), (5, 1.0))  # per bot: 100 a minute, 5 a second
PACE = Pace(direct=90, spacing=6.0)  # 90 alone a minute, then a summary every 6 s (10 a minute)
THROTTLED = {11232: 60.0}  # Feishu's "frequency limited": wait out the minute
TEMPLATE = {Severity.ERROR: "red", Severity.WARNING: "orange"}


def card(body_text: str, msg: Message | None = None) -> dict[str, Any]:
    """An interactive card: the text as lark_md, under a header coloured by severity with the alert's
    title (plain text) when it is an alert."""
    out: dict[str, Any] = {"config": {"wide_screen_mode": True},
                           "elements": [{"tag": "div", "text": {"tag": "lark_md", "content": body_text}}]}
    if msg is not None:
        template = "green" if msg.status is Status.RESOLVED else TEMPLATE.get(msg.severity, "blue")
        out["header"] = {"template": template,
                         "title": {"tag": "plain_text", "content": title(msg, escape_plain_im)[:200]}}
    return out


class FeishuReceiver(ChatWebhookReceiver):
    name = "feishu"
    body_limit = BODY_LIMIT
    limit_text = "Feishu's 100 messages a minute and 5 a second per bot"

    def __init__(self, url: str, secret: str | None, clock: Callable[[], float],
                 links: ChartLinks | None = None) -> None:
        super().__init__(url, WebhookPoster("Feishu", Budget(RATES), clock, "code", THROTTLED), PACE, links)
        self.secret, self.clock = secret, clock

    async def attach(self, channel: str, ref: str, msg: Message) -> None:
        """The chart as its link in a card of its own: a custom bot cannot upload an image."""
        url = self.chart_link(msg)
        if url is not None:
            text = f"[chart of {self.escape(msg.rule)} at step {msg.lead.step}]({url})"
            await self._send(self.markdown_body("chart", text), "chart")

    def escape(self, value: str) -> str:
        return escape_feishu(value)

    def markdown_body(self, head: str, text: str, msg: Message | None = None) -> dict[str, Any]:
        """An interactive card, signed when the bot has a secret (`timestamp` and `sign` in the body)."""
        body: dict[str, Any] = {"msg_type": "interactive", "card": card(text, msg)}
        if not self.secret:
            return body
        ts = int(self.clock())
        return {"timestamp": str(ts), "sign": feishu_sign(ts, self.secret), **body}
