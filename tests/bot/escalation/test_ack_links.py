"""Acknowledge links bound to their episode (the real bot, a fake clock, aiosmtpd, the local Slack API): a
second level's link after the first acknowledged answers 409 and queues nothing more for the job; the link
of a resolved episode does not acknowledge the next episode of the same run and rule (409), whose own
escalation goes on."""

from __future__ import annotations

import json
import re
import urllib.request
from typing import Any

import pytest

from msmon.contract.wire import Poll, Status, encode
from tests.fakes.bot_server import BotServer, send, wait_for
from tests.fakes.helpers import FakeClock
from tests.fakes.records import envelope, event
from tests.fakes.smtp import ESCALATION_ENV, escalating_bot_config

pytest.importorskip("aiosmtpd")

TWO_MAILS = {"levels": [{"after": 0, "email": ["oncall@example.org"]}, {"after": 60, "email": ["lead@example.org"]},
                        {"after": 600, "email": ["boss@example.org"]}]}


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in ESCALATION_ENV.items():
        monkeypatch.setenv(name, value)


def ack_path(msg: Any) -> str:
    text = msg.get_body(("plain",)).get_content()
    return "/ack/" + re.search(r"/ack/([A-Za-z0-9._-]+)", text).group(1)


def post(bot: BotServer, path: str) -> tuple[int, Any]:
    return send(urllib.request.Request(bot.url + path, data=b"", method="POST"))


def acks_for_job(bot: BotServer) -> list[dict[str, Any]]:
    code, polled = bot.request("POST", "/v1/commands/poll", encode(Poll(run_id="run-42", device="0", wait=0)))
    assert code == 200, polled
    return [c for c in polled["commands"] if c["action"] == "acknowledge"]


def test_a_link_is_bound_to_its_episode_and_works_once_per_escalation(tmp_path, slack, smtp, bot_server):
    clock = FakeClock()
    bot = bot_server(escalating_bot_config(tmp_path, slack.base_url, smtp.port, TWO_MAILS, ack_link_ttl=7200),
                     clock=clock, escalation_period=0.05)
    bot.request("POST", "/v1/ingest", envelope([event()]))
    smtp.inbox.wait(1)
    clock.advance(61)
    (_, first), (_, second) = smtp.inbox.wait(2)
    assert post(bot, ack_path(first))[0] == 200
    assert wait_for(lambda: bot.store.escalations.of()[0]["state"] == "acked", 5)
    assert len(acks_for_job(bot)) == 1
    status, page = post(bot, ack_path(second))  # the second level's link: already acknowledged
    assert status == 409 and "acknowledged already" in page
    assert len(acks_for_job(bot)) == 1  # no second acknowledge queued for the job

    bot.request("POST", "/v1/ingest", envelope([event(status=Status.RESOLVED, step=200)]))
    clock.advance(10)
    bot.request("POST", "/v1/ingest", envelope([event(step=300)]))  # a new episode of the run's rule
    assert wait_for(lambda: len(bot.store.escalations.of()) == 2, 5)
    (_, third) = smtp.inbox.wait(3)[2]
    assert "esc2" in third["Message-ID"]
    status, page = post(bot, ack_path(second))  # the old episode's link
    assert status == 409
    assert bot.store.escalations.of()[1]["state"] == "active"  # the new episode's escalation goes on
    assert not [a for a in bot.store.alerts("run-42") if a["acked_by"]], "the old link acked the new episode"
    assert len(acks_for_job(bot)) == 1, json.dumps(acks_for_job(bot))
