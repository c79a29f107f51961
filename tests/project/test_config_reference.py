"""docs/reference/ is the config schema's own word: the committed pages equal what tools/config_reference.py
writes from the code (every key of monitor_config and bot.yaml, with type, default, bounds and meaning). After
changing a setting: `.venv/bin/python tools/config_reference.py`."""

from __future__ import annotations

import importlib.util
import sys

from tests.conftest import ROOT


def _tool():
    spec = importlib.util.spec_from_file_location("config_reference", ROOT / "tools" / "config_reference.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("config_reference", mod)
    spec.loader.exec_module(mod)
    return mod


def test_the_committed_reference_is_what_the_schema_says() -> None:
    for path, text in _tool().pages().items():
        assert path.exists(), f"{path} is missing: run .venv/bin/python tools/config_reference.py"
        assert path.read_text() == text, f"{path.relative_to(ROOT)} differs from the code: run " \
            ".venv/bin/python tools/config_reference.py"


def test_every_key_of_both_schemas_is_in_the_reference() -> None:
    import dataclasses

    from bot.config import BotConfig
    from notifier.config.model import MonitorConfig

    pages = {p.name: p.read_text() for p in (ROOT / "docs" / "reference").glob("*.md")}
    for cls, page in ((MonitorConfig, "monitor-config.md"), (BotConfig, "bot-yaml.md")):
        for f in dataclasses.fields(cls):
            if f.init and not f.metadata.get("internal"):
                assert f"| `{f.name}` |" in pages[page], (page, f.name)
    assert "## `bot.pipeline`" in pages["bot-yaml.md"] and "| `group_wait` |" in pages["bot-yaml.md"]
    assert "## `monitor_config.alert.rules.loss_spike`" in pages["monitor-config.md"]  # each rule's own keys
