"""The Feishu/Lark, DingTalk and WeCom receivers bot.yaml's routes ask for, built from their sections
(URLs and secrets from the environment). A route to one whose webhook variable is empty is said once
at start: its messages wait in the outbox until the bot runs with the URL."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

from bot.chart_links import chart_links
from bot.config import BotConfig
from bot.receivers import Receiver
from bot.receivers.dingtalk import DingTalkReceiver
from bot.receivers.feishu import FeishuReceiver
from bot.receivers.wecom import WeComReceiver

log = logging.getLogger("msmon.bot")


def _url(name: str, env: str) -> str:
    url = os.environ.get(env, "")
    if not url:
        log.error("msmon bot: routes use %s but the environment variable %s is empty: its messages wait in the "
                  "outbox until the bot runs with the robot's webhook URL", name, env)
    return url


def im_receivers(cfg: BotConfig, clock: Callable[[], float] = time.time) -> dict[str, Receiver]:
    used = {r.receiver for r in cfg.routes}
    out: dict[str, Receiver] = {}
    if "feishu" in used:
        fs = cfg.feishu
        app_secret = os.environ.get(fs.app_secret_env, "")
        app = (fs.app_id, app_secret, fs.api_base) if fs.app_id and app_secret else None
        out["feishu"] = FeishuReceiver(_url("feishu", fs.webhook_env), os.environ.get(fs.secret_env) or None, clock,
                                       chart_links(cfg, clock), app, fs.timeout)
    if "dingtalk" in used:
        dt = cfg.dingtalk
        out["dingtalk"] = DingTalkReceiver(_url("dingtalk", dt.webhook_env), os.environ.get(dt.secret_env) or None,
                                           clock, dt.at_mobiles, dt.at_user_ids, chart_links(cfg, clock), dt.timeout)
    if "wecom" in used:
        out["wecom"] = WeComReceiver(_url("wecom", cfg.wecom.webhook_env), clock, cfg.wecom.timeout)
    return out
