"""Feishu/Lark custom bot: an interactive card per alert to the group's webhook, signed
(`timestamp` + `sign` in the body, see im_webhook.feishu_sign), within Feishu's documented limits:
100 messages a minute and 5 a second per bot, request bodies of at most 20 KB
(https://open.feishu.cn/document/client-docs/bot-v3/add-custom-bot). Code 11232 (frequency limited) and
HTTP 429 are DeliveryErrors with Retry-After; 19021 (a bad signature or a clock an hour off) names the
cause. Job text is escaped for lark_md (render.escape_feishu); the card's header is plain text.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Callable
from typing import Any

import aiohttp

from bot.charts.links import ChartLinks
from bot.chat.robot import Budget, ChatWebhookReceiver, Pace, WebhookPoster, feishu_sign
from bot.receivers import DeliveryError, Message, Note
from bot.receivers.render import escape_feishu, escape_plain_im, title
from msmon.contract.wire import Severity, Status

BODY_LIMIT = 20 * 1024  # bytes of a request body
RATES = ((100, 60.0), (5, 1.0))  # per bot: 100 a minute, 5 a second
PACE = Pace(direct=90, spacing=6.0)  # 90 alone a minute, then a summary every 6 s (10 a minute)
THROTTLED = {11232: 60.0}  # Feishu's "frequency limited": wait out the minute
PERMANENT = {  # codes no retry can fix: a dead letter at once, with what to fix
    19001: "the webhook URL's token is not a bot's (check FEISHU_WEBHOOK_URL)",
    19021: "the signature does not match (check FEISHU_SECRET, and the bot host's clock)",
    19022: "the bot's IP allow-list refuses this host",
    19024: "the message lacks the bot's custom keyword (set in the bot's security settings)",
}
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


class FeishuApp:
    """An app's credentials, for what a custom bot cannot do: upload the chart (`im/v1/images`, with a
    `tenant_access_token` from `auth/v3/tenant_access_token/internal`, kept until 5 minutes before it
    expires) so that the card shows it as an image. Plain JSON/multipart over the poster's session."""

    def __init__(self, app_id: str, app_secret: str, api_base: str, poster: WebhookPoster) -> None:
        self.app_id, self.app_secret, self.api_base, self.poster = app_id, app_secret, api_base.rstrip("/"), poster
        self._token: tuple[str, float] | None = None  # (token, valid until)

    async def _json(self, what: str, coro: Any) -> dict[str, Any]:
        try:
            async with coro as resp:
                raw, status, retry = await resp.read(), resp.status, resp.headers.get("Retry-After")
        except Exception as exc:  # noqa: BLE001 - aiohttp errors, timeouts: all a failed delivery
            raise DeliveryError(f"Feishu {what} failed: {type(exc).__name__}: {exc}") from None
        return self.poster.answer(what, status, retry, raw)

    async def token(self) -> str:
        now = self.poster.clock()
        if self._token is None or self._token[1] <= now:
            answer = await self._json("tenant_access_token", self.poster.session().post(
                f"{self.api_base}/open-apis/auth/v3/tenant_access_token/internal",
                json={"app_id": self.app_id, "app_secret": self.app_secret}))
            self._token = (str(answer["tenant_access_token"]), now + float(answer.get("expire", 7200)) - 300.0)
        return self._token[0]

    async def reply(self, message_id: str, card: dict[str, Any]) -> None:
        """`card` as a reply to the message `message_id` (im/v1/messages/:message_id/reply), in its thread."""
        await self._json("im/v1/messages reply", self.poster.session().post(
            f"{self.api_base}/open-apis/im/v1/messages/{urllib.parse.quote(message_id, safe='')}/reply",
            json={"msg_type": "interactive", "content": json.dumps(card, ensure_ascii=False)},
            headers={"Authorization": f"Bearer {await self.token()}"}))

    async def upload(self, png: bytes) -> str:
        """The image_key of `png` uploaded as a message image."""
        form = aiohttp.FormData()
        form.add_field("image_type", "message")
        form.add_field("image", png, filename="chart.png", content_type="image/png")
        answer = await self._json("im/v1/images", self.poster.session().post(
            f"{self.api_base}/open-apis/im/v1/images", data=form,
            headers={"Authorization": f"Bearer {await self.token()}"}))
        return str(answer["data"]["image_key"])


class FeishuReceiver(ChatWebhookReceiver):
    name = "feishu"
    body_limit = BODY_LIMIT
    limit_text = "Feishu's 100 messages a minute and 5 a second per bot"

    def __init__(self, url: str, secret: str | None, clock: Callable[[], float],
                 links: ChartLinks | None = None, app: tuple[str, str, str] | None = None,
                 timeout: float = 10.0) -> None:
        super().__init__(url, WebhookPoster("Feishu", Budget(RATES), clock, "code", THROTTLED, timeout, PERMANENT),
                         PACE, links)
        self.secret, self.clock = secret, clock
        self.app = FeishuApp(*app, self.poster) if app else None  # (app_id, app_secret, api_base)
        self.charts = self.charts or self.app is not None

    async def attach(self, channel: str, ref: str, msg: Message) -> None:
        """The chart in a card of its own: as an image uploaded with the app's credentials when there are
        some, else as its signed link (a custom bot alone cannot upload an image)."""
        if self.app is not None and msg.chart is not None and self.has_room():
            key = await self.app.upload(msg.chart)
            alt = f"chart of {msg.rule} at step {msg.lead.step}"
            body = self.markdown_body("chart", "")
            body["card"]["elements"] = [{"tag": "img", "img_key": key,
                                         "alt": {"tag": "plain_text", "content": escape_plain_im(alt)[:200]}}]
            await self._send(body, "chart")
            return
        url = self.chart_link(msg)
        if url is not None:
            text = f"[chart of {self.escape(msg.rule)} at step {msg.lead.step}]({url})"
            await self._send(self.markdown_body("chart", text), "chart")

    def escape(self, value: str) -> str:
        return escape_feishu(value)

    async def note(self, note: Note) -> None:
        """With the app's credentials, a command's answer is a reply to the command message (its ReplyTo's
        thread, from bot/chat/feishu/inbound.py); else it goes to the group through the bot's webhook."""
        if self.app is None or not note.reply_to.thread:
            await super().note(note)
            return
        await self.app.reply(note.reply_to.thread, self.note_body(note)["card"])

    def markdown_body(self, head: str, text: str, msg: Message | None = None) -> dict[str, Any]:
        """An interactive card, signed when the bot has a secret (`timestamp` and `sign` in the body)."""
        body: dict[str, Any] = {"msg_type": "interactive", "card": card(text, msg)}
        if not self.secret:
            return body
        ts = int(self.clock())
        return {"timestamp": str(ts), "sign": feishu_sign(ts, self.secret), **body}
