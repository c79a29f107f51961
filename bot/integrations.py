"""The chat platforms the bot assembles (bot/integration.py says what each gives): the one list a new
platform is added to."""

from __future__ import annotations

from bot.chat.dingtalk.integration import DingTalk
from bot.chat.feishu.integration import Feishu
from bot.chat.matrix.integration import Matrix
from bot.chat.slack.integration import Slack
from bot.chat.wecom.integration import WeCom
from bot.integration import Integration

CHAT: tuple[type[Integration], ...] = (Slack, Matrix, Feishu, DingTalk, WeCom)


def chat_integrations() -> list[Integration]:
    """A fresh instance of each platform's integration, for one app."""
    return [cls() for cls in CHAT]
