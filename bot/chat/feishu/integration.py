"""Feishu/Lark as the app assembles it: the custom bot's signed cards (receiver.py) and, with a Verification
Token set, the app bot's event subscription `POST /feishu/events` (inbound.py)."""

from __future__ import annotations

import os

from aiohttp import web

from bot.charts.links import chart_links
from bot.chat.feishu.inbound import add_feishu_routes
from bot.chat.robot import webhook_url
from bot.integration import Context, Integration
from bot.receivers import Receiver


class Feishu(Integration):
    name = "feishu"
    section = "feishu"  # its bot.yaml section, bot.feishu (bot/config.py)

    def receiver(self, ctx: Context) -> Receiver | None:
        if not ctx.uses(self.name):
            return None
        from bot.chat.feishu.receiver import FeishuReceiver

        fs = ctx.cfg.feishu
        app_secret = os.environ.get(fs.app_secret_env, "")
        app = (fs.app_id, app_secret, fs.api_base) if fs.app_id and app_secret else None
        return FeishuReceiver(webhook_url(self.name, fs.webhook_env), os.environ.get(fs.secret_env) or None,
                              ctx.clock, chart_links(ctx.cfg, ctx.clock), app, fs.timeout)

    def routes(self, app: web.Application, ctx: Context) -> None:
        add_feishu_routes(app, ctx.cfg, ctx.svc, ctx.clock)
