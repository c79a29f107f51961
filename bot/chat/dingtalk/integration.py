"""DingTalk as the app assembles it: the custom robot's signed markdown (receiver.py) and, with the enterprise
robot's AppSecret set, its message callback `POST /dingtalk/callback` (inbound.py)."""

from __future__ import annotations

import os

from aiohttp import web

from bot.charts.links import chart_links
from bot.chat.dingtalk.inbound import add_dingtalk_routes
from bot.chat.robot import webhook_url
from bot.integration import Context, Integration
from bot.receivers import Receiver


class DingTalk(Integration):
    name = "dingtalk"
    section = "dingtalk"  # its bot.yaml section, bot.dingtalk (bot/config.py)

    def receiver(self, ctx: Context) -> Receiver | None:
        if not ctx.uses(self.name):
            return None
        from bot.chat.dingtalk.receiver import DingTalkReceiver

        dt = ctx.cfg.dingtalk
        return DingTalkReceiver(webhook_url(self.name, dt.webhook_env), os.environ.get(dt.secret_env) or None,
                                ctx.clock, dt.at_mobiles, dt.at_user_ids, chart_links(ctx.cfg, ctx.clock), dt.timeout)

    def routes(self, app: web.Application, ctx: Context) -> None:
        add_dingtalk_routes(app, ctx.cfg, ctx.svc, ctx.clock)
