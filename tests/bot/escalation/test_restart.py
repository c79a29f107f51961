"""Escalation levels on time across restarts of a real `msmon serve` (SQLite, real time, the local Slack
API): a SIGTERM and a SIGKILL between levels move no level by more than 2 s, and a level that fell due
while the bot was down goes out once, at its start."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.fakes.bot_server import wait_for
from tests.fakes.records import envelope, event
from tests.fakes.serve_process import ServeProcess
from tests.fakes.slack_api import SlackAPIServer

LEVELS = [0, 20, 40, 60]  # seconds after the ERROR (room for a slow start of msmon serve on a busy machine)


def config(tmp_path: Any, slack: SlackAPIServer) -> dict[str, Any]:
    return {"bot": {
        "state_path": str(tmp_path / "bot.sqlite"),
        "tokens": [{"project": "llm", "env": "MSMON_TEST_TOKEN"}],
        "routes": [{"receiver": "slack", "channel": "C0ALERTS", "escalation": "oncall"}],
        "escalations": {"oncall": {"levels": [{"after": s, "mention": [f"U0LEVEL{i}"]}
                                              for i, s in enumerate(LEVELS)]}},
        "slack": {"base_url": slack.base_url},
        "console": {"charts": False}}}


def levels(slack: SlackAPIServer) -> list[tuple[int, float]]:
    """(level, when it was posted) of each escalation note."""
    out = []
    for c in slack.calls_to("chat.postMessage"):
        text = str(c.params.get("text", ""))
        if "escalation step" in text and not c.failed:
            out.append((next(i for i in range(len(LEVELS)) if f"U0LEVEL{i}" in text), c.time))
    return out


@pytest.mark.timing  # a wall-clock bound: run alone, after the rest (make unit)
def test_levels_on_time_across_sigterm_and_sigkill_and_one_due_while_down_goes_once(tmp_path):
    env = {"MSMON_TEST_TOKEN": "job-token", "SLACK_BOT_TOKEN": "xoxb-test"}
    with SlackAPIServer() as slack:
        cfg = config(tmp_path, slack)
        bot = ServeProcess(tmp_path, "bot", cfg, env)
        try:
            t0 = time.monotonic()
            assert bot.request("POST", "/v1/ingest", envelope([event()]))[0] == 202
            assert wait_for(lambda: len(levels(slack)) == 1, timeout=10)
            time.sleep(2)
            bot.stop()  # SIGTERM between levels 0 and 1
            bot = ServeProcess(tmp_path, "bot", cfg, env)
            assert wait_for(lambda: len(levels(slack)) == 2, timeout=t0 + LEVELS[1] + 5 - time.monotonic())
            time.sleep(2)
            bot.kill()  # SIGKILL between levels 1 and 2
            bot = ServeProcess(tmp_path, "bot", cfg, env)
            assert wait_for(lambda: len(levels(slack)) == 3, timeout=t0 + LEVELS[2] + 5 - time.monotonic())
            # once the bot has recorded level 2 as posted: a SIGKILL between Slack taking a post and the bot
            # recording it sends that post again after the restart (docs/delivery.md: Slack takes no idempotency
            # key), and this test is about the level due while the bot is down, not that window
            assert wait_for(lambda: bot.health().get("outbox_depth") == 0, timeout=5)
            bot.kill()  # down when level 3 falls due
            time.sleep(max(0.0, t0 + LEVELS[3] + 3 - time.monotonic()))
            back = time.monotonic()
            bot = ServeProcess(tmp_path, "bot", cfg, env)
            assert wait_for(lambda: len(levels(slack)) == 4, timeout=15)
            time.sleep(3)
            got = levels(slack)
            assert [lv for lv, _ in got] == [0, 1, 2, 3], got  # each level once, in order
            for lv, at in got[:3]:
                assert abs(at - t0 - LEVELS[lv]) <= 2.0, f"level {lv} at +{at - t0:.1f} s (due +{LEVELS[lv]} s)"
            assert got[3][1] - back <= 10.0  # the one due while down: at the start (startup included)
        finally:
            bot.stop()
