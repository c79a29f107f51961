"""WeCom group robot: the real bot's outbox posting markdown and the chart (a real matplotlib PNG, base64
with its MD5) through WeComReceiver to a local robot (tests/fakes/wecom_api.py) that checks the key, the
4,096-byte markdown, the image's size and MD5 and 20 a minute, answering with WeCom's errcodes."""

from __future__ import annotations

import asyncio
import hashlib

import pytest

from bot.chat.wecom.receiver import WeComReceiver
from bot.receivers import DeliveryError
from tests.fakes.im_harness import T0, Clock, ImBot, message
from tests.fakes.records import event
from tests.fakes.wecom_api import WeComRobot


def test_an_error_arrives_as_markdown_then_its_chart_as_an_image(tmp_path):
    async def scenario() -> None:
        clock = Clock()
        robot = WeComRobot(clock)
        async with robot.serving() as base:
            rx = WeComReceiver(f"{base}/cgi-bin/webhook/send?key=robot-key", clock)
            bot = ImBot(tmp_path, rx, clock, charts=True)
            bot.ingest([event(run="run-7 <@ceo> <font color=\"warning\">x</font>")])
            await bot.drain(T0 + 5)
            text, image = robot.delivered
            md = text.body["markdown"]["content"]
            assert "<@ceo>" not in md and "<font" not in md and "&lt;@\u2060ceo&gt;" in md
            assert "**ERROR grad\\_norm: run run-7" in md and "value 12 vs threshold 10" in md
            (png,) = robot.images()
            assert png.startswith(b"\x89PNG") and image.body["image"]["md5"] == hashlib.md5(png).hexdigest()
            assert bot.depth() == 0
            bot.close()
            await rx.close()
    asyncio.run(scenario())


def test_markdown_is_cut_to_4096_bytes_of_utf8():
    async def scenario() -> None:
        clock = Clock()
        robot = WeComRobot(clock)
        async with robot.serving() as base:
            rx = WeComReceiver(f"{base}/cgi-bin/webhook/send?key=robot-key", clock)
            e = event()
            e.hint = "梯度爆炸 " * 2000  # 26 kB of UTF-8
            await rx.post("c", message(e))
            (call,) = robot.delivered
            assert len(call.body["markdown"]["content"].encode()) <= 4096
            await rx.close()
    asyncio.run(scenario())


def test_wecoms_limit_45009_is_a_retry_after_and_a_bad_key_is_93000():
    async def scenario() -> None:
        clock = Clock()
        robot = WeComRobot(clock)
        robot.rate.limit = 0  # another sender used the robot's minute
        async with robot.serving() as base:
            rx = WeComReceiver(f"{base}/cgi-bin/webhook/send?key=robot-key", clock)
            with pytest.raises(DeliveryError, match="code 45009") as info:
                await rx.post("c", message(event()))
            assert info.value.retry_after == 60.0
            bad = WeComReceiver(f"{base}/cgi-bin/webhook/send?key=nope", clock)
            with pytest.raises(DeliveryError, match="code 93000: invalid webhook url"):
                await bad.post("c", message(event()))
            await rx.close()
            await bad.close()
    asyncio.run(scenario())

