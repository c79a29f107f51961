"""Slack as the app assembles it: Block Kit alerts (receiver.py), the slash command and buttons over HTTP
(inbound.py) and, with bot.slack.socket_mode, the same over a websocket the bot opens (socket_mode.py)."""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from aiohttp import web

from bot.chat.slack.inbound import SlackInbound, add_slack_routes
from bot.integration import Context, Integration, Task
from bot.receivers import Receiver

if TYPE_CHECKING:
    from bot.chat.slack.socket_mode import SocketModeBridge

log = logging.getLogger("msmon.bot")


class Slack(Integration):
    name = "slack"
    section = "slack"  # its bot.yaml section, bot.slack (bot/config.py)

    def __init__(self) -> None:
        self.inbound: SlackInbound | None = None

    def receiver(self, ctx: Context) -> Receiver | None:
        if not ctx.uses(self.name):
            return None
        cfg = ctx.cfg
        token = os.environ.get(cfg.slack.token_env)
        if not token:
            log.error("msmon bot: routes use slack but the environment variable %s is empty: Slack messages wait "
                      "in the outbox until the bot runs with a token", cfg.slack.token_env)
        from bot.chat.slack.receiver import SlackReceiver

        return SlackReceiver(token or "", cfg.slack.base_url, cfg.slack.max_retries, cfg.console.charts,
                             cfg.slack.timeout)

    def routes(self, app: web.Application, ctx: Context) -> None:
        self.inbound = add_slack_routes(app, ctx.cfg, ctx.svc, ctx.clock)  # POST /slack/commands, /interactions

    def task(self, ctx: Context) -> Task | None:
        if not ctx.cfg.slack.socket_mode or self.inbound is None:
            return None
        from bot.chat.slack.socket_mode import SocketModeBridge

        return _SocketMode(SocketModeBridge(os.environ.get(ctx.cfg.slack.app_token_env, ""), self.inbound,
                                            ctx.cfg.slack.base_url), ctx.cfg.slack.app_token_env)


class _SocketMode:
    """Socket Mode that does not start leaves alerts flowing; only chat commands are off (said once)."""

    def __init__(self, bridge: SocketModeBridge, token_env: str) -> None:
        self.bridge: SocketModeBridge | None = bridge
        self.token_env = token_env

    async def start(self) -> None:
        from bot.chat.slack.socket_mode import SocketModeError

        if self.bridge is None:
            return
        try:
            await self.bridge.start()
        except SocketModeError as exc:
            log.error("msmon bot: Socket Mode did not start (%s); chat commands are OFF until the bot restarts "
                      "with a working app token (%s)", exc, self.token_env)
            self.bridge = None

    async def stop(self) -> None:
        if self.bridge is not None:
            await self.bridge.stop()
