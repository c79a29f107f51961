"""The bot on loopback, with slack-sdk's real client talking to a local Slack-API server."""

from __future__ import annotations

import math
import time

import pytest

from msmon.contract.wire import Envelope, Event, Sample, Severity, Status, Window, encode
from notifier.transport import BotTransport
from tests.fakes.bot_server import wait_for
from tests.fakes.records import envelope, event

pytest.importorskip("aiohttp")


def config(tmp_path, slack=None, **pipeline):
    routes = [{"receiver": "slack", "channel": "C0ALERTS"}] if slack else []
    return {"bot": {
        "port": 0, "state_path": str(tmp_path / "bot.sqlite"),
        "tokens": [{"project": "llm", "env": "MSMON_TEST_TOKEN"}],
        "routes": routes, "slack": {"base_url": slack.base_url if slack else None, "max_retries": 3},
        "pipeline": {"group_wait": 0.5, **pipeline}, "rate_limit": {"per_channel": 50, "per_run": 50, "burst": 20},
        "console": {"charts_dir": str(tmp_path / "charts")}}}


@pytest.fixture
def bot(tmp_path, slack, monkeypatch, bot_server):
    monkeypatch.setenv("MSMON_TEST_TOKEN", "job-token")
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-test-token")
    b = bot_server(config(tmp_path, slack))
    yield b


def test_1000_identical_warnings_are_one_message_and_an_error_after_them_is_posted(bot, slack):
    warn = event(sev=Severity.WARNING, value=6.0)
    for _ in range(10):
        status, answer = bot.request("POST", "/v1/ingest", envelope([warn] * 100))
        assert status == 202, answer
    assert wait_for(lambda: len(slack.messages()) == 1)
    time.sleep(1.0)
    assert len(slack.messages()) == 1
    status, _ = bot.request("POST", "/v1/ingest", envelope([event()]))
    assert status == 202
    assert wait_for(lambda: len(slack.messages()) == 2)
    err = slack.messages()[1]
    assert err["text"].startswith("ERROR grad_norm: run run-42, device 0, step 100")
    header = err["blocks"][0]["text"]["text"]
    assert "ERROR grad_norm" in header
    assert wait_for(lambda: len(slack.uploads()) == 1)  # the chart, in the alert's thread
    up = slack.uploads()[0]
    assert up["thread_ts"] == err["ts"] and up["size"] > 10_000 and up["content"][:8] == b"\x89PNG\r\n\x1a\n"


def test_16_devices_hitting_one_rule_are_one_grouped_message(bot, slack):
    errors = [event(device=str(d)) for d in range(16)]
    status, _ = bot.request("POST", "/v1/ingest", envelope(errors[:1]))
    bot.request("POST", "/v1/ingest", envelope(errors[1:]))
    assert wait_for(lambda: any("16 devices" in slack.message(m["ts"])["text"] for m in slack.messages()))
    assert len(slack.messages()) == 1  # posted once (device 0 at once), then updated to list all 16
    msg = slack.message(slack.messages()[0]["ts"])
    assert "devices 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15" in msg["text"]
    warns = [event(run="run-43", rule="throughput_drop", device=str(d), sev=Severity.WARNING, value=0.4)
             for d in range(16)]
    bot.request("POST", "/v1/ingest", envelope(warns, run="run-43"))
    assert wait_for(lambda: len(slack.messages()) == 2)
    time.sleep(0.8)
    assert len(slack.messages()) == 2 and "16 devices" in slack.messages()[1]["text"]


@pytest.mark.parametrize("status", [429, 500])
def test_429_and_500_are_retried_and_nothing_is_lost(bot, slack, status):
    slack.fail("chat.postMessage", status=status, times=2, retry_after=1)
    errs = [event(run=f"run-{i}") for i in range(3)]
    for e in errs:
        bot.request("POST", "/v1/ingest", envelope([e], run=e.run_id))
    assert wait_for(lambda: len(slack.messages()) == 3, timeout=20)
    assert sorted(m["text"].split(",")[0] for m in slack.messages()) == [
        "ERROR grad_norm: run run-0", "ERROR grad_norm: run run-1", "ERROR grad_norm: run run-2"]
    assert len([c for c in slack.calls_to("chat.postMessage") if c.failed]) == 2


def test_when_slack_retries_run_out_the_outbox_keeps_the_alert(bot, slack):
    slack.fail("chat.postMessage", status=500, times=6)  # beyond slack-sdk's 3 retries
    bot.request("POST", "/v1/ingest", envelope([event()]))
    assert wait_for(lambda: len(slack.messages()) == 1, timeout=30)
    assert wait_for(lambda: bot.store.depth() == 0)
    time.sleep(0.5)
    assert len(slack.messages()) == 1


def test_resolution_updates_the_alert_message_and_answers_in_its_thread(bot, slack):
    bot.request("POST", "/v1/ingest", envelope([event()]))
    assert wait_for(lambda: len(slack.messages()) == 1)
    ts = slack.messages()[0]["ts"]
    bot.request("POST", "/v1/ingest", envelope([event(status=Status.RESOLVED, step=130)]))
    assert wait_for(lambda: slack.message(ts)["text"].startswith("RESOLVED grad_norm"))
    replies = [m for m in slack.messages() if m.get("thread_ts") == ts]
    assert replies and "back to normal" in replies[0]["text"]


def test_inhibit_and_silence_stages(bot, slack):
    bot.request("POST", "/v1/ingest", envelope([event()]))
    assert wait_for(lambda: len(slack.messages()) == 1)
    bot.request("POST", "/v1/ingest", envelope([event(rule="loss_spike", sev=Severity.WARNING, value=4.0)]))
    time.sleep(1.0)
    assert len(slack.messages()) == 1  # a WARNING of a run with an ERROR firing is held back
    _, metrics = bot.request("GET", "/metrics")
    assert 'msmon_suppressed_total{stage="inhibit"} 1.0' in metrics


def test_runs_api_and_metrics(bot, slack):
    samples = [Sample(run_id="run-42", device="0", step=i, time=float(i), loss=2.0, grad_norm=math.nan)
               for i in range(5)]
    bot.request("POST", "/v1/ingest", envelope([event()], samples=samples))
    status, runs = bot.request("GET", "/v1/runs")
    assert status == 200 and [r["run_id"] for r in runs["runs"]] == ["run-42"]
    status, run = bot.request("GET", "/v1/runs/run-42")
    assert status == 200 and run["last_step"] == 100 and run["firing"][0]["rule"] == "grad_norm"
    assert run["latest"]["0"]["grad_norm"] == "NaN"
    status, body = bot.request("GET", "/v1/runs/run-x")
    assert status == 404 and body["error"] == "no run 'run-x'" and body["known_runs"] == ["run-42"]
    status, health = bot.request("GET", "/healthz", token=None)
    assert status == 200 and health["ok"] is True
    _, metrics = bot.request("GET", "/metrics")
    assert 'msmon_events_in_total{severity="ERROR"} 1.0' in metrics and "msmon_outbox_depth" in metrics


@pytest.mark.parametrize(("body", "kwargs", "status", "reason"), [
    (b'{"run_id": "r"', {}, 400, "body is not valid JSON"),
    (b'{"run_id": 5, "device": "0", "sent_at": 1}', {}, 422, "Expected `str`, got `int` - at `$.run_id`"),
    (b'{"device": "0", "sent_at": 1}', {}, 422, "Object missing required field `run_id`"),
    (b"[]", {}, 422, "does not match the schema"),
    (b'{"run_id": "r", "device": "0", "sent_at": 1}', {"token": None}, 401, "missing or unknown bearer token"),
    (b'{"run_id": "r", "device": "0", "sent_at": 1}', {"token": "wrong"}, 401, "missing or unknown bearer token"),
    (b'{"run_id": "r", "device": "0", "sent_at": 1}', {"content_type": "text/plain"}, 415, "expected Content-Type"),
    (b'{"run_id": "r", "device": "0", "sent_at": 1, "project": "other"}', {}, 403, "this token is for project 'llm'"),
    (b"", {}, 400, "empty body"),
])
def test_bad_requests_get_the_right_4xx_with_a_reason(bot, body, kwargs, status, reason):
    got, answer = bot.request("POST", "/v1/ingest", body, **kwargs)
    assert got == status, answer
    assert reason in answer["error"]


def test_oversized_requests_get_413(bot):
    big = b'{"run_id": "r", "device": "0", "sent_at": 1, "labels": {"x": "' + b"a" * (5 << 20) + b'"}}'
    status, answer = bot.request("POST", "/v1/ingest", big)
    assert status == 413 and "byte limit" in answer["error"]


def test_the_job_trains_on_while_the_bot_is_down_then_its_spool_arrives(tmp_path, slack, monkeypatch, bot_server):
    monkeypatch.setenv("MSMON_TEST_TOKEN", "job-token")
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-test-token")
    first = bot_server(config(tmp_path, slack))
    port = first.port
    first.stop()  # the bot is down
    t = BotTransport(f"http://127.0.0.1:{port}", "run-7", "0", token="job-token", project="llm",
                     spool_dir=str(tmp_path / "spool"), flush_interval=0.05, backoff=(0.05, 0.2))
    for i in range(20_000):  # the bot is down: enqueueing must not wait for it (it returns at once)
        t.sample(Sample(run_id="run-7", device="0", step=i, time=float(i), loss=2.0))
    for r in range(5):
        t.event(event(run="run-7", rule=f"rule{r}"))
    assert wait_for(lambda: not t.spool.empty())
    cfg = config(tmp_path, slack)
    cfg["bot"]["port"] = port
    bot_server(cfg)  # the bot is back on the same port
    assert wait_for(lambda: len(slack.messages()) == 5, timeout=20)
    t.close()
    assert sorted(m["text"].split(":")[0] for m in slack.messages()) == [f"ERROR rule{r}" for r in range(5)]


def test_shipped_bot_config_loads_and_bad_keys_are_named():
    from bot.config import load_bot_config
    from notifier.config import ConfigError
    from tests.conftest import ROOT

    cfg = load_bot_config(ROOT / "config" / "bot.yaml")
    assert cfg.port == 8080 and cfg.tokens[0].env == "MSMON_TOKEN" and cfg.routes == []
    with pytest.raises(ConfigError) as info:
        load_bot_config({"bot": {"pipline": {}, "routes": [{"receiver": "slak", "channel": "C1"}]}})
    msg = str(info.value)
    assert "bot.pipline: unknown key; did you mean pipeline?" in msg
    assert "bot.routes[0].receiver: unknown receiver 'slak'; receivers are console, slack" in msg


def test_docker_image_recipe_is_bot_only_and_checks_health():
    from tests.conftest import ROOT

    text = (ROOT / "Dockerfile").read_text()
    installs = [line.strip() for line in text.splitlines() if "pip install" in line]
    # the bot's dependencies from the lock with hashes, then msmon itself without resolving anything more
    assert installs[0].startswith("RUN pip install --require-hashes --no-deps -r /tmp/lock/build.lock.txt")
    assert installs[1:] == ["pip install --no-deps --no-build-isolation /src"]
    lock = (ROOT / "requirements" / "bot.lock.txt").read_text().lower()
    assert "mindspore" not in lock and "--hash=sha256:" in lock  # the bot's dependencies, not MindSpore
    assert "USER msmon" in text and "HEALTHCHECK" in text and "/healthz" in text


def test_openapi_spec_names_every_route_and_the_wire_fields(monkeypatch):
    """docs/openapi.yaml is the API's description: every route the app serves (the Feishu, DingTalk and
    chart-link routes too, served once configured), every wire field."""
    import msgspec
    import yaml

    from bot.app import create_app
    from bot.config import load_bot_config
    from msmon.contract.wire import ActionResult, Command, Heartbeat, Poll, PollAnswer
    from tests.conftest import ROOT

    spec = yaml.safe_load((ROOT / "docs" / "openapi.yaml").read_text())
    for name in ("FEISHU_VERIFICATION_TOKEN", "DINGTALK_APP_SECRET", "MSMON_CHART_LINK_SECRET"):
        monkeypatch.setenv(name, "set")
    app = create_app(load_bot_config({"bot": {"state_path": ":memory:",
                                              "chart_links": {"public_url": "http://bot.example"}}}))
    served = {r.resource.canonical for r in app.router.routes()}
    assert served == set(spec["paths"])
    schemas = spec["components"]["schemas"]
    for name, struct in (("Envelope", Envelope), ("Event", Event), ("Sample", Sample), ("Window", Window),
                         ("Heartbeat", Heartbeat), ("ActionResult", ActionResult), ("Command", Command),
                         ("Poll", Poll), ("PollAnswer", PollAnswer)):
        fields = {f.encode_name for f in msgspec.inspect.type_info(struct).fields}
        assert set(schemas[name]["properties"]) == fields, name


def test_warnings_go_in_the_thread_of_the_runs_message(bot, slack):
    bot.request("POST", "/v1/ingest", envelope([event(rule="loss_spike", sev=Severity.WARNING, value=4.0)]))
    assert wait_for(lambda: len(slack.messages()) == 1)
    root = slack.messages()[0]
    assert "thread_ts" not in root or root["thread_ts"] is None  # the run's first message is top level
    bot.request("POST", "/v1/ingest", envelope([event(rule="throughput_drop", sev=Severity.WARNING, value=0.4)]))
    assert wait_for(lambda: len(slack.messages()) == 2)
    assert slack.messages()[1]["thread_ts"] == root["ts"]
    bot.request("POST", "/v1/ingest", envelope([event()]))  # an ERROR is always top level
    assert wait_for(lambda: len(slack.messages()) == 3)
    assert not slack.messages()[2].get("thread_ts")


def test_a_silence_holds_back_matching_alerts_until_it_expires(bot, slack):
    from bot.pipeline.silence import Silence

    bot.store.add_silence(Silence(id=0, expires_at=time.time() + 3600, run_id="run-42", rule="grad_norm",
                                  created_by="@oncall", comment="known, fixing"))
    bot.request("POST", "/v1/ingest", envelope([event()]))
    bot.request("POST", "/v1/ingest", envelope([event(rule="loss_spike")]))
    assert wait_for(lambda: len(slack.messages()) == 1)
    time.sleep(0.8)
    assert [m["text"].split(":")[0] for m in slack.messages()] == ["ERROR loss_spike"]
    _, metrics = bot.request("GET", "/metrics")
    assert 'msmon_suppressed_total{stage="silence"} 1.0' in metrics


def test_watchdog_tells_gone_from_stalled():
    from bot.ingest.watchdog import verdicts

    base = {"last_heartbeat": 100.0, "last_progress": 100.0, "paused": False}
    assert verdicts(base, 150.0, 60, 600) == {}
    assert verdicts(base, 161.0, 60, 600) == {"job_gone": 61.0}
    alive_stuck = {**base, "last_heartbeat": 800.0}
    assert verdicts(alive_stuck, 801.0, 60, 600) == {"job_stalled": 701.0}
    assert verdicts({**alive_stuck, "paused": True}, 801.0, 60, 600) == {}  # paused on purpose
    assert verdicts({"last_heartbeat": None}, 1e9, 60, 600) == {}  # never sent one: nothing to judge


def test_a_job_that_stops_sending_heartbeats_is_reported_gone(tmp_path, slack, monkeypatch, bot_server):
    monkeypatch.setenv("MSMON_TEST_TOKEN", "job-token")
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-test-token")
    cfg = config(tmp_path, slack, heartbeat_timeout=0.5)
    b = bot_server(cfg)
    from msmon.contract.wire import Heartbeat

    hb = Heartbeat(run_id="run-9", device="0", time=time.time(), step=1234)
    assert b.request("POST", "/v1/heartbeat", encode(hb))[0] == 202
    assert wait_for(lambda: any(m["text"].startswith("ERROR job_gone: run run-9") for m in slack.messages()),
                    timeout=15)
    assert b.request("GET", "/v1/runs/run-9")[1]["gone"] is True
    ts = slack.messages()[0]["ts"]

    def beating_again() -> bool:  # it is back: heartbeats every 0.1 s
        b.request("POST", "/v1/heartbeat", encode(hb))
        time.sleep(0.1)
        return slack.message(ts)["text"].startswith("RESOLVED job_gone")

    assert wait_for(beating_again, timeout=15)
    assert b.request("GET", "/v1/runs/run-9")[1]["gone"] is False
