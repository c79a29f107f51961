"""A chat message's "open in msmon" link (bot/receivers/render.py, the Slack blocks, bot/web.console_link)."""

from __future__ import annotations

from bot.chat.slack.receiver import blocks
from bot.config import load_bot_config
from bot.receivers import Message
from bot.receivers.render import console_url, escape_slack, text
from bot.web import console_link
from tests.fakes.records import event


def _msg(run: str, link: str | None) -> Message:
    e = event(run=run)
    return Message(key="k", run_id=run, project="llm", rule=e.rule, severity=e.severity, status=e.status,
                   events=[e], link=link)


def test_the_link_carries_the_run_id_percent_encoded():
    assert console_url("https://m.example/", "a/b <c>|d") == "https://m.example/console/runs/a%2Fb%20%3Cc%3E%7Cd"


def test_text_and_slack_blocks_say_open_in_msmon_only_with_a_link():
    run = "<!channel>|x"
    url = console_url("https://m.example", run)
    with_link, without = _msg(run, url), _msg(run, None)
    assert text(with_link, escape_slack).endswith(f"open in msmon: {url}")
    assert "open in msmon" not in text(without, escape_slack)
    contexts = [b for b in blocks(with_link) if b["type"] == "context"]
    assert {"type": "mrkdwn", "text": f"<{url}|Open in msmon>"} in contexts[-1]["elements"]
    assert not any("Open in msmon" in str(b) for b in blocks(without))


def test_console_link_needs_the_console_on_and_a_public_url():
    def cfg(web: dict) -> object:
        return load_bot_config({"bot": {"console": {"web": web}}})

    assert console_link(cfg({})) is None  # type: ignore[arg-type]
    assert console_link(cfg({"public_url": "https://m.example", "enabled": False})) is None  # type: ignore[arg-type]
    link = console_link(cfg({"public_url": "https://m.example"}))  # type: ignore[arg-type]
    assert link is not None and link("r 1") == "https://m.example/console/runs/r%201"
