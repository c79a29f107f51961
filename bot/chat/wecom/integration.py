"""WeCom as the app assembles it: the group robot's markdown and chart images (receiver.py); WeCom's group
robots take no commands, so it has no way in."""

from __future__ import annotations

from bot.chat.robot import webhook_url
from bot.integration import Context, Integration
from bot.receivers import Receiver


class WeCom(Integration):
    name = "wecom"
    section = "wecom"  # its bot.yaml section, bot.wecom (bot/config.py)

    def receiver(self, ctx: Context) -> Receiver | None:
        if not ctx.uses(self.name):
            return None
        from bot.chat.wecom.receiver import WeComReceiver

        return WeComReceiver(webhook_url(self.name, ctx.cfg.wecom.webhook_env), ctx.clock, ctx.cfg.wecom.timeout)
