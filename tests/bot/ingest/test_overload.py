"""The real bot under overload and under a busy host. Overload is the bot's own backlog: with its event loop held
(as a saturating ingest does) while jobs keep sending, envelopes are still taken (202), their ERRORs reach the chat
at once, samples and WARNING firings are shed and counted, a WARNING's resolution is never shed, and the change of
level is logged once, not per request (bot/ingest/overload.py). An idle bot, or one with a toy job's traffic, beside
CPU burners and with its loop held late, waits for nothing: it sheds nothing."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time

import pytest

from bot.app import STATE
from msmon.contract.wire import Envelope, Sample, Severity, Status, encode
from tests.fakes.bot_server import BotServer, wait_for
from tests.fakes.process import terminate
from tests.fakes.records import event, sample

pytest.importorskip("aiohttp")


def _envelope(events, samples, run="run-1") -> bytes:
    return encode(Envelope(run_id=run, device="0", sent_at=time.time(), project="llm", events=list(events),
                           samples=list(samples)))


def _health(bot: BotServer) -> dict:
    return bot.request("GET", "/healthz", token=None)[1]["overload"]


def _level(bot: BotServer) -> str:
    return _health(bot)["level"]


def _busy(bot: BotServer, seconds: float, each: float) -> None:
    """Keep the bot's event loop busy for `seconds`, `each` seconds at a time (as a saturating ingest does, one
    handler after another): its lag is measured, nothing else is told."""
    end = time.monotonic() + seconds

    def hold() -> None:
        time.sleep(each)
        if time.monotonic() < end:
            bot.loop.call_later(0.001, hold)

    bot.loop.call_soon_threadsafe(hold)


class Jobs:
    """`n` jobs sending an envelope of samples each after the other's answer, until stopped: the ingest's work."""

    def __init__(self, bot: BotServer, n: int, pause: float = 0.0) -> None:
        self.stop = threading.Event()
        self.answers: list[dict] = []
        self.threads = [threading.Thread(target=self._send, args=(bot, f"job-{i}", pause), daemon=True)
                        for i in range(n)]
        for t in self.threads:
            t.start()

    def _send(self, bot: BotServer, run: str, pause: float) -> None:
        step = 0
        while not self.stop.is_set():
            step += 1
            s = Sample(run_id=run, device="0", step=step, time=float(step), loss=2.0)
            code, answer = bot.request("POST", "/v1/ingest", _envelope([], [s], run=run))
            assert code == 202, answer
            self.answers.append(answer)
            self.stop.wait(pause)

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)


@pytest.fixture
def bot(tmp_path, slack, monkeypatch, bot_server):
    monkeypatch.setenv("MSMON_TEST_TOKEN", "job-token")
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-test-token")
    b = bot_server({"bot": {
        "port": 0, "state_path": str(tmp_path / "bot.sqlite"),
        "tokens": [{"project": "llm", "env": "MSMON_TEST_TOKEN"}],
        "routes": [{"receiver": "slack", "channel": "C0ALERTS"}], "slack": {"base_url": slack.base_url},
        "pipeline": {"group_wait": 0.2}, "console": {"charts_dir": str(tmp_path / "charts")},
        "overload": {"samples_wait": 0.2, "warnings_wait": 0.4, "samples_lag": 0.1, "warnings_lag": 0.2,
                     "cool": 2.0}}})
    yield b


def test_a_real_backlog_sheds_samples_and_warnings_never_an_error_nor_a_resolution(bot, slack, caplog):
    caplog.set_level(logging.INFO, logger="msmon.bot")
    old = event(run="run-1", rule="loss_plateau", sev=Severity.WARNING, value=3.0)
    status, answer = bot.request("POST", "/v1/ingest", _envelope([old], [sample(1)]))
    assert status == 202 and "shed" not in answer and _level(bot) == "normal"
    assert wait_for(lambda: [a["status"] for a in bot.store.alerts("run-1")] == ["firing"], timeout=10)

    jobs = Jobs(bot, 3)  # jobs keep sending while the loop is held: their requests wait in the bot, the loop is late
    try:
        _busy(bot, 12.0, each=0.3)
        assert wait_for(lambda: _level(bot) == "warnings", timeout=15), _health(bot)
        warn = event(run="run-1", rule="loss_spike", sev=Severity.WARNING, value=6.0)
        resolved = event(run="run-1", rule="loss_plateau", sev=Severity.WARNING, status=Status.RESOLVED, value=1.0)
        err = event(run="run-1")
        status, answer = bot.request("POST", "/v1/ingest", _envelope([warn, resolved, err],
                                                                     [sample(s) for s in range(102, 105)]))
        assert status == 202, answer
        assert answer["shed"] == {"samples": 3, "warnings": 1}  # the WARNING firing; never its resolution
        assert answer["queued"] >= 1
    finally:
        jobs.close()

    assert wait_for(lambda: any("ERROR grad_norm" in m["text"] for m in slack.messages()), timeout=10)
    page = next(m for m in slack.messages() if "ERROR grad_norm" in m["text"])
    assert "chart could not be drawn: the bot is overloaded and sheds samples" in str(page["blocks"])
    assert not any("loss_spike" in m["text"] for m in slack.messages())
    alerts = {a["rule"]: a["status"] for a in bot.store.alerts("run-1")}
    assert alerts["loss_plateau"] == "resolved" and "loss_spike" not in alerts  # the WARNING closed, not stuck
    health = _health(bot)
    assert health["shed_total"]["samples"] >= 3 and health["shed_total"]["warnings"] == 1
    assert [s.step for s in bot.app[STATE].windows.history("run-1", "0")] == [1]  # only the one from before
    assert bot.store.run("run-1")["last_step"] == 104  # shed samples still moved the run's step: it is not stalled

    # Calm again: one level down per `cool` (2 s), then every envelope is taken whole.
    assert wait_for(lambda: _level(bot) == "normal", timeout=30), _health(bot)
    status, answer = bot.request("POST", "/v1/ingest", _envelope([], [sample(200)]))
    assert status == 202 and "shed" not in answer
    said = [r.getMessage() for r in caplog.records if "overloaded" in r.getMessage()]
    # one line per change of level, none per request (hundreds were shed from)
    assert 2 <= len(said) <= 6, said
    assert all(line.startswith("msmon bot: ingest overloaded (its oldest waiting work waits") for line in said[:-1])
    assert any("shedding samples and WARNINGs" in line for line in said), said
    assert said[-1].startswith("msmon bot: ingest no longer overloaded: shedding nothing")


BURN = "import time\nend = time.monotonic() + float(__import__('sys').argv[1])\nwhile time.monotonic() < end: pass\n"


@pytest.mark.slow
@pytest.mark.timing  # holds the level to "normal" through 14 s of wall clock beside CPU burners: run alone
def test_a_busy_host_and_a_late_loop_with_a_toy_jobs_traffic_is_no_overload(bot, slack):
    """The machine's contention is not the bot's backlog: CPU burners on every core, the bot's own loop held 0.3 s
    at a time with nothing waiting, then a toy job's traffic: never a level, nothing shed, its ERROR's chart drawn."""
    burners = [subprocess.Popen([sys.executable, "-c", BURN, "20"]) for _ in range(3)]
    try:
        _busy(bot, 9.0, each=0.3)  # no traffic: the loop is late (far over samples_lag), nothing waits
        seen_lag = 0.0
        end = time.monotonic() + 10.0
        while time.monotonic() < end:
            h = _health(bot)
            assert h["level"] == "normal", h
            seen_lag = max(seen_lag, h["lag"])
            time.sleep(0.1)
        assert seen_lag >= 0.1  # the loop did run late: lag alone is not overload
        jobs = Jobs(bot, 1, pause=0.05)  # a toy job beside the burners
        try:
            end = time.monotonic() + 4.0
            while time.monotonic() < end:
                assert _level(bot) == "normal", _health(bot)
                time.sleep(0.1)
        finally:
            jobs.close()
        assert jobs.answers and not any("shed" in a for a in jobs.answers)
        assert _health(bot)["shed_total"] == {"samples": 0, "warnings": 0}
    finally:
        for p in burners:
            terminate(p, 10)
