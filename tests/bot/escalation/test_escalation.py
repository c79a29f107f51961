"""Escalation in the real bot on loopback (fake clock, short real ticks): levels at their delays,
ack stops them, a restart neither loses nor repeats a level, watchdog ERRORs escalate once, paused and
finished runs never. Email is read back from a real aiosmtpd server (tests/fakes/smtp.py)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from msmon.contract.wire import Heartbeat, encode
from tests.fakes.bot_server import BotServer, wait_for
from tests.fakes.helpers import FakeClock
from tests.fakes.records import envelope, event
from tests.fakes.slack_api import SlackAPIServer
from tests.fakes.smtp import ESCALATION_ENV, SMTPServer, escalating_bot_config

pytest.importorskip("aiosmtpd")

TICK = 0.05  # the escalator's real period in these tests


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in ESCALATION_ENV.items():
        monkeypatch.setenv(name, value)


def start(bot_server: Any, tmp_path: Any, slack: SlackAPIServer, smtp: SMTPServer, clock: FakeClock,
          **kw: Any) -> BotServer:
    return bot_server(escalating_bot_config(tmp_path, slack.base_url, smtp.port, **kw), clock=clock,
                      escalation_period=TICK)


def escalation_notes(slack: SlackAPIServer) -> list[dict[str, Any]]:
    return [m for m in slack.messages() if "escalation step" in m.get("text", "")]


def first_step(bot: BotServer, slack: SlackAPIServer) -> None:
    """An ERROR in, and its escalation's first level in the channel."""
    assert bot.request("POST", "/v1/ingest", envelope([event()]))[0] == 202
    assert wait_for(lambda: len(escalation_notes(slack)) == 1, 5)


def command(bot: BotServer, text: str) -> int:
    """`msmon cmd TEXT` as operator cli:alice; the HTTP status."""
    return bot.request("POST", "/v1/commands", json.dumps({"text": text}).encode(), token="op-token")[0]


def settle() -> None:
    """Long enough for several escalator ticks and outbox rounds: what is due has gone."""
    time.sleep(0.6)


def test_an_unacknowledged_error_escalates_through_its_levels_at_their_delays(tmp_path, slack, smtp, bot_server):
    clock = FakeClock()
    bot = start(bot_server, tmp_path, slack, smtp, clock)
    assert bot.request("POST", "/v1/ingest", envelope([event()]))[0] == 202
    assert wait_for(lambda: len(escalation_notes(slack)) == 1, 5)
    note = escalation_notes(slack)[0]["text"]
    assert "for: @U0ONCALL" in note and "run-42 on 1 device has been in ERROR for 0 s" in note
    assert note.startswith("<@U0ONCALL>\n")  # a mention that notifies, not only its name
    assert "escalation step 1 of 3 (level 1)" in note
    clock.advance(599)
    settle()
    assert smtp.inbox.messages == [] and len(escalation_notes(slack)) == 1
    clock.advance(35 * 60 - 599)  # 35 min in: levels 2 (10 min) and 3 (30 min) are both due, once each
    got = smtp.inbox.wait(2)
    assert [rcpts for rcpts, _ in got] == [["oncall@example.org", "second@example.org"], ["lead@example.org"]]
    first, second = got[0][1], got[1][1]
    assert first["Subject"] == "[msmon ERROR] run-42 grad_norm 12 > 10 at step 100"
    assert "has been in ERROR for 35 min (≈0.6 device-hours)" in first.get_body(("plain",)).get_content()
    assert second["In-Reply-To"] == first["Message-ID"] == second["References"]
    assert first["In-Reply-To"] is None
    settle()
    assert len(smtp.inbox.messages) == 2 and len(escalation_notes(slack)) == 1  # nothing twice
    steps = bot.store.escalations.steps()
    assert [(s["step"], s["how"], s["targets"]) for s in steps] == [
        (0, "slack", ["U0ONCALL"]), (1, "email", ["oncall@example.org", "second@example.org"]),
        (2, "email", ["lead@example.org"])]
    metrics = bot.request("GET", "/metrics")[1]
    assert 'msmon_escalation_steps_total{how="email"} 2.0' in metrics
    assert 'msmon_escalation_steps_total{how="slack"} 1.0' in metrics


def test_an_acknowledged_error_stops_escalating(tmp_path, slack, smtp, bot_server):
    clock = FakeClock()
    bot = start(bot_server, tmp_path, slack, smtp, clock)
    first_step(bot, slack)
    assert command(bot, "ack run-42/grad_norm") == 200
    assert wait_for(lambda: bot.store.escalations.of()[0]["state"] == "acked", 5)
    clock.advance(10_000)
    settle()
    assert smtp.inbox.messages == [] and len(escalation_notes(slack)) == 1
    esc = bot.store.escalations.of()[0]
    assert esc["acked_by"] == "cli:alice"
    assert bot.store.escalations.steps()[-1]["how"] == "acked"
    assert bot.store.escalations.steps()[-1]["targets"] == ["cli:alice"]


def test_the_ack_button_on_the_alert_stops_escalating(tmp_path, slack, smtp, monkeypatch, bot_server):
    from tests.fakes.slack_signing import SECRET, click

    monkeypatch.setenv("SLACK_SIGNING_SECRET", SECRET)
    clock = FakeClock()
    bot = start(bot_server, tmp_path, slack, smtp, clock)
    first_step(bot, slack)
    alert = next(m for m in slack.messages() if m["text"].startswith("ERROR grad_norm"))
    button = alert["blocks"][-1]["elements"][0]
    assert button["value"] == "ack run-42/grad_norm"
    assert click(bot.url, button["value"], user="U0CAROL", message_ts=alert["ts"], ts=int(clock()))[0] == 200
    assert wait_for(lambda: bot.store.escalations.of()[0]["state"] == "acked", 5)
    assert bot.store.escalations.of()[0]["acked_by"] == "@u0carol"
    clock.advance(10_000)
    settle()
    assert smtp.inbox.messages == []


def test_resolution_closes_the_escalation(tmp_path, slack, smtp, bot_server):
    clock = FakeClock()
    bot = start(bot_server, tmp_path, slack, smtp, clock)
    first_step(bot, slack)
    from msmon.contract.wire import Status

    bot.request("POST", "/v1/ingest", envelope([event(status=Status.RESOLVED, step=120)]))
    assert wait_for(lambda: bot.store.escalations.of()[0]["state"] == "resolved", 5)
    clock.advance(10_000)
    settle()
    assert smtp.inbox.messages == []


def test_silence_pauses_the_escalation(tmp_path, slack, smtp, bot_server):
    clock = FakeClock()
    bot = start(bot_server, tmp_path, slack, smtp, clock)
    first_step(bot, slack)
    assert command(bot, "silence run-42 1h") == 200
    assert wait_for(lambda: bot.store.escalations.of()[0]["paused_at"] == clock(), 5)
    clock.advance(1200)
    settle()
    assert smtp.inbox.messages == []  # level 2 (10 min) slept through the silence
    clock.advance(3600)  # the silence is over (at 1 h): the chain resumes where it stopped
    settle()
    assert smtp.inbox.messages == []
    clock.advance(600)
    assert len(smtp.inbox.wait(1)) == 1


def test_a_restart_in_the_middle_neither_loses_nor_repeats_a_level(tmp_path, slack, smtp, bot_server):
    clock = FakeClock()
    bot = start(bot_server, tmp_path, slack, smtp, clock)
    bot.request("POST", "/v1/ingest", envelope([event()]))
    assert wait_for(lambda: len(escalation_notes(slack)) == 1, 5)
    bot.stop()
    clock.advance(700)  # level 2 fell due while the bot was down
    bot = start(bot_server, tmp_path, slack, smtp, clock)
    assert len(smtp.inbox.wait(1)) == 1
    settle()
    assert len(smtp.inbox.messages) == 1 and len(escalation_notes(slack)) == 1
    bot.stop()
    bot = start(bot_server, tmp_path, slack, smtp, clock)
    clock.advance(1200)
    assert len(smtp.inbox.wait(2)) == 2
    settle()
    assert len(smtp.inbox.messages) == 2 and len(escalation_notes(slack)) == 1
    assert [s["step"] for s in bot.store.escalations.steps()] == [0, 1, 2]


def beat(bot: BotServer, run: str, step: int, clock: FakeClock, **kw: Any) -> None:
    hb = Heartbeat(run_id=run, device="0", time=clock(), step=step, **kw)
    assert bot.request("POST", "/v1/heartbeat", encode(hb))[0] == 202


def test_a_stale_run_and_a_hung_run_each_escalate_once_a_paused_and_a_finished_run_not(tmp_path, slack, smtp,
                                                                                       bot_server):
    clock = FakeClock()
    bot = start(bot_server, tmp_path, slack, smtp, clock)
    for run in ("run-stale", "run-hung", "run-paused", "run-done"):
        beat(bot, run, 12_400, clock)
    beat(bot, "run-paused", 12_400, clock, paused=True)
    beat(bot, "run-done", 12_500, clock, final=True)
    for _ in range(5):  # 12.5 minutes of heartbeats without progress: the hung one is stuck (limit 10)
        clock.advance(150)
        for run in ("run-hung", "run-paused"):
            beat(bot, run, 12_400, clock, paused=run == "run-paused")
    assert wait_for(lambda: {e["run_id"]: e["rule"] for e in bot.store.escalations.of()} ==
                    {"run-stale": "job_gone", "run-hung": "job_stalled"}, 10)
    assert wait_for(lambda: len(escalation_notes(slack)) == 2, 5)
    notes = {line: m for m in escalation_notes(slack)
             for line in m["text"].split("\n") if line.startswith("ERROR ")}
    gone = next(t for t in notes if "job_gone" in t)
    assert "run-stale stopped reporting at step 12,400, last seen " in gone
    stalled = next(t for t in notes if "job_stalled" in t)
    assert "run-hung is alive but has not stepped past step 12,400" in stalled
    time.sleep(2.5)  # another watchdog round and many escalator ticks
    assert sorted(e["run_id"] for e in bot.store.escalations.of()) == ["run-hung", "run-stale"]
    assert len(escalation_notes(slack)) == 2


def test_the_job_says_it_ended_normally_and_the_watchdog_leaves_it_alone(tmp_path, slack, smtp, bot_server):
    from notifier.transport import BotTransport

    clock = FakeClock()
    bot = start(bot_server, tmp_path, slack, smtp, clock)
    t = BotTransport(bot.url, "run-done", "0", token="job-token", project="llm", spool_dir=str(tmp_path / "spool"),
                     flush_interval=0.05)
    t.progress(5_000)
    beat(bot, "run-done", 5_000, clock)
    t.close(final=True)  # what Monitor.close() does at the end of training
    assert "run-done" in bot.store.escalations.ended()
    clock.advance(3600)
    time.sleep(2.5)  # a watchdog round
    assert bot.store.escalations.of() == [] and not bot.store.alerts("run-done")


def test_one_owner_per_escalation(tmp_path):
    from bot.store.sqlite import Store

    store = Store(str(tmp_path / "bot.sqlite"))
    esc = store.escalations.start("run-42", "grad_norm", "oncall", "slack", "C1", 100.0)
    assert store.escalations.claim(esc, "bot-a", 100.0, 30.0)
    assert not store.escalations.claim(esc, "bot-b", 110.0, 30.0)  # a's lease holds
    assert store.escalations.claim(esc, "bot-a", 120.0, 30.0)  # renewed by its owner
    assert store.escalations.claim(esc, "bot-b", 151.0, 30.0)  # run out: b takes over
    assert not store.escalations.claim(esc, "bot-a", 152.0, 30.0)
    store.close()
