"""Digests in the real bot: per channel on a cron expression, active runs with progress, loss trend and
ETA, alerts raised and acknowledged since the last digest; a `receiver: digest` route holds WARNINGs
for it instead of posting them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from bot.app import DIGESTS, ESCALATOR
from bot.config import load_bot_config
from msmon.config.errors import ConfigError
from msmon.contract.wire import Envelope, Heartbeat, Sample, Severity, encode
from tests.fakes.bot_server import BotServer, wait_for
from tests.fakes.records import event
from tests.fakes.slack_api import SlackAPIServer

DIGEST = {"channel": "C0ALERTS", "receiver": "slack", "cron": "0 9 * * 1-5", "timezone": "Europe/Berlin"}


@pytest.fixture
def bot(tmp_path, slack, monkeypatch, bot_server) -> Iterator[BotServer]:
    monkeypatch.setenv("MSMON_TEST_TOKEN", "job-token")
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-test")
    b = bot_server({"bot": {
        "port": 0, "state_path": str(tmp_path / "bot.sqlite"),
        "tokens": [{"project": "llm", "env": "MSMON_TEST_TOKEN"}],
        "routes": [{"receiver": "digest", "channel": "C0ALERTS", "severity": "WARNING"},
                   {"receiver": "slack", "channel": "C0ALERTS"}],
        "digests": [DIGEST], "slack": {"base_url": slack.base_url, "max_retries": 0},
        "pipeline": {"group_wait": 0.1}, "rate_limit": {"per_channel": 50, "per_run": 50, "burst": 20}}})
    yield b


def digest_now(bot: BotServer) -> None:
    """Run the digest job as its cron trigger would, on the bot's loop."""
    digests = bot.app[DIGESTS]
    cfg = bot.cfg.digests[0]
    asyncio.run_coroutine_threadsafe(digests._tick(cfg), bot.loop).result(10)


def digests(slack: SlackAPIServer) -> list[str]:
    return [m["text"] for m in slack.messages() if "msmon digest" in m.get("text", "")]


def test_a_digest_per_channel_with_runs_alerts_and_the_warnings_held_for_it(bot, slack):
    samples = [Sample(run_id="run-42", device="0", step=s, time=time.time() - 300 + s, loss=3.0 - s / 400)
               for s in range(0, 800, 10)]
    hb = Heartbeat(run_id="run-42", device="0", time=time.time(), step=790, total_steps=10_000)
    warn = event(rule="grad_norm_creep", sev=Severity.WARNING, value=1.6)
    env = Envelope(run_id="run-42", device="0", sent_at=time.time(), project="llm", samples=samples,
                   heartbeats=[hb], events=[warn, event(step=790)])
    assert bot.request("POST", "/v1/ingest", encode(env))[0] == 202
    assert wait_for(lambda: any(m["text"].startswith("ERROR grad_norm") for m in slack.messages()), 5)
    time.sleep(0.5)
    assert not [m for m in slack.messages() if "grad_norm_creep" in m["text"]]  # held for the digest
    assert bot.store.escalations.held("C0ALERTS", 0.0)
    digest_now(bot)
    assert wait_for(lambda: len(digests(slack)) == 1, 5)
    text = digests(slack)[0]
    assert "Active runs: 1" in text and "run-42 (llm): step 790 of 10,000 (8%)" in text and "loss " in text
    assert "Alerts since the last digest: 1 ERROR, 1 WARNING" in text
    assert "WARNINGs held for this digest: 1" in text and "grad_norm_creep" in text
    digest_now(bot)  # nothing new since the first
    assert wait_for(lambda: len(digests(slack)) == 2, 5)
    assert "WARNINGs held" not in digests(slack)[1] and "0 ERROR, 0 WARNING" in digests(slack)[1]


def test_the_digest_runs_on_its_cron_expression(bot):
    job = bot.app[ESCALATOR].scheduler.get_job("digest-0")
    nxt = job.next_run_time
    assert (nxt.hour, nxt.minute) == (9, 0) and nxt.weekday() < 5 and str(nxt.tzinfo) == "Europe/Berlin"


def test_a_bad_cron_expression_is_a_config_error_with_key_and_line(tmp_path):
    path = tmp_path / "bot.yaml"
    path.write_text("bot:\n  digests:\n    - channel: C1\n      cron: '0 25 * * *'\n")
    with pytest.raises(ConfigError) as err:
        load_bot_config(path)
    assert "bot.digests[0].cron" in str(err.value) and "bot.yaml:4" in str(err.value)
