"""Feishu/Lark custom bot: the real bot's outbox posting interactive cards through FeishuReceiver to a
local bot webhook (tests/fakes/feishu_api.py) that checks the body's signature and timestamp window,
its schema and 20 KB, and 100 a minute / 5 a second, answering with Feishu's codes. Injected clock."""

from __future__ import annotations

import asyncio
import json

import pytest

from bot.receivers import DeliveryError, Message, Note
from bot.receivers.feishu import FeishuReceiver
from msmon.contract.wire import Event, Status
from tests.fakes.feishu_api import FeishuBot
from tests.fakes.im_harness import T0, Clock, ImBot
from tests.fakes.records import event

SECRET = "feishu-secret"


def test_a_signed_card_carries_the_alert_with_job_text_escaped(tmp_path):
    async def scenario() -> None:
        clock = Clock()
        bot_api = FeishuBot(clock, secret=SECRET)
        async with bot_api.serving() as base:
            rx = FeishuReceiver(f"{base}/open-apis/bot/v2/hook/hook-token", SECRET, clock)
            bot = ImBot(tmp_path, rx, clock)
            bot.ingest([event(run='run-1 <at id=all></at> [x](http://evil)')])
            await bot.drain(T0 + 5)
            (call,) = bot_api.delivered
            card = call.body["card"]
            assert call.body["msg_type"] == "interactive" and card["header"]["template"] == "red"
            assert card["header"]["title"]["content"].startswith("ERROR grad_norm: run run-1 <at id=all>")  # plain text
            md = card["elements"][0]["text"]["content"]
            assert "<at" not in md and "&lt;at id=all&gt;" in md and "](http" not in md
            assert "value 12 vs threshold 10" in md and "now: loss 2.4" in md and "Save a checkpoint now." in md
            bot.close()
            await rx.close()
    asyncio.run(scenario())


@pytest.mark.parametrize(("secret", "skew"), [("not-the-secret", 0.0), (SECRET, 3601.0)])
def test_a_wrong_signature_or_an_hour_old_timestamp_is_19021(secret, skew):
    async def scenario() -> None:
        clock = Clock()
        bot_api = FeishuBot(clock, secret=SECRET)
        async with bot_api.serving() as base:
            rx = FeishuReceiver(f"{base}/open-apis/bot/v2/hook/hook-token", secret, Clock(T0 - skew))
            with pytest.raises(DeliveryError, match="code 19021: sign match fail"):
                await rx.post("c", _message(event()))
            await rx.close()
    asyncio.run(scenario())


def test_a_huge_alert_is_cut_to_feishus_20_kb_and_accepted():
    async def scenario() -> None:
        clock = Clock()
        bot_api = FeishuBot(clock, secret=SECRET)
        async with bot_api.serving() as base:
            rx = FeishuReceiver(f"{base}/open-apis/bot/v2/hook/hook-token", SECRET, clock)
            e = event()
            e.hint = "<b>&" * 20_000  # 80 kB of text that escaping makes longer still
            await rx.post("c", _message(e))
            (call,) = bot_api.delivered
            assert len(call.raw) <= 20 * 1024
            assert len(json.dumps(call.body, ensure_ascii=False).encode()) <= 20 * 1024
            await rx.close()
    asyncio.run(scenario())


def test_feishus_frequency_limit_11232_is_a_retry_after_and_the_budget_keeps_5_a_second():
    async def scenario() -> None:
        clock = Clock()
        bot_api = FeishuBot(clock)
        async with bot_api.serving() as base:
            url = f"{base}/open-apis/bot/v2/hook/hook-token"
            rx = FeishuReceiver(url, None, clock)
            for _ in range(5):
                await rx.note(Note(text="c1 done"))
            with pytest.raises(DeliveryError, match="held"):  # the 6th in the same second waits, unsent
                await rx.note(Note(text="c2 done"))
            assert len(bot_api.calls) == 5
            other = FeishuReceiver(url, None, clock)  # another sender on the same bot: Feishu refuses it
            with pytest.raises(DeliveryError, match="code 11232") as info:
                await other.note(Note(text="c3 done"))
            assert info.value.retry_after == 60.0
            await rx.close()
            await other.close()
    asyncio.run(scenario())


def test_an_unknown_hook_token_is_named():
    async def scenario() -> None:
        clock = Clock()
        bot_api = FeishuBot(clock)
        async with bot_api.serving() as base:
            rx = FeishuReceiver(f"{base}/open-apis/bot/v2/hook/wrong", None, clock)
            with pytest.raises(DeliveryError, match="code 19001: param invalid: incoming webhook access token"):
                await rx.post("c", _message(event()))
            await rx.close()
    asyncio.run(scenario())


def _message(e: Event) -> Message:
    return Message(key="k", run_id=e.run_id, project="llm", rule=e.rule, severity=e.severity, status=Status.FIRING,
                   events=[e])
