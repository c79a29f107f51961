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

from bot.app import INGEST, OUTBOX, STORE, create_app
from bot.chat.dingtalk.receiver import DingTalkReceiver
from bot.chat.wecom.receiver import WeComReceiver
from bot.config import load_bot_config
from bot.pipeline.schedule import Policy
from bot.receivers.console import ConsoleReceiver
from msmon.contract.wire import Envelope
from tests.fakes.bot_server import wait_for
from tests.fakes.dingtalk_api import DingTalkRobot
from tests.fakes.im_harness import T0, Clock, ImBot
from tests.fakes.peers import HangingPeer, ThreadedRobot
from tests.fakes.records import envelope, event
from tests.fakes.slack_api import SlackAPIServer
from tests.fakes.wecom_api import WeComRobot


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


@pytest.mark.timing  # a wall-clock bound: run alone, after the rest (make unit)
def test_a_hanging_destination_delays_no_other_by_more_than_a_second(tmp_path, peers, bot_server):
    hung, dt, slack = peers
    bot = bot_server(config(tmp_path, slack))
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
    # the hung robot's rows wait, kept (the others' are settled once their charts' uploads are done)
    assert wait_for(lambda: bot.request("GET", "/healthz")[1]["outbox_depth"] == 3, timeout=10)


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


@pytest.mark.parametrize("platform", ["dingtalk", "wecom"])
def test_a_storm_of_200_errors_a_minute_to_one_robot_is_all_shown_within_120_s(tmp_path, platform):
    """The bot's default settings (rate limits, backoff, charts) and the local robot's 20 a minute: 200
    ERRORs of distinct runs over a minute are all shown (alone or in a summary) within 120 s, the robot never
    refuses one (its throttle never starts), and a held message's retries spend none of the tokens the
    summaries need. (bench/bench_storm.py measures the same in real time.)"""
    async def scenario() -> None:
        clock = Clock()
        robot = DingTalkRobot(clock) if platform == "dingtalk" else WeComRobot(clock)
        async with robot.serving() as base:
            rx: Any = DingTalkReceiver(f"{base}/robot/send?access_token=robot-token", None, clock) \
                if platform == "dingtalk" else WeComReceiver(f"{base}/cgi-bin/webhook/send?key=robot-key", clock)
            cfg = load_bot_config({"bot": {"state_path": str(tmp_path / "bot.sqlite"),
                                           "routes": [{"receiver": platform}],
                                           "console": {"charts_dir": str(tmp_path / "charts")}}})
            app = create_app(cfg, clock=clock, receivers={"console": ConsoleReceiver(None), platform: rx})
            runs = [f"run-{i:03d}" for i in range(200)]
            for i, run in enumerate(runs):
                clock.t = T0 + i * 0.3
                app[INGEST].envelope(Envelope(run_id=run, device="0", sent_at=clock.t, project="llm",
                                              events=[event(run=run)]))
                await app[OUTBOX].deliver_due()
            while clock.t < T0 + 120 and app[STORE].depth():
                clock.t += 0.5
                await app[OUTBOX].deliver_due()
            text = " ".join(json.dumps(c.body, ensure_ascii=False) for c in robot.delivered)
            missing = [r for r in runs if f"run {r}," not in text]
            assert not missing, f"{len(missing)} of 200 not shown within 120 s"
            assert all(c.ok for c in robot.calls), "the robot refused a message: its throttle started"
            app[STORE].close()
            await rx.close()
    asyncio.run(scenario())


@pytest.mark.parametrize(("platform", "code"), [("dingtalk", 310000), ("wecom", 93000)])
def test_a_permanent_refusal_is_a_dead_letter_at_once_saying_what_to_fix(tmp_path, platform, code, caplog):
    """DingTalk's 310000 (a robot signed with a secret the bot does not have) and WeCom's 93000 (a key that
    is no robot's) cannot succeed on a retry: one try, a dead letter that names the code and the fix."""
    async def scenario() -> None:
        clock = Clock()
        robot = DingTalkRobot(clock, secret="SEC-robot") if platform == "dingtalk" else WeComRobot(clock)
        async with robot.serving() as base:
            rx: Any = DingTalkReceiver(f"{base}/robot/send?access_token=robot-token", None, clock) \
                if platform == "dingtalk" else WeComReceiver(f"{base}/cgi-bin/webhook/send?key=removed", clock)
            bot = ImBot(tmp_path, rx, clock, policy=Policy())
            bot.ingest([event(run="run-7")])
            await bot.drain(T0 + 60, step=1.0, each=lambda: None)
            assert len(robot.calls) == 1 and bot.dead() == 1 and bot.depth() == 0
            bot.close()
            await rx.close()
    asyncio.run(scenario())
    dead = [r.getMessage() for r in caplog.records if "dead letter:" in r.getMessage()]
    assert dead and f"code {code}" in dead[0] and "permanent: " in dead[0]
