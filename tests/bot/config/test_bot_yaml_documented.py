"""config/bot.yaml documents every section of bot.yaml (each setting that is a group of settings) and every
key of each section (with its default or an example), so a user reading it sees every group of settings
there is; the file loads as it stands. (Every key, top-level ones included, is in docs/reference.)"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml

from bot.config import BotConfig, load_bot_config

BOT_YAML = Path(__file__).resolve().parents[3] / "config" / "bot.yaml"


def _sections(cls: type, value: Any, prefix: str) -> dict[str, set[str]]:
    """Section -> the keys it must show: the sections themselves at the top, every key inside a section."""
    top = prefix == "bot"
    out = {prefix: {f.name for f in dataclasses.fields(cls)
                    if not top or dataclasses.is_dataclass(getattr(value, f.name))}}
    for f in dataclasses.fields(cls):
        sub = getattr(value, f.name)
        if dataclasses.is_dataclass(sub) and not isinstance(sub, type):
            out.update(_sections(type(sub), sub, f"{prefix}.{f.name}"))
    return out


def _keys(node: Any, prefix: str, out: dict[str, set[str]]) -> None:
    if isinstance(node, dict):
        out.setdefault(prefix, set()).update(node)
        for k, v in node.items():
            _keys(v, f"{prefix}.{k}", out)


def test_every_section_and_key_is_in_config_bot_yaml():
    raw = yaml.safe_load(BOT_YAML.read_text())
    load_bot_config(raw)  # it loads
    shown: dict[str, set[str]] = {}
    _keys(raw["bot"], "bot", shown)
    missing = []
    for section, keys in _sections(BotConfig, BotConfig(), "bot").items():
        missing += [f"{section}.{k}" for k in sorted(keys - shown.get(section, set()))]
    assert not missing, f"config/bot.yaml does not show: {', '.join(missing)}"
