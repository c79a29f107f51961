"""The real bot under an induced overload (its event loop held busy, as a saturating ingest does): envelopes are
still taken (202), their ERRORs reach the chat at once, samples and WARNINGs are shed and counted, and the change of
level is logged once, not per request (bot/ingest/overload.py)."""

from __future__ import annotations

import logging
import time

import pytest

from bot.app import STATE
from msmon.contract.wire import Envelope, Severity, encode
from tests.fakes.bot_server import BotServer, wait_for
from tests.fakes.records import event, sample

pytest.importorskip("aiohttp")


def _envelope(events, samples, run="run-1") -> bytes:
    return encode(Envelope(run_id=run, device="0", sent_at=time.time(), project="llm", events=list(events),
                           samples=list(samples)))


def _level(bot: BotServer) -> str:
    return bot.request("GET", "/healthz", token=None)[1]["overload"]["level"]


def _busy(bot: BotServer, seconds: float, each: float) -> None:
    """Keep the bot's event loop busy for `seconds`, `each` seconds at a time (as a saturating ingest does, one
    handler after another): its lag is measured, nothing else is told."""
    end = time.monotonic() + seconds

    def hold() -> None:
        time.sleep(each)
        if time.monotonic() < end:
            bot.loop.call_later(0.001, hold)

    bot.loop.call_soon_threadsafe(hold)


@pytest.fixture
def bot(tmp_path, slack, monkeypatch, bot_server):
    monkeypatch.setenv("MSMON_TEST_TOKEN", "job-token")
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-test-token")
    b = bot_server({"bot": {
        "port": 0, "state_path": str(tmp_path / "bot.sqlite"),
        "tokens": [{"project": "llm", "env": "MSMON_TEST_TOKEN"}],
        "routes": [{"receiver": "slack", "channel": "C0ALERTS"}], "slack": {"base_url": slack.base_url},
        "pipeline": {"group_wait": 0.2}, "console": {"charts_dir": str(tmp_path / "charts")},
        "overload": {"samples_lag": 0.1, "warnings_lag": 0.25, "cool": 2.0}}})
    yield b


def test_overloaded_the_error_goes_through_samples_and_warnings_are_shed_and_said_once(bot, slack, caplog):
    caplog.set_level(logging.INFO, logger="msmon.bot")
    status, answer = bot.request("POST", "/v1/ingest", _envelope([], [sample(1)]))
    assert status == 202 and "shed" not in answer and _level(bot) == "normal"

    _busy(bot, 9.0, each=0.3)  # the median of 40 lags over warnings_lag (0.25 s): straight to shedding WARNINGs
    assert wait_for(lambda: _level(bot) == "warnings", timeout=15)
    warn = event(run="run-1", rule="loss_spike", sev=Severity.WARNING, value=6.0)
    err = event(run="run-1")
    status, answer = bot.request("POST", "/v1/ingest", _envelope([warn, err], [sample(s) for s in range(102, 105)]))
    assert status == 202, answer
    assert answer["shed"] == {"samples": 3, "warnings": 1}
    assert answer["queued"] == 1
    for i in range(5):  # more requests while overloaded: no line each
        assert bot.request("POST", "/v1/ingest", _envelope([], [sample(110 + i)]))[0] == 202

    assert wait_for(lambda: any("ERROR grad_norm" in m["text"] for m in slack.messages()), timeout=10)
    page = next(m for m in slack.messages() if "ERROR grad_norm" in m["text"])
    assert "chart could not be drawn: the bot is overloaded and sheds samples" in str(page["blocks"])
    assert not slack.uploads()  # no chart drawn (a picture of samples) while the page waits for none
    assert not any("loss_spike" in m["text"] for m in slack.messages())
    health = bot.request("GET", "/healthz", token=None)[1]["overload"]
    assert health["shed_total"] == {"samples": 8, "warnings": 1}
    _, metrics = bot.request("GET", "/metrics")
    assert 'msmon_ingest_shed_total{what="samples"} 8.0' in metrics
    assert 'msmon_ingest_shed_total{what="warnings"} 1.0' in metrics
    assert [s.step for s in bot.app[STATE].windows.history("run-1", "0")] == [1]  # only the one from before
    run = bot.store.run("run-1")
    assert run["last_step"] == 114  # shed samples still moved the run's step: it is not stalled

    # Calm again: one level down per `cool` (2 s), then every envelope is taken whole.
    assert wait_for(lambda: _level(bot) == "normal", timeout=15)
    status, answer = bot.request("POST", "/v1/ingest", _envelope([], [sample(200)]))
    assert status == 202 and "shed" not in answer
    said = [r.getMessage() for r in caplog.records if "overloaded" in r.getMessage()]
    # Up (through samples as the median climbs) to WARNINGs, then down one level at a time: one line per change of
    # level, none per request (7 requests were shed from).
    assert 3 <= len(said) <= 4, said
    assert all(line.startswith("msmon bot: ingest overloaded (the event loop runs late): shedding samples")
               and line.endswith("ERRORs go first") for line in said[:-1]), said
    assert any("shedding samples and WARNINGs" in line for line in said), said
    assert "shedding samples (8 samples and 1 WARNINGs shed in the last minute)" in said[-2]
    assert said[-1].startswith("msmon bot: ingest no longer overloaded: shedding nothing")
