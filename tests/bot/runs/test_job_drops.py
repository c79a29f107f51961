"""An ERROR is never dropped without a trace (issue 36): what a job's spool could not hold is said in chat and in
`status`, and a real job's spool at a small bound, through a real outage of the bot, delivers every ERROR or
reports it dropped.

The real bot on loopback with the local Slack; the outage is a fault-injecting TCP proxy in front of the bot
(tests/fakes/tcp_proxy.py) that resets every connection while it lasts."""

from __future__ import annotations

import time
from typing import Any

import msgspec
import pytest

from bot.app import STATE
from msmon.contract.wire import Envelope, Event, Sample, Severity, Window, encode
from notifier.transport import BotTransport
from tests.fakes.bot_server import wait_for
from tests.fakes.records import event
from tests.fakes.slack_signing import SECRET, slash
from tests.fakes.tcp_proxy import FaultyProxy

pytest.importorskip("aiohttp")


@pytest.fixture
def bot(tmp_path, slack, monkeypatch, bot_server) -> Any:
    monkeypatch.setenv("MSMON_TEST_TOKEN", "job-token")
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-test-token")
    monkeypatch.setenv("SLACK_SIGNING_SECRET", SECRET)
    return bot_server({"bot": {
        "port": 0, "state_path": str(tmp_path / "bot.sqlite"),
        "tokens": [{"project": "llm", "env": "MSMON_TEST_TOKEN"}],
        "routes": [{"receiver": "slack", "channel": "C0ALERTS"}],
        "slack": {"base_url": slack.base_url, "max_retries": 2},
        "rate_limit": {"per_channel": 50, "per_run": 50, "burst": 20},
        "console": {"charts": False},
        "commands": {"allow": [{"project": "llm", "users": ["U0ALICE"]}]}}})


def big(run: str, rule: str, step: int, sev: Severity = Severity.ERROR) -> Event:
    """An alert event with a chart window of 60 steps (about 3 KB, as a real rule's)."""
    steps = list(range(step - 59, step + 1))
    w = Window(steps=steps, loss=[2.0 + 0.001 * k for k in range(60)], learning_rate=[1e-4] * 60,
               grad_norm=[1.0 + 0.01 * k for k in range(60)], tokens_per_s=[1500.5] * 60)
    return msgspec.structs.replace(event(run=run, rule=rule, step=step, sev=sev), window=w)


def notes(slack: Any) -> list[str]:
    return [m["text"] for m in slack.messages() if "the job DROPPED" in m.get("text", "")
            or "the job dropped data" in m.get("text", "")]


def post(bot: Any, dropped: dict[str, int], run: str = "run-7", step: int = 10) -> None:
    env = Envelope(run_id=run, device="0", sent_at=time.time(), project="llm", rank=3, dropped=dropped,
                   samples=[Sample(run_id=run, device="0", step=step, time=time.time(), loss=2.0)])
    assert bot.request("POST", "/v1/ingest", encode(env))[0] == 202


def test_a_jobs_dropped_errors_are_said_in_chat_once_per_increase_and_in_status(bot, slack):
    post(bot, {"errors": 3, "warnings": 5, "samples": 400})
    assert wait_for(lambda: len(notes(slack)) == 1, 10), slack.messages()
    text = notes(slack)[0]
    assert "run `run-7`: the job DROPPED 3 ERROR event(s)" in text and "rank 3 (device 0)" in text
    assert "5 WARNING events" in text and "400 metric samples" in text and "spool_max_mb" in text
    post(bot, {"errors": 1}, step=11)  # within the note's minute: counted, said in the next note
    post(bot, {}, step=12)
    code, body = slash(bot.url, "status run-7")
    assert code == 200 and "DROPPED BY THE JOB before the bot took them: 4 ERROR events, 5 WARNING events" in \
        body["text"], body["text"]
    assert len(notes(slack)) == 1
    state = bot.app[STATE]
    state.drops.note_every = 0.0  # the minute is over
    post(bot, {}, step=13)  # the run's next envelope queues the note of what grew since
    assert wait_for(lambda: len(notes(slack)) == 2, 10)
    assert "DROPPED 4 ERROR event(s)" in notes(slack)[1] and "new since the last note: ERROR events" in notes(slack)[1]
    post(bot, {}, step=14)  # nothing grew: no note
    post(bot, {"samples": 0}, step=15)
    assert state.drops.totals("run-7") == {"errors": 4, "warnings": 5, "samples": 400}
    post(bot, {"samples": 20_000, "warnings": 3}, step=16)  # an outage's samples and WARNINGs: status, not a note
    assert state.drops.totals("run-7") == {"errors": 4, "warnings": 8, "samples": 20_400}
    post(bot, {"windows": 2}, step=17)  # two ERRORs went out without their charts: said
    assert wait_for(lambda: len(notes(slack)) == 3, 10)
    assert "2 ERROR chart windows" in notes(slack)[2] and "20,400 metric samples" in notes(slack)[2]
    assert len(notes(slack)) == 3


def test_dropped_samples_and_warnings_alone_are_in_status_not_in_chat(bot, slack):
    post(bot, {"samples": 9_000, "warnings": 2}, run="run-s")
    post(bot, {}, run="run-s", step=11)
    code, body = slash(bot.url, "status run-s")
    assert code == 200 and "dropped by the job before the bot took them: 2 WARNING events" in body["text"] and \
        "9,000 metric samples" in body["text"], body["text"]
    assert not notes(slack), slack.messages()


def test_a_503_envelope_sent_again_counts_its_drops_once(bot, slack):
    """The counts are kept once the envelope is committed: one that failed and came again is counted once."""
    state = bot.app[STATE]
    post(bot, {"errors": 2})
    post(bot, {"errors": 2}, run="run-8")
    assert state.drops.totals("run-7") == {"errors": 2} and state.drops.totals("run-8") == {"errors": 2}
    assert wait_for(lambda: len(notes(slack)) == 2, 10)


@pytest.mark.parametrize("bound_kb", [48])
def test_errors_raised_while_the_bot_is_down_are_delivered_or_reported_dropped(bot, slack, tmp_path, bound_kb):
    """The spool probe: a real job transport at a small spool bound, the bot unreachable (every connection
    reset) while the job raises 200 ERRORs with their ~3 KB chart windows, WARNINGs and samples; then the bot is
    back. Every ERROR is delivered (an alert row at the bot) or reported dropped (the bot's count and its chat
    note); none is lost; the spool file stays within its bound."""
    with FaultyProxy("127.0.0.1", bot.port) as proxy:
        proxy.refuse(3600.0)  # the bot is down for the job
        t = BotTransport(f"http://127.0.0.1:{proxy.port}", "run-spool", "0", token="job-token", project="llm",
                         spool_dir=str(tmp_path / "spool"), spool_max_bytes=bound_kb << 10, flush_interval=0.05,
                         heartbeat_interval=60.0, backoff=(0.05, 0.2), probe_interval=0.05, timeout=1.0)
        errors = 0
        peak = 0
        for step in range(1, 1201):
            t.sample(Sample(run_id="run-spool", device="0", step=step, time=time.time(), loss=2.0, grad_norm=1.0))
            if step % 10 == 0:
                t.event(big("run-spool", f"w{step % 7}", step, Severity.WARNING))
            if step % 6 == 0:
                t.event(big("run-spool", f"e{step}", step))  # a new alert each: countable
                errors += 1
            if step % 100 == 0:
                assert wait_for(lambda: t.stats()["queued"] == t._q.pending(), 5)
                t._persist()  # what the sender would write at its next persist
                peak = max(peak, (tmp_path / "spool" / "run-spool@0.spool.jsonl").stat().st_size)
        proxy.restore()
        assert wait_for(lambda: t.flush(timeout=1.0), 30), t.stats()
        t.close(timeout=5.0)
    state = bot.app[STATE]
    delivered = {a["rule"] for a in bot.store.alerts("run-spool") if a["rule"].startswith("e")}
    reported = state.drops.totals("run-spool").get("errors", 0)
    lost = errors - len(delivered) - reported
    print(f"spool probe (spool_max_mb {bound_kb / 1024:.3g}): {errors} ERRORs raised during the outage: "
          f"{len(delivered)} delivered, {reported} reported dropped, {lost} lost; chart windows shed "
          f"{state.drops.totals('run-spool').get('windows', 0)}; spool file at most {peak:,} bytes")
    assert lost == 0
    assert reported == t.dropped.get("errors", 0)
    assert peak <= bound_kb << 10
    if reported:
        assert wait_for(lambda: any("run `run-spool`" in n for n in notes(slack)), 10)


def test_under_spool_pressure_an_errors_chart_window_goes_before_the_error():
    from notifier.sendq import Limits, SendQueue

    q = SendQueue(Limits(max_bytes=12_000, max_high=100))
    took = []
    for step in range(10):
        ev = big("r", f"e{step}", step)
        data = encode(ev)
        took.append(q.enqueue(ev, 0.0, len(data), data))
    assert all(took), "an ERROR was refused while chart windows could still be shed"
    assert q.dropped.get("windows", 0) > 0 and "errors" not in q.dropped
    assert q.stats()["bytes"] <= 12_000
    kept = q.snapshot()
    assert kept[-1].window is not None or q.dropped["windows"] == 10  # the newest keeps its chart while it can
