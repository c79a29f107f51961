"""Delivery under real faults, the real bot on loopback with its default delivery settings: one queue per
destination (as Alertmanager has one per integration), so a hung destination holds only itself.

Peers: a WeCom robot address that accepts and never answers (tests/fakes/peers.py HangingPeer), the local
DingTalk robot that checks requests as DingTalk documents (tests/fakes/dingtalk_api.py), the local Slack
API (tests/fakes/slack_api.py) through slack-sdk's real client.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from bot.delivery import Policy
from bot.receivers.dingtalk import DingTalkReceiver
from tests.fakes.bot_server import BotServer, wait_for
from tests.fakes.dingtalk_api import DingTalkRobot
from tests.fakes.im_harness import T0, Clock, ImBot
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


class FlakyDingTalk(DingTalkRobot):
    """The local DingTalk robot, down (HTTP 503) while `down`, and refusing with a 500 the messages that
    mention `refuse` (a poison message while the rest get through)."""

    down = False
    refuse = ""

    def answer(self, path: str, query: dict[str, str], raw: bytes, body: Any, now: float) -> tuple[int, dict[str, Any]]:
        if self.down or (self.refuse and self.refuse in raw.decode("utf-8", "replace")):
            return 503, {"errcode": -1, "errmsg": "system busy"}
        return super().answer(path, query, raw, body, now)


def shown_at(robot: DingTalkRobot, run: str) -> list[float]:
    return [c.at for c in robot.delivered if f"run {run}" in json.dumps(c.body, ensure_ascii=False)]


def test_a_recovered_receiver_gets_the_still_firing_error_within_60_s(tmp_path):
    """An ERROR queued while the robot is down for ten minutes (default backoff): it is held, not given up,
    and reaches the robot within 60 s of its recovery (the default cap is 30 s)."""
    async def scenario() -> None:
        clock = Clock()
        robot = FlakyDingTalk(clock)
        robot.down = True
        async with robot.serving() as base:
            rx = DingTalkReceiver(f"{base}/robot/send?access_token=robot-token", None, clock)
            bot = ImBot(tmp_path, rx, clock, policy=Policy())
            bot.ingest([event(run="run-down")])
            await bot.drain(T0 + 600, step=0.5, each=lambda: None)
            assert bot.dead() == 0 and bot.depth() == 1 and not robot.delivered
            tries = len(robot.calls)
            assert tries < 40, f"{tries} tries in 10 minutes of outage"
            robot.down = False
            back = clock.t
            await bot.drain(back + 60, step=0.5)
            (at,) = shown_at(robot, "run-down")
            assert at - back <= 30.5, f"shown {at - back:.1f} s after the robot recovered"
            bot.close()
            await rx.close()
    asyncio.run(scenario())


def test_a_dead_lettered_error_is_not_notified_its_next_event_goes_at_once(tmp_path):
    """One ERROR the robot refuses while the others get through: a dead letter after its tries. It does not
    count as notified: once the robot takes it, the job's next event of that alert is posted at once,
    not a repeat_interval (an hour) later."""
    async def scenario() -> None:
        clock = Clock()
        robot = FlakyDingTalk(clock)
        robot.refuse = "run-poison"
        async with robot.serving() as base:
            rx = DingTalkReceiver(f"{base}/robot/send?access_token=robot-token", None, clock)
            bot = ImBot(tmp_path, rx, clock, policy=Policy())
            bot.ingest([event(run="run-ok")])
            bot.ingest([event(run="run-poison")])
            await bot.drain(T0 + 600, step=1.0, each=lambda: None)
            assert shown_at(robot, "run-ok") and bot.dead() == 1 and bot.depth() == 0
            robot.refuse = ""
            bot.ingest([event(run="run-poison", step=200)])  # still firing: the job's next event of it
            await bot.drain(clock.t + 10, step=0.5)
            assert shown_at(robot, "run-poison"), "the dead-lettered ERROR counted as notified"
            bot.ingest([event(run="run-poison", step=300)])  # now it was notified: a reminder waits an hour
            await bot.drain(clock.t + 10, step=0.5)
            assert len(shown_at(robot, "run-poison")) == 1
            bot.close()
            await rx.close()
    asyncio.run(scenario())
