"""DingTalk custom robot: a markdown message per alert to the group's webhook, the URL signed
(`&timestamp=<ms>&sign=<HMAC-SHA256, base64, URL-encoded>`, see im_webhook.dingtalk_sign), `at` naming
the on-call (their mobiles or user ids, from bot.yaml) on a firing ERROR. DingTalk allows 20 messages a
minute per robot and throttles a robot that sends more for 10 minutes (errcode 130101, "send too fast"):
the budget here never sends the 21st; the outbox keeps the row and retries it when the minute has room.
Errcode 310000 (a bad signature, a stale timestamp, a missing keyword, an IP not allowed) names the cause.
Job text is escaped for DingTalk's markdown (render.escape_dingtalk).
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable, Sequence
from typing import Any

from bot.charts.links import ChartLinks
from bot.chat.robot import Budget, ChatWebhookReceiver, Pace, WebhookPoster, signed_dingtalk_url
from bot.receivers import Message, Note
from bot.receivers.render import escape_dingtalk
from msmon.contract.wire import Severity, Status

BODY_LIMIT = 20_000  # bytes: DingTalk documents no markdown limit; kept as Feishu's, its robots' peer
RATES = ((20, 60.0),)  # per robot: 20 a minute
PACE = Pace(direct=15, spacing=12.0)  # 15 alone a minute, then a summary every 12 s (5 a minute)
THROTTLED = {130101: 600.0}  # "send too fast, exceed 20 times per minute": the robot is throttled 10 minutes
PERMANENT = {  # codes no retry can fix: a dead letter at once, with what to fix
    300001: "the access_token is not a robot's (check DINGTALK_WEBHOOK_URL)",
    310000: "the robot's security settings refuse the message: its signature (DINGTALK_SECRET, the host's clock), "
            "keyword or IP allow-list",
    400013: "the robot's group was dissolved",
    400101: "the access_token does not exist (check DINGTALK_WEBHOOK_URL)",
    400102: "the robot is disabled",
}


class DingTalkReceiver(ChatWebhookReceiver):
    name = "dingtalk"
    body_limit = BODY_LIMIT
    limit_text = "DingTalk's 20 messages a minute per robot"

    def __init__(self, url: str, secret: str | None, clock: Callable[[], float], at_mobiles: Sequence[str] = (),
                 at_user_ids: Sequence[str] = (), links: ChartLinks | None = None, timeout: float = 10.0) -> None:
        super().__init__(url, WebhookPoster("DingTalk", Budget(RATES), clock, "errcode", THROTTLED, timeout, PERMANENT),
                         PACE, links)
        self.secret, self.clock = secret, clock
        self.at_mobiles, self.at_user_ids = list(at_mobiles), list(at_user_ids)

    async def attach(self, channel: str, ref: str, msg: Message) -> None:
        """The chart as an actionCard whose button opens its link: a robot cannot upload an image."""
        url = self.chart_link(msg)
        if url is None:
            return
        title = f"chart of {self.escape(msg.rule)} at step {msg.lead.step}"
        await self._send({"msgtype": "actionCard", "actionCard": {
            "title": title, "text": f"**{title}**\n\nrun {self.escape(msg.run_id)}", "btnOrientation": "0",
            "singleTitle": "Open the chart", "singleURL": url}}, "chart")

    def signed_url(self) -> str:
        return signed_dingtalk_url(self.url, self.secret, int(self.clock() * 1000)) if self.secret else self.url

    def escape(self, value: str) -> str:
        return escape_dingtalk(value)

    def markdown_body(self, head: str, text: str, msg: Message | None = None) -> dict[str, Any]:
        """A markdown message; a firing ERROR `at`s the on-call, whose `@mobile` DingTalk wants in the text too."""
        oncall = msg is not None and msg.severity is Severity.ERROR and msg.status is Status.FIRING
        if not oncall or not (self.at_mobiles or self.at_user_ids):
            return {"msgtype": "markdown", "markdown": {"title": head, "text": text}, "at": {"isAtAll": False}}
        names = " ".join(f"@{m}" for m in self.at_mobiles + self.at_user_ids)
        return {"msgtype": "markdown", "markdown": {"title": head, "text": f"{text}\n\n{names}"},
                "at": {"atMobiles": self.at_mobiles, "atUserIds": self.at_user_ids, "isAtAll": False}}

    def note_url(self, note: Note) -> str | None:
        """A command's answer goes to the sessionWebhook of the conversation it came from (bot/chat/dingtalk/inbound.py)
        when that is on the robot's own host; else to the robot's webhook."""
        url = note.reply_to.url
        return url if url and _origin(url) == _origin(self.url) else None


def _origin(url: str) -> tuple[str, str]:
    parts = urllib.parse.urlsplit(url)
    return parts.scheme, parts.netloc
