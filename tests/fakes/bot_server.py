"""The real bot served on loopback from a thread (bot.server.BotThread), plus request helpers."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Any

from bot.config import load_bot_config
from bot.server import BotThread
from tests.fakes.helpers import wait_for

__all__ = ["BotServer", "BotServers", "request", "send", "wait_for"]


class BotServer(BotThread):
    def __init__(self, config: dict[str, Any], **app_kwargs: Any) -> None:
        super().__init__(load_bot_config(with_test_store(config)), **app_kwargs)

    def request(self, method: str, path: str, body: bytes | None = None, token: str | None = "job-token",
                content_type: str = "application/json") -> tuple[int, Any]:
        return request(self.url, method, path, body, token, content_type)

    def stop(self) -> None:
        """Stopped once: a test may stop its bot (a restart, a bot that is down) before the fixture does."""
        if self.thread.is_alive():
            super().stop()


class BotServers:
    """The `bot_server` fixture (tests/conftest.py): `bot_server(config, **app_kwargs)` starts the real bot on
    loopback; every bot it started is stopped after the test, the last started first."""

    def __init__(self) -> None:
        self.started: list[BotServer] = []

    def __call__(self, config: dict[str, Any], **app_kwargs: Any) -> BotServer:
        bot = BotServer(config, **app_kwargs)
        self.started.append(bot)
        return bot

    def stop_all(self) -> None:
        while self.started:
            self.started.pop().stop()


def request(url: str, method: str, path: str, body: bytes | None = None, token: str | None = "job-token",
            content_type: str = "application/json") -> tuple[int, Any]:
    """One request to the bot at `url` (a job's token by default): (status, JSON or text answer)."""
    req = urllib.request.Request(url + path, data=body, method=method)
    if body is not None:
        req.add_header("Content-Type", content_type)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    return send(req)


def with_test_store(config: dict[str, Any]) -> dict[str, Any]:
    """`config` on PostgreSQL when MSMON_TEST_STORE=postgresql (a schema of its own per state path, the same
    after a restart; skipped with the reason when PostgreSQL does not answer); else as it is."""
    bot = config.get("bot") or {}
    if os.environ.get("MSMON_TEST_STORE", "sqlite") != "postgresql" or "store" in bot:
        return config
    from tests.fakes import postgres

    postgres.required()
    return {**config, "bot": {**bot, "store": postgres.store_config(str(bot.get("state_path", "msmon-bot.sqlite")))}}


def send(req: urllib.request.Request) -> tuple[int, Any]:
    """(HTTP status, the JSON answer or the text) for any answer, 4xx and 5xx included."""
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            raw = resp.read()
            return resp.status, json.loads(raw) if raw.startswith(b"{") else raw.decode()
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        return exc.code, json.loads(raw) if raw.startswith(b"{") else raw.decode()
