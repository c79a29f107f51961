"""Delivery you can trust, end to end: the real bot on loopback, slack-sdk's real client talking to the
local Slack API server (tests/fakes/slack_api.py) with injected faults, real SQLite, real matplotlib.

A poison alert (a chart matplotlib cannot draw, Slack's HTML error page, a run id that is no file
name) is posted once, or retried with backoff and dead-lettered, while the other alerts flow; job
text cannot mention or link in Slack nor drive the terminal; chart files stay in their folder.
"""

from __future__ import annotations

import io
import logging
import os
import sqlite3
import time
from typing import Any

import pytest

from bot.pipeline.schedule import Policy
from bot.receivers.console import ConsoleReceiver
from msmon.contract.wire import Envelope, Event, Sample, Severity, Window, encode
from tests.fakes.bot_server import wait_for
from tests.fakes.records import event
from tests.fakes.slack_api import SlackAPIServer

HTML_502 = "<html><head><title>502 Bad Gateway</title></head><body><h1>502 Bad Gateway</h1></body></html>"
FAST = Policy(base=0.05, cap=0.2, max_attempts=4, max_error_attempts=3)


def envelope(events: list[Event], labels: dict[str, str] | None = None) -> bytes:
    run = events[0].run_id
    return encode(Envelope(run_id=run, device="0", sent_at=time.time(), project="llm", events=events,
                           labels=labels or {}))


def config(tmp_path: Any, slack: SlackAPIServer | None, routes: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"bot": {
        "port": 0, "state_path": str(tmp_path / "bot.sqlite"),
        "tokens": [{"project": "llm", "env": "MSMON_TEST_TOKEN"}],
        "routes": routes if routes is not None else [{"receiver": "slack", "channel": "C0ALERTS"}] if slack else [],
        "slack": {"base_url": slack.base_url if slack else None, "max_retries": 0},
        "pipeline": {"group_wait": 0.0},
        "rate_limit": {"per_channel": 100, "per_run": 100, "global_rate": 100, "burst": 50},
        "commands": {"operators": [{"user": "cli:ops", "env": "MSMON_TEST_OPS"}]},
        "console": {"charts_dir": str(tmp_path / "charts")}}}


@pytest.fixture
def env(monkeypatch):
    monkeypatch.setenv("MSMON_TEST_TOKEN", "job-token")
    monkeypatch.setenv("MSMON_TEST_OPS", "ops-token")
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-test-token")


def posts_for(slack: SlackAPIServer, run: str) -> list[Any]:
    return [c for c in slack.calls_to("chat.postMessage") if f"run {run}," in str(c.params.get("text", ""))]


def test_charts_matplotlib_stumbles_on_are_posted_once_and_others_flow(tmp_path, slack, env, bot_server):
    bot = bot_server(config(tmp_path, slack))
    mathtext = event(run="run-math")
    mathtext.message = r"loss $\frac{1}{$ bad"  # matplotlib's mathtext parser raised on it
    extreme = event(run="run-huge")  # matplotlib cannot draw this window (LinAlgError: Singular matrix)
    extreme.window = Window(steps=[1, 2, 3], loss=[1e308, -1e308, 1e308], learning_rate=[0.0] * 3,
                            grad_norm=[1e-320, 1e300, 0.0], tokens_per_s=[1.0, 2.0, 3.0])
    bot.request("POST", "/v1/ingest", envelope([mathtext]))
    bot.request("POST", "/v1/ingest", envelope([extreme]))
    for i in range(3):
        bot.request("POST", "/v1/ingest", envelope([event(run=f"run-ok{i}")]))
    assert wait_for(lambda: all(posts_for(slack, f"run-ok{i}") for i in range(3)), timeout=10)
    time.sleep(2.0)  # the flood was 91 posts in 40 s: two seconds show it
    for run in ("run-math", "run-huge"):
        posts = posts_for(slack, run)
        assert len(posts) == 1, f"the poison alert of {run} was posted {len(posts)} times"
    # Slack's text goes before its chart is drawn: the message is rewritten to say why it has none
    assert wait_for(lambda: len(slack.updates()) == 1, timeout=10)
    huge = slack.message(posts_for(slack, "run-huge")[0].response["ts"])
    assert huge is not None and "(chart could not be drawn: LinAlgError: Singular matrix)" in huge["text"]
    assert huge["edited"] == 1 and "Acknowledge" in str(huge["blocks"])  # the same message, its buttons kept
    math = slack.message(posts_for(slack, "run-math")[0].response["ts"])
    assert math is not None and "chart could not be drawn" not in math["text"] and not math.get("edited")
    assert wait_for(lambda: len(slack.uploads()) == 4, timeout=15)  # every chart but the one that cannot be drawn
    time.sleep(0.5)
    assert len(slack.uploads()) == 4
    _, health = bot.request("GET", "/healthz", token=None)
    assert health["outbox_depth"] == 0 and health["dead_letters"] == 0


def test_slacks_html_error_page_is_retried_with_backoff_then_dead_lettered_once(tmp_path, slack, env, caplog,
                                                                                bot_server):
    slack.fail("chat.postMessage", status=502, times=10**6, body=HTML_502, retry_after=None,
               when=lambda p: "run-bad" in p["text"])
    cfg = config(tmp_path, slack)  # the same policy as FAST, from bot.yaml's delivery section
    cfg["bot"]["delivery"] = {"backoff_base": 0.05, "backoff_max": 0.2, "max_attempts": 4, "max_error_attempts": 3}
    bot = bot_server(cfg)
    with caplog.at_level(logging.WARNING, logger="msmon.bot"):
        bot.request("POST", "/v1/ingest", envelope([event(run="run-bad")]))
        bot.request("POST", "/v1/ingest", envelope([event(run="run-good")]))
        assert wait_for(lambda: len(posts_for(slack, "run-good")) == 1, timeout=5)
        assert wait_for(lambda: bot.request("GET", "/healthz", token=None)[1].get("dead_letters") == 1, timeout=10)
        time.sleep(0.5)
    tries = [c for c in slack.calls_to("chat.postMessage") if "run-bad" in c.params["text"]]
    assert len(tries) == FAST.max_attempts and all(c.http_status == 502 for c in tries)
    gaps = [b.time - a.time for a, b in zip(tries, tries[1:], strict=False)]
    assert all(g >= FAST.base / 2 * 0.9 for g in gaps), gaps  # backoff, not a hot loop
    dead_logs = [r for r in caplog.records if "dead letter" in r.getMessage()]
    assert len(dead_logs) == 1 and "run-bad" in dead_logs[0].getMessage()
    assert dead_logs[0].levelno == logging.ERROR
    status, body = bot.request("GET", "/v1/outbox/dead", token="ops-token")
    assert status == 200 and len(body["dead"]) == 1
    dead = body["dead"][0]
    assert dead["run_id"] == "run-bad" and dead["attempts"] == FAST.max_attempts and "502" in dead["error"]
    assert bot.request("GET", "/v1/outbox/dead")[0] == 403  # a job's token
    assert bot.request("GET", "/v1/outbox/dead", token=None)[0] == 401
    _, metrics = bot.request("GET", "/metrics")
    assert "msmon_outbox_dead_letters 1.0" in metrics
    assert 'msmon_dead_letters_total{receiver="slack"} 1.0' in metrics
    assert 'msmon_delivery_errors_total{receiver="slack"} 4.0' in metrics
    assert len(posts_for(slack, "run-good")) == 1


def test_a_429_paces_its_own_channel_and_not_the_others(tmp_path, slack, env, bot_server):
    routes = [{"receiver": "slack", "channel": "C0A", "project": "llm", "labels": {"team": "a"}},
              {"receiver": "slack", "channel": "C0B"}]
    slack.fail("chat.postMessage", status=429, times=1, retry_after=2, when=lambda p: p["channel"] == "C0A")
    bot = bot_server(config(tmp_path, slack, routes))
    bot.request("POST", "/v1/ingest", envelope([event(run="run-a1")], {"team": "a"}))
    assert wait_for(lambda: any(c.failed for c in slack.calls_to("chat.postMessage")), timeout=5)
    limited = next(c for c in slack.calls_to("chat.postMessage") if c.failed).time
    bot.request("POST", "/v1/ingest", envelope([event(run="run-a2")], {"team": "a"}))
    bot.request("POST", "/v1/ingest", envelope([event(run="run-b1")], {"team": "b"}))
    assert wait_for(lambda: len(slack.messages("C0B")) == 1, timeout=5)
    b = next(c for c in slack.calls_to("chat.postMessage") if c.params["channel"] == "C0B")
    assert b.time - limited < 1.5, "a 429 on C0A held back C0B"
    assert wait_for(lambda: len(slack.messages("C0A")) == 2, timeout=10)
    a_ok = [c.time for c in slack.calls_to("chat.postMessage") if c.params["channel"] == "C0A" and not c.failed]
    assert min(a_ok) - limited >= 1.9, "C0A was posted to before its Retry-After"
    assert len(slack.calls_to("chat.postMessage")) == 4  # one 429, three posts


def test_a_chart_upload_that_fails_after_the_post_never_posts_the_text_twice(tmp_path, slack, env, bot_server):
    slack.fail("files.getUploadURLExternal", status=500, times=2, body="upstream connect error",
               content_type="text/plain")
    bot = bot_server(config(tmp_path, slack))
    bot.request("POST", "/v1/ingest", envelope([event(run="run-up")]))
    assert wait_for(lambda: len(slack.uploads()) == 1, timeout=15)
    time.sleep(0.5)
    assert len(posts_for(slack, "run-up")) == 1
    assert slack.uploads()[0]["thread_ts"] == slack.messages()[0]["ts"]


def test_job_text_cannot_mention_or_link_in_slack(tmp_path, slack, env, bot_server):
    ev = event(run="run-<!channel>", device="<@U0BOSS>")
    ev.rule = "grad_norm<!here>"
    ev.message = "loss <!here> went <http://evil.example|up> & <@U0CEO> @channel"
    ev.hint = "see <!subteam^S0ALL> *now*"
    ev.phase = "<!everyone>"
    bot = bot_server(config(tmp_path, slack))
    bot.request("POST", "/v1/ingest", envelope([ev]))
    assert wait_for(lambda: len(slack.messages()) == 1, timeout=5)
    msg = slack.messages()[0]
    texts = [msg["text"]] + _texts(msg["blocks"])
    everything = "\n".join(texts)
    for raw in ("<!channel>", "<!here>", "<!everyone>", "<@U0BOSS>", "<@U0CEO>", "<http", "<!subteam"):
        assert raw not in everything, raw
    assert "&lt;!here&gt;" in everything and "&amp;" in everything
    assert "@channel" not in everything.replace("@\u2060channel", "")


def _texts(obj: Any) -> list[str]:
    if isinstance(obj, dict):
        return [v for k, v in obj.items() if k == "text" and isinstance(v, str)] + \
            [t for k, v in obj.items() if k != "value" for t in _texts(v)]
    if isinstance(obj, list):
        return [t for v in obj for t in _texts(v)]
    return []


def test_console_charts_stay_in_their_folder_and_job_text_cannot_drive_the_terminal(tmp_path, env, bot_server):
    charts = tmp_path / "deep" / "charts"
    out = io.StringIO()
    cfg = config(tmp_path, None)
    cfg["bot"]["console"]["charts_dir"] = str(charts)
    bot = bot_server(cfg, receivers={"console": ConsoleReceiver(str(charts), out=out)})
    runs = ["../../x", "a/b", "r" * 250]
    for run in runs:
        assert bot.request("POST", "/v1/ingest", envelope([event(run=run)]))[0] == 202
    for run in ("nul\x00id", "run-\x1b[2J\x1b]0;pwned\x07"):  # control characters: refused at the edge, naming it
        code, body = bot.request("POST", "/v1/ingest", envelope([event(run=run)]))
        assert code == 422 and "run_id" in body["error"] and "control character" in body["error"], (code, body)
    assert wait_for(lambda: out.getvalue().count("chart: ") == len(runs), timeout=15), out.getvalue()
    time.sleep(1.0)
    text = out.getvalue()
    assert text.count("ERROR grad_norm: run") == len(runs)  # each once: no poison loop
    assert "\x1b" not in text and "\x07" not in text and "\x00" not in text
    assert sorted(os.listdir(tmp_path)) == ["bot.sqlite", "bot.sqlite-shm", "bot.sqlite-wal", "deep"]
    assert sorted(os.listdir(tmp_path / "deep")) == ["charts"]
    pngs = os.listdir(charts)
    assert len(pngs) == len(runs) and all(p.endswith(".png") and len(p) <= 124 for p in pngs)



def test_a_commands_result_note_carrying_job_text_cannot_mention_in_slack(tmp_path, slack, env, monkeypatch,
                                                                          bot_server):
    from tests.bot.commands import test_commands as tc
    from tests.fakes.slack_signing import SECRET, slash

    monkeypatch.setenv("SLACK_SIGNING_SECRET", SECRET)
    monkeypatch.setenv("MSMON_OPERATOR", "operator-token")
    bot = bot_server(tc.config(tmp_path, slack))
    tc.report(bot)
    code, _ = slash(bot.url, "save-checkpoint run-42", response_url=slack.response_url("c1"))
    assert code == 200
    (cmd,) = tc.poll(bot).commands
    tc.answer(bot, cmd, detail="written <!channel> to <http://evil.example|here> & @here")  # the job's words
    assert slack.wait_for(lambda s: len(s.responses("c1")) == 1, timeout=10)
    text = slack.responses("c1")[0]["text"]
    assert "<!channel>" not in text and "<http" not in text and "written &lt;!channel&gt;" in text
    assert "&amp;" in text and "@here" not in text


def test_a_row_that_keeps_getting_retry_after_does_not_starve_its_channel(tmp_path, slack, env, bot_server):
    slack.fail("chat.postMessage", status=503, times=10**6, body="Service Unavailable", content_type="text/plain",
               retry_after=1, when=lambda p: "run-bad" in p["text"])
    bot = bot_server(config(tmp_path, slack), delivery=FAST)
    bot.request("POST", "/v1/ingest", envelope([event(run="run-bad")]))
    assert wait_for(lambda: any(c.failed for c in slack.calls_to("chat.postMessage")), timeout=5)
    time.sleep(0.2)
    for i in range(3):
        bot.request("POST", "/v1/ingest", envelope([event(run=f"run-next{i}")]))
    assert wait_for(lambda: all(posts_for(slack, f"run-next{i}") for i in range(3)), timeout=4)
    assert wait_for(lambda: bot.request("GET", "/healthz", token=None)[1].get("dead_letters") == 1, timeout=10)
    tries = [c.time for c in slack.calls_to("chat.postMessage") if "run-bad" in c.params["text"]]
    assert len(tries) == FAST.max_attempts
    assert all(b - a >= 0.95 for a, b in zip(tries, tries[1:], strict=False))  # its Retry-After honoured


def test_a_status_chart_that_cannot_be_drawn_does_not_fail_the_command(tmp_path, slack, env, bot_server):
    bot = bot_server(config(tmp_path, slack))
    now = time.time()
    samples = [Sample(run_id="run-huge", device="0", step=k, time=now - 3 + k, loss=v, learning_rate=0.0,
                      grad_norm=g, tokens_per_s=1.0)
               for k, (v, g) in enumerate([(1e308, 1e-320), (-1e308, 1e300), (1e308, 0.0)])]
    body = encode(Envelope(run_id="run-huge", device="0", sent_at=now, project="llm", samples=samples))
    assert bot.request("POST", "/v1/ingest", body)[0] == 202
    status, answer = bot.request("POST", "/v1/commands", b'{"text": "status run-huge"}', token="ops-token")
    assert status == 200, answer
    assert "run-huge" in answer["text"] and answer.get("chart") is None


@pytest.mark.slow  # 20 s by default (MSMON_POISON_SECONDS); `-s` prints the figures
def test_figures_posts_per_poison_alert_while_others_flow(tmp_path, slack, env, bot_server):
    """The issue's figure (one alert posted 91 times in 40 s while the others waited), measured: four
    poison alerts and a fresh alert every 2 s to the same channel; posts per alert, the others' latency,
    dead letters at /metrics."""
    seconds = float(os.environ.get("MSMON_POISON_SECONDS", "20"))
    slack.fail("chat.postMessage", status=502, times=10**6, body=HTML_502, retry_after=None,
               when=lambda p: "run-html5xx" in p["text"])
    cfg = config(tmp_path, slack)
    cfg["bot"]["rate_limit"] = {}  # the shipped limits: 1 message/s per channel, burst 3
    bot = bot_server(cfg, delivery=Policy(max_attempts=5))
    mathtext = event(run="run-mathtext")
    mathtext.message = r"loss $\frac{1}{$ bad"
    undrawable = event(run="run-undrawable")
    undrawable.window = Window(steps=[1, 2, 3], loss=[1e308, -1e308, 1e308], learning_rate=[0.0] * 3,
                               grad_norm=[1e-320, 1e300, 0.0], tokens_per_s=[1.0, 2.0, 3.0])
    poisons = {"run-mathtext": mathtext, "run-html5xx": event(run="run-html5xx"),
               "run-undrawable": undrawable, "run-a/b": event(run="run-a/b")}
    for ev in poisons.values():
        assert bot.request("POST", "/v1/ingest", envelope([ev]))[0] == 202
    sent: dict[str, float] = {}
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        run = f"run-ok{len(sent)}"
        sent[run] = time.monotonic()
        bot.request("POST", "/v1/ingest", envelope([event(run=run)]))
        time.sleep(2.0)
    assert wait_for(lambda: all(posts_for(slack, r) for r in sent), timeout=10)
    time.sleep(1.0)
    figures: dict[str, Any] = {"seconds": seconds}
    for run in poisons:
        calls = posts_for(slack, run)
        figures[run] = {"calls": len(calls), "posted": sum(not c.failed for c in calls)}
    latency = sorted(next(c.time for c in posts_for(slack, r) if not c.failed) - t for r, t in sent.items())
    figures["others"] = {"sent": len(sent), "posted_once": sum(len(posts_for(slack, r)) == 1 for r in sent),
                         "p50_s": round(latency[len(latency) // 2], 3), "max_s": round(latency[-1], 3)}
    _, metrics = bot.request("GET", "/metrics")
    figures["metrics"] = [line for line in metrics.splitlines() if line.startswith("msmon_outbox_dead_letters")]
    print("\nposts per poison alert:", figures)
    assert all(figures[r]["posted"] == 1 for r in ("run-mathtext", "run-undrawable", "run-a/b"))
    assert figures["run-html5xx"]["posted"] == 0 and figures["run-html5xx"]["calls"] <= 5
    assert figures["others"]["posted_once"] == len(sent)
    if seconds >= 20:  # 5 tries at 1, 2, 4, 8 s (at most) apart
        assert "msmon_outbox_dead_letters 1.0" in figures["metrics"]


def test_a_slack_outage_longer_than_the_bound_dead_letters_nothing(tmp_path, slack, env, bot_server):
    """Every message failing is Slack being down, not a poison row: they wait and all go when it is back."""
    slack.fail("chat.postMessage", status=503, times=10**6, body=HTML_502, retry_after=None)
    bot = bot_server(config(tmp_path, slack), delivery=FAST)
    for i in range(3):
        bot.request("POST", "/v1/ingest", envelope([event(run=f"run-out{i}")]))
    assert wait_for(lambda: len(slack.calls_to("chat.postMessage")) >= 4 * FAST.max_attempts, timeout=15)
    assert bot.request("GET", "/healthz", token=None)[1]["dead_letters"] == 0
    slack.reset()  # Slack is back
    assert wait_for(lambda: len(slack.messages()) == 3, timeout=10)
    # Slack's OK comes before the row is marked delivered: wait for the worker to record it
    assert wait_for(lambda: bot.request("GET", "/healthz", token=None)[1]["outbox_depth"] == 0, timeout=5)
    assert bot.request("GET", "/healthz", token=None)[1]["dead_letters"] == 0


def test_when_sqlite_refuses_to_record_a_post_the_message_is_still_posted_once(tmp_path, slack, env, bot_server):
    bot = bot_server(config(tmp_path, slack))
    db = sqlite3.connect(str(tmp_path / "bot.sqlite"), isolation_level=None)
    try:  # real SQLite refusing the writes that follow the post (as a full disk would), for one run only
        db.execute("CREATE TRIGGER no_msg BEFORE INSERT ON messages WHEN NEW.key LIKE 'run-disk|%'"
                   " BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END")
        db.execute("CREATE TRIGGER no_row BEFORE UPDATE ON outbox WHEN NEW.run_id = 'run-disk'"
                   " BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END")
        bot.request("POST", "/v1/ingest", envelope([event(run="run-disk")]))
        bot.request("POST", "/v1/ingest", envelope([event(run="run-fine")]))
        assert wait_for(lambda: posts_for(slack, "run-disk") and posts_for(slack, "run-fine"), timeout=5)
        assert wait_for(lambda: len(slack.uploads()) == 1, timeout=10)  # run-fine's chart follows its text
        time.sleep(2.0)  # rounds go by while SQLite refuses
        assert len(posts_for(slack, "run-disk")) == 1 and len(slack.uploads()) == 1  # run-fine's chart only
        db.execute("DROP TRIGGER no_msg")
        db.execute("DROP TRIGGER no_row")  # the disk has room again
        assert wait_for(lambda: len(slack.uploads()) == 2, timeout=10)  # run-disk's chart, attached
        assert wait_for(lambda: bot.request("GET", "/healthz", token=None)[1]["outbox_depth"] == 0, timeout=5)
        assert len(posts_for(slack, "run-disk")) == 1
    finally:
        db.close()


@pytest.mark.parametrize(("raw", "slack", "console"), [
    ("run-42", "run-42", "run-42"),
    ("<!channel> <!here|here> <@U0CEO> <#C0GEN>", "&lt;!channel&gt; &lt;!here|here&gt; &lt;@U0CEO&gt; &lt;#C0GEN&gt;",
     "<!channel> <!here|here> <@U0CEO> <#C0GEN>"),
    ("<http://x|click> & more", "&lt;http://x|click&gt; &amp; more", "<http://x|click> & more"),
    ("@here @channel @everyone @herewego", "@\u2060here @\u2060channel @\u2060everyone @herewego",
     "@here @channel @everyone @herewego"),
    ("&lt; already", "&amp;lt; already", "&lt; already"),
    ("a\x1b[2Jb\x07c\x00d\re\nf", "a[2Jbcde\nf", "a\\x1b[2Jb\\x07c\\x00d\\x0de\\x0af"),
    ("bidi \u202eevil", "bidi evil", "bidi \\u202eevil"),
])
def test_one_escape_per_markup(raw, slack, console):
    from bot.receivers.render import escape_console, escape_slack, escape_slack_code

    assert escape_slack(raw) == slack
    assert escape_console(raw) == console
    assert "`" not in escape_slack_code("run`<!here>`")


def test_a_groups_chart_is_drawn_once_for_all_its_retries(tmp_path, slack, env, caplog, bot_server):
    slack.fail("chat.postMessage", status=502, times=10**6, body=HTML_502, retry_after=None,
               when=lambda p: "run-huge" in p["text"])
    bot = bot_server(config(tmp_path, slack), delivery=FAST)
    huge = event(run="run-huge")
    huge.window = Window(steps=[1, 2, 3], loss=[1e308, -1e308, 1e308], learning_rate=[0.0] * 3,
                         grad_norm=[1e-320, 1e300, 0.0], tokens_per_s=[1.0, 2.0, 3.0])
    with caplog.at_level(logging.WARNING, logger="msmon.bot"):
        bot.request("POST", "/v1/ingest", envelope([huge]))
        # the channel is not down: a message gets through after huge was queued (so each failed try counts); a
        # WARNING, whose delivery ends with its text (an ERROR's ends when its chart is attached)
        bot.request("POST", "/v1/ingest", envelope([event(run="run-fine", sev=Severity.WARNING)]))
        assert wait_for(lambda: bot.request("GET", "/healthz", token=None)[1]["dead_letters"] == 1, timeout=10)
    assert len([c for c in slack.calls_to("chat.postMessage") if "run-huge" in c.params["text"]]) == 4
    assert sum("could not be drawn" in r.getMessage() for r in caplog.records) == 1


def test_slacks_retry_after_is_read_as_the_job_reads_it():
    """One Retry-After reader for job and bot: seconds, an HTTP date, a list of values; garbage, 0 and inf
    fall back to the outbox's backoff."""
    import email.utils

    from bot.chat.slack.receiver import retry_after

    in_30s = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert retry_after("5") == 5.0 and retry_after(["7", "9"]) == 7.0
    assert 28.0 <= (retry_after(in_30s) or 0.0) <= 31.0
    assert [retry_after(v) for v in (None, "", "soon", "inf", "0", "-3", [])] == [None] * 7


def test_an_errors_text_does_not_wait_behind_the_chart_of_the_one_before(tmp_path, slack, env, bot_server,
                                                                         monkeypatch):
    """A chart slow to draw (a busy bot: matplotlib in a thread against the loop) holds back neither its own
    alert's Slack text (Slack's chart is an upload after it: no CHART_WAIT) nor the next alert's: the lane posts the
    next text while the first chart is still being drawn, and that chart still lands once, in its own alert's
    thread."""
    import asyncio

    import bot.charts as charts
    import bot.delivery.worker as worker

    real = charts.render_chart_off_loop
    first = [True]
    drawn: list[float] = []

    async def slow_once(*a: Any, **kw: Any) -> bytes:
        if first[0]:
            first[0] = False
            await asyncio.sleep(4.0)
            drawn.append(time.monotonic())
        return await real(*a, **kw)

    monkeypatch.setattr(charts, "render_chart_off_loop", slow_once)
    monkeypatch.setattr(worker, "CHART_WAIT", 30.0)  # a receiver that waited for its chart would wait it out
    bot = bot_server(config(tmp_path, slack))
    bot.request("POST", "/v1/ingest", envelope([event(run="run-a")]))
    assert wait_for(lambda: len(posts_for(slack, "run-a")) == 1, timeout=15)
    bot.request("POST", "/v1/ingest", envelope([event(run="run-b")]))
    assert wait_for(lambda: len(slack.uploads()) == 2, timeout=30)
    calls = slack.calls
    text_b = next(i for i, c in enumerate(calls) if c.method == "chat.postMessage" and "run run-b," in
                  str(c.params.get("text", "")))
    uploads = [i for i, c in enumerate(calls) if c.method == "files.completeUploadExternal"]
    assert text_b < uploads[0]  # the second text went before the first chart was attached
    assert posts_for(slack, "run-a")[0].time < drawn[0]  # the first text went before its chart was drawn
    threads = [posts_for(slack, run)[0].response["ts"] for run in ("run-a", "run-b")]
    assert sorted(u["thread_ts"] for u in slack.uploads()) == sorted(threads)
    time.sleep(0.5)
    assert len(posts_for(slack, "run-a")) == len(posts_for(slack, "run-b")) == 1


def test_an_errors_text_does_not_wait_for_the_upload_of_the_chart_before(tmp_path, slack, env, bot_server):
    """The chart of the first ERROR is drawn and its upload is slow (Slack answers files.completeUploadExternal
    3 s late): the next ERROR's text goes meanwhile. The lane waits for a message's text only, never for its
    chart's follow-up (it once waited for the upload when the chart was drawn before the text went)."""
    slack.slow("files.completeUploadExternal", 3.0)
    bot = bot_server(config(tmp_path, slack))
    bot.request("POST", "/v1/ingest", envelope([event(run="run-a")]))
    assert wait_for(lambda: slack.calls_to("files.completeUploadExternal"), timeout=15)
    completing = slack.calls_to("files.completeUploadExternal")[0].time  # its answer comes 3 s after this
    bot.request("POST", "/v1/ingest", envelope([event(run="run-b")]))
    assert wait_for(lambda: posts_for(slack, "run-b"), timeout=15)
    assert posts_for(slack, "run-b")[0].time < completing + 3.0, "run-b's text waited for run-a's chart upload"
    assert wait_for(lambda: len(slack.uploads()) == 2, timeout=15)
    threads = {posts_for(slack, run)[0].response["ts"] for run in ("run-a", "run-b")}
    assert {u["thread_ts"] for u in slack.uploads()} == threads
    assert wait_for(lambda: bot.request("GET", "/healthz", token=None)[1]["outbox_depth"] == 0, timeout=10)
    assert len(posts_for(slack, "run-a")) == len(posts_for(slack, "run-b")) == 1
