"""Slack's HTTP runs on the receivers' own loop (bot/receivers/offloop.py): a message reaches Slack while the bot's
loop is busy (the ingest under load), and Slack's errors still come back to the caller as DeliveryErrors."""

from __future__ import annotations

import asyncio
import time

import pytest

from bot.chat.slack.receiver import SlackReceiver
from bot.receivers import DeliveryError, Message
from msmon.contract.wire import Severity, Status
from tests.fakes.records import event
from tests.fakes.slack_api import SlackAPIServer

BUSY = 2.0  # seconds the caller's loop is held after the post is started


def message(run: str) -> Message:
    return Message(key=f"{run}|grad_norm", run_id=run, project="llm", rule="grad_norm", severity=Severity.ERROR,
                   status=Status.FIRING, events=[event(run=run)])


def test_a_post_reaches_slack_while_the_bots_loop_is_busy(slack: SlackAPIServer) -> None:
    async def main() -> tuple[str, float]:
        receiver = SlackReceiver("xoxb-test-token", slack.base_url, max_retries=0)
        post = asyncio.create_task(receiver.post("C0ALERTS", message("run-busy")))
        await asyncio.sleep(0)  # the post starts ...
        busy_from = time.monotonic()
        time.sleep(BUSY)  # ... and the loop is held, as envelopes hold it (no step of this loop runs meanwhile)
        return await post, busy_from

    ts, busy_from = asyncio.run(main())
    call = slack.calls_to("chat.postMessage")[0]
    assert call.time < busy_from + BUSY, "the post waited for the bot's loop"
    assert ts == call.response["ts"]


def test_slacks_refusal_comes_back_to_the_caller(slack: SlackAPIServer) -> None:
    slack.fail("chat.postMessage", status=429, retry_after=7)

    async def main() -> None:
        await SlackReceiver("xoxb-test-token", slack.base_url, max_retries=0).post("C0ALERTS", message("run-429"))

    with pytest.raises(DeliveryError) as err:
        asyncio.run(main())
    assert err.value.retry_after == 7.0 and "chat.postMessage" in str(err.value)
