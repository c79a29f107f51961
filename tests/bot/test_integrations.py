"""The chat platforms the app assembles (bot/integrations.py): each names a receiver routes may use and a
bot.yaml section that exists, and with no route and no credentials a platform adds no receiver and no task."""

from __future__ import annotations

import dataclasses

from bot.config import RECEIVERS, BotConfig, load_bot_config
from bot.integration import Context
from bot.integrations import CHAT, chat_integrations


def test_each_platform_names_a_receiver_and_a_section_of_bot_yaml() -> None:
    fields = {f.name for f in dataclasses.fields(BotConfig)}
    names = [cls.name for cls in CHAT]
    assert len(set(names)) == len(names)
    for cls in CHAT:
        assert cls.name in RECEIVERS, cls
        assert cls.section in fields, cls


def test_a_platform_no_route_uses_and_no_credential_names_costs_nothing(tmp_path) -> None:  # noqa: ANN001
    cfg = load_bot_config({"bot": {"port": 0, "state_path": str(tmp_path / "s.sqlite")}})
    ctx = Context(cfg)
    for integration in chat_integrations():
        assert integration.receiver(ctx) is None, integration.name
        assert integration.task(ctx) is None, integration.name


def test_a_route_to_a_platform_gives_its_receiver(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("WECOM_WEBHOOK_URL", "http://127.0.0.1:9/robot")
    cfg = load_bot_config({"bot": {"port": 0, "state_path": str(tmp_path / "s.sqlite"),
                                   "routes": [{"receiver": "wecom", "channel": "ops"}]}})
    got = {i.name: i.receiver(Context(cfg)) for i in chat_integrations()}
    assert got["wecom"] is not None and got["wecom"].name == "wecom"
    assert all(r is None for name, r in got.items() if name != "wecom")
