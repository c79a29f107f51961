"""bot.yaml at the edges (issue 27): each bad setting is a ConfigError naming the key and the line."""

from __future__ import annotations

import pytest

from bot.config import load_bot_config
from msmon.config.errors import ConfigError


def bot_error_of(path: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_bot_config(path)
    return str(info.value)


@pytest.fixture
def write(tmp_path):
    def _write(name: str, text: str) -> str:
        p = tmp_path / name
        p.write_text(text)
        return str(p)
    return _write


def test_a_label_route_names_its_project(write):
    msg = bot_error_of(write("bot.yaml", "bot:\n  routes:\n    - receiver: slack\n      channel: C0A\n"
                                         "      labels: {team: a}\n"))
    assert "bot.routes[0].labels" in msg and "names its project" in msg and "bot.yaml:5" in msg
    for project in ("a", "*"):
        cfg = load_bot_config({"bot": {"routes": [{"receiver": "slack", "channel": "C0A", "project": project,
                                                   "labels": {"team": "a"}}]}})
        assert cfg.routes[0].project == project
