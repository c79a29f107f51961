"""DingTalk custom robot: the real bot's outbox posting through DingTalkReceiver to a local robot server
(tests/fakes/dingtalk_api.py) that checks the signed URL, the timestamp window, the body and DingTalk's
20-a-minute limit with its 10-minute throttle, as DingTalk does. All on an injected clock."""

from __future__ import annotations

import asyncio
import logging

import pytest

from bot.chat.dingtalk.receiver import DingTalkReceiver
from bot.receivers import DeliveryError
from msmon.contract.wire import Severity
from tests.fakes.dingtalk_api import DingTalkRobot
from tests.fakes.im_harness import T0, Clock, ImBot, message
from tests.fakes.records import event

SECRET = "SECtest0123456789"


def test_200_errors_in_a_minute_make_at_most_20_posts_and_lose_none(tmp_path, caplog):
    """Held rows are deferred, not failed: no delivery error is logged, none is near a dead letter."""
    async def scenario() -> None:
        clock = Clock()
        robot = DingTalkRobot(clock, secret=SECRET)
        async with robot.serving() as base:
            rx = DingTalkReceiver(f"{base}/robot/send?access_token=robot-token", SECRET, clock)
            bot = ImBot(tmp_path, rx, clock)
            runs = [f"run-{i:03d}" for i in range(200)]
            queue = list(runs)

            def arrive() -> None:  # 200 ERRORs spread over the first minute, one every 0.3 s
                while queue and clock.t >= T0 + 0.3 * (200 - len(queue)):
                    bot.ingest([event(run=queue.pop(0))])

            await bot.drain(T0 + 60.0, step=0.3, each=arrive)
            await bot.drain(T0 + 1200.0, step=1.0)
            assert not robot.calls or all(c.answer["errcode"] != 130101 for c in robot.calls), "throttled"
            posts = robot.delivered
            assert len([c for c in posts if c.at < T0 + 60.0]) <= 20
            for start in (c.at for c in posts):  # no 60 s window holds more than DingTalk's 20
                assert len([c for c in posts if start <= c.at < start + 60.0]) <= 20
            shown = "\n".join(c.body["markdown"]["text"] for c in posts)
            missing = [r for r in runs if f"run {r}" not in shown]
            assert not missing, f"lost: {missing[:5]}"
            assert bot.depth() == 0 and bot.dead() == 0
            assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text[:500]
            assert sum("held back" in c.body["markdown"]["title"] for c in posts) >= 1
            print(f"\n200 ERRORs: {len(posts)} posts ({len([c for c in posts if c.at < T0 + 60])} in the first "
                  f"minute), last at +{posts[-1].at - T0:.0f} s")
            bot.close()
            await rx.close()
    asyncio.run(scenario())


def test_a_signed_markdown_alert_ats_the_oncall_and_escapes_job_text(tmp_path):
    async def scenario() -> None:
        clock = Clock()
        robot = DingTalkRobot(clock, secret=SECRET)
        async with robot.serving() as base:
            rx = DingTalkReceiver(f"{base}/robot/send?access_token=robot-token", SECRET, clock,
                                  at_mobiles=["13800000000"])
            bot = ImBot(tmp_path, rx, clock)
            bot.ingest([event(run="run-[x](http://evil) @13911112222")])
            await bot.drain(T0 + 5)
            (call,) = robot.delivered
            assert call.body["msgtype"] == "markdown"
            assert call.body["at"] == {"atMobiles": ["13800000000"], "atUserIds": [], "isAtAll": False}
            text = call.body["markdown"]["text"]
            assert text.endswith("@13800000000") and "](http" not in text and "@13911112222" not in text
            assert "value 12 vs threshold 10" in text and "what to do: Save a checkpoint now." in text
            bot.ingest([event(run="run-w", sev=Severity.WARNING)])
            await bot.drain(T0 + 10)
            assert robot.delivered[-1].body["at"] == {"isAtAll": False}
            bot.close()
            await rx.close()
    asyncio.run(scenario())


@pytest.mark.parametrize(("secret", "skew", "errmsg"), [
    ("SECwrong", 0.0, "sign not match"),
    (SECRET, 2 * 3600.0, "invalid timestamp"),
])
def test_a_bad_signature_or_a_stale_clock_is_refused_with_dingtalks_code(secret, skew, errmsg):
    async def scenario() -> None:
        clock = Clock()
        robot = DingTalkRobot(clock, secret=SECRET)
        async with robot.serving() as base:
            rx = DingTalkReceiver(f"{base}/robot/send?access_token=robot-token", secret, Clock(T0 - skew))
            with pytest.raises(DeliveryError, match=f"code 310000: {errmsg}"):
                await rx.post("oncall", message(event()))
            await rx.close()
    asyncio.run(scenario())


def test_dingtalks_throttle_is_a_retry_after_of_ten_minutes():
    async def scenario() -> None:
        clock = Clock()
        robot = DingTalkRobot(clock)
        robot.rate.limit = 0  # another sender used the robot's minute
        async with robot.serving() as base:
            rx = DingTalkReceiver(f"{base}/robot/send?access_token=robot-token", None, clock)
            with pytest.raises(DeliveryError, match="130101") as info:
                await rx.post("oncall", message(event()))
            assert info.value.retry_after == 600.0
            await rx.close()
    asyncio.run(scenario())



# -- commands: the enterprise robot's signed message callback, through the real bot on loopback -----------

APP_SECRET = "app-secret-0123"


def _commands_bot(bot_server, tmp_path):

    return bot_server({"bot": {
        "port": 0, "state_path": str(tmp_path / "bot.sqlite"),
        "tokens": [{"project": "llm", "env": "MSMON_TEST_TOKEN"}],
        "routes": [{"receiver": "dingtalk", "channel": "cid-team"}],
        "pipeline": {"group_wait": 0.0},
        "commands": {"allow": [{"project": "llm", "users": ["dingtalk:alice01"]}]},
        "console": {"charts": False}}})


def _callback(bot, headers, body):
    import urllib.request

    from tests.fakes.bot_server import send

    return send(urllib.request.Request(bot.url + "/dingtalk/callback", data=body, method="POST", headers=headers))


def _reported_bot(bot_server, tmp_path, monkeypatch):
    """The commands bot with its AppSecret, run-42 of project llm reported to it."""
    from tests.fakes.records import envelope

    monkeypatch.setenv("MSMON_TEST_TOKEN", "job-token")
    monkeypatch.setenv("DINGTALK_APP_SECRET", APP_SECRET)
    bot = _commands_bot(bot_server, tmp_path)
    assert bot.request("POST", "/v1/ingest", envelope([event()]))[0] == 202
    return bot


def test_an_allowed_users_pause_is_answered_at_once_and_a_strangers_refused(tmp_path, monkeypatch, bot_server):
    import time

    from tests.fakes.dingtalk_api import callback_request

    bot = _reported_bot(bot_server, tmp_path, monkeypatch)
    try:
        now = int(time.time() * 1000)
        status, answer = _callback(bot, *callback_request("pause run-42", APP_SECRET, now))
        assert status == 200 and answer["msgtype"] == "markdown"
        assert "\\`pause run-42\\` queued as c1" in answer["markdown"]["text"]
        status, answer = _callback(bot, *callback_request("stop run-42 confirm", APP_SECRET, now + 1,
                                                          staff_id="mallory", msg_id="msg-2"))
        assert "may not \\`stop\\` runs of project llm" in answer["markdown"]["text"]
        assert _callback(bot, *callback_request("pause run-42", APP_SECRET, now + 2))[1] == {}  # msg-1 again: once
        assert _callback(bot, *callback_request("pause run-42", "wrong", now + 3, msg_id="m3"))[0] == 401
        assert _callback(bot, *callback_request("pause run-42", APP_SECRET, now - 3_700_000, msg_id="m4"))[0] == 401
    finally:
        bot.stop()


def test_a_commands_later_result_goes_to_the_conversations_session_webhook(tmp_path):
    from bot.receivers import Note, ReplyTo

    async def scenario() -> None:
        clock = Clock()
        robot = DingTalkRobot(clock, secret=SECRET)
        async with robot.serving() as base:
            rx = DingTalkReceiver(f"{base}/robot/send?access_token=robot-token", SECRET, clock)
            await rx.note(Note(text="c1 done: device 0 OK at step 648",
                               reply_to=ReplyTo(channel="cid-team", url=f"{base}/robot/sendBySession?session=s-team")))
            await rx.note(Note(text="c2 done", reply_to=ReplyTo(url="http://elsewhere.example/robot/x")))
            first, second = robot.delivered
            assert first.path.endswith("/sendBySession") and "c1 done" in first.body["markdown"]["text"]
            assert second.path.endswith("/robot/send")  # not the robot's host: the robot's own webhook
            await rx.close()
    asyncio.run(scenario())


def test_the_chart_goes_as_an_actioncard_opening_its_signed_link(tmp_path):
    from bot.charts.links import ChartLinks

    async def scenario() -> None:
        clock = Clock()
        robot = DingTalkRobot(clock, secret=SECRET)
        async with robot.serving() as base:
            links = ChartLinks(b"link-key", 3600.0, tmp_path / "links", "http://bot.example", clock)
            rx = DingTalkReceiver(f"{base}/robot/send?access_token=robot-token", SECRET, clock, links=links)
            bot = ImBot(tmp_path, rx, clock, charts=True)
            bot.ingest([event()])
            await bot.drain(T0 + 5)
            alert, chart = robot.delivered
            card = chart.body["actionCard"]
            assert chart.body["msgtype"] == "actionCard" and card["singleURL"].startswith("http://bot.example/charts/")
            path = links.check(card["singleURL"].rsplit("/", 1)[1])
            assert not isinstance(path, str) and path.read_bytes().startswith(b"\x89PNG")
            bot.close()
            await rx.close()
    asyncio.run(scenario())


def test_a_captured_timestamp_and_sign_carry_no_second_body_and_msg_ids_outlive_a_restart(tmp_path, monkeypatch,
                                                                                          bot_server):
    """DingTalk's sign covers the timestamp only: one (timestamp, sign) pair is taken once, whatever body
    comes with it; a 6-minute-old pair is stale; a msgId counts once, after a restart too."""
    import time

    from tests.fakes.dingtalk_api import callback_request

    bot = _reported_bot(bot_server, tmp_path, monkeypatch)
    now = int(time.time() * 1000)
    headers, body = callback_request("pause run-42", APP_SECRET, now, msg_id="m-1")
    assert "queued as c1" in _callback(bot, headers, body)[1]["markdown"]["text"]
    for i, text in enumerate(["scale-lr run-42 0.5", "scale-lr run-42 0.25", "resume run-42"]):
        _, other = callback_request(text, APP_SECRET, now, msg_id=f"forged-{i}")
        assert _callback(bot, headers, other)[0] == 401  # the captured pair with a new body
    assert _callback(bot, *callback_request("scale-lr run-42 0.5", APP_SECRET, now - 360_000,
                                            msg_id="m-old"))[0] == 401
    assert len(bot.store.commands.recent()) == 1
    bot.stop()
    bot = _commands_bot(bot_server, tmp_path)
    now = int(time.time() * 1000) + 5
    assert _callback(bot, *callback_request("pause run-42", APP_SECRET, now, msg_id="m-1")) == (200, {})
    assert _callback(bot, *callback_request("resume run-42", APP_SECRET, now + 1, msg_id="m-2"))[0] == 200
    assert len(bot.store.commands.recent()) == 2
