"""Delivery under real faults, the real bot on loopback with its default delivery settings: one queue per
destination (as Alertmanager has one per integration), so a hung destination holds only itself.

Peers: a WeCom robot address that accepts and never answers (tests/fakes/peers.py HangingPeer), the local
DingTalk robot that checks requests as DingTalk documents (tests/fakes/dingtalk_api.py), the local Slack
API (tests/fakes/slack_api.py) through slack-sdk's real client.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.fakes.bot_server import BotServer, wait_for
from tests.fakes.dingtalk_api import DingTalkRobot
from tests.fakes.peers import HangingPeer, ThreadedRobot
from tests.fakes.records import envelope, event
from tests.fakes.slack_api import SlackAPIServer


def config(tmp_path: Any, slack: SlackAPIServer) -> dict[str, Any]:
    """Defaults everywhere (rate limits, backoff, timeouts, charts) but where the alerts go."""
    return {"bot": {
        "port": 0, "state_path": str(tmp_path / "bot.sqlite"),
        "tokens": [{"project": "*", "env": "MSMON_TEST_TOKEN"}],
        "routes": [{"receiver": "wecom", "project": "hung"}, {"receiver": "dingtalk", "project": "dt"},
                   {"receiver": "slack", "channel": "C0ALERTS", "project": "sl"}],
        "slack": {"base_url": slack.base_url},
        "console": {"charts_dir": str(tmp_path / "charts")}}}


@pytest.fixture
def peers(monkeypatch, slack):
    with HangingPeer() as hung, ThreadedRobot(DingTalkRobot(time.time)) as dt:
        monkeypatch.setenv("MSMON_TEST_TOKEN", "job-token")
        monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-test-token")
        monkeypatch.setenv("WECOM_WEBHOOK_URL", f"{hung.url}/cgi-bin/webhook/send?key=robot-key")
        monkeypatch.setenv("DINGTALK_WEBHOOK_URL", f"{dt.url}/robot/send?access_token=robot-token")
        yield hung, dt.robot, slack


def dingtalk_shown(robot: DingTalkRobot, run: str) -> float | None:
    return next((c.at for c in robot.delivered if run in str(c.body)), None)


def slack_shown(slack: SlackAPIServer, run: str) -> bool:
    return any(f"run {run}," in str(c.params.get("text", "")) for c in slack.calls_to("chat.postMessage"))


def test_a_hanging_destination_delays_no_other_by_more_than_a_second(tmp_path, peers):
    hung, dt, slack = peers
    bot = BotServer(config(tmp_path, slack))
    try:
        for i in range(3):  # three alerts for the hung robot: its lane is busy for three timeouts
            assert bot.request("POST", "/v1/ingest", envelope([event(run=f"run-h{i}")], run=f"run-h{i}",
                                                               project="hung"))[0] == 202
        assert wait_for(lambda: hung.connections >= 1, timeout=5)
        for i in range(3):  # while it hangs, each other destination's ERROR goes at once
            t0 = time.time()
            for project, run in (("dt", f"run-d{i}"), ("sl", f"run-s{i}")):
                assert bot.request("POST", "/v1/ingest", envelope([event(run=run)], run=run, project=project))[0] == 202
            assert wait_for(lambda i=i: dingtalk_shown(dt, f"run-d{i}") is not None and slack_shown(slack, f"run-s{i}"),
                            timeout=8), "an ERROR for another destination waited behind the hung WeCom robot"
            shown = time.time() - t0
            assert shown < 1.0, f"ERRORs to DingTalk and Slack took {shown:.2f} s while WeCom hung"
            time.sleep(1.0)
        assert bot.request("GET", "/healthz")[1]["outbox_depth"] == 3  # the hung robot's rows wait, kept
    finally:
        bot.stop()
