"""Many ranks of one run against the real bot on loopback: simulated ranks post their envelopes over HTTP
(each its own rank, device and host, as the notifier does), the bot's cross-rank rules judge them, and
the local Slack API server (tests/fakes/slack_api.py) receives what a team would see."""

from __future__ import annotations

import math
import time

import pytest

from msmon.contract.wire import Envelope, Event, Heartbeat, Sample, Severity, Status, encode
from tests.fakes.bot_server import wait_for

pytest.importorskip("aiohttp")
RUN = "dp-64"


def config(tmp_path, slack, **ranks):
    return {"bot": {
        "port": 0, "state_path": str(tmp_path / "bot.sqlite"),
        "tokens": [{"project": "llm", "env": "MSMON_TEST_TOKEN"}],
        "routes": [{"receiver": "slack", "channel": "C0ALERTS"}],
        "slack": {"base_url": slack.base_url, "max_retries": 3},
        "pipeline": {"group_wait": 1.0}, "rate_limit": {"per_channel": 50, "per_run": 50, "burst": 20},
        "console": {"charts": False, "charts_dir": str(tmp_path / "charts")},
        "commands": {"operators": [{"user": "cli:ops", "env": "MSMON_OPERATOR"}]},
        "ranks": {"period": 0.2, **ranks}}}


@pytest.fixture
def bot(tmp_path, slack, monkeypatch, request, bot_server):
    monkeypatch.setenv("MSMON_TEST_TOKEN", "job-token")
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-test-token")
    monkeypatch.setenv("MSMON_OPERATOR", "operator-token")
    b = bot_server(config(tmp_path, slack, **getattr(request, "param", {})))
    yield b


def post(bot, rank: int, step: int, *, loss: float = 2.0, step_time: float = 0.1, events=(), host: str = "",
         beat: bool = True) -> None:
    now = time.time()
    env = Envelope(run_id=RUN, device=str(rank), sent_at=now, project="llm", rank=rank,
                   host=host or f"node-{rank // 8}", events=list(events),
                   samples=[Sample(run_id=RUN, device=str(rank), step=step, time=now, loss=loss, grad_norm=1.0,
                                   local_grad_norm=1.0 + 0.01 * rank, step_time=step_time,
                                   samples_per_s=32 / step_time)],
                   heartbeats=[Heartbeat(run_id=RUN, device=str(rank), time=now, step=step)] if beat else [])
    code, answer = bot.request("POST", "/v1/ingest", encode(env))
    assert code == 202, answer


def nan_event(rank: int, step: int) -> Event:
    return Event(run_id=RUN, device=str(rank), step=step, time=time.time(), rule="nonfinite",
                 severity=Severity.ERROR, status=Status.FIRING, value=math.nan, threshold=0.0,
                 message=f"loss is NaN at step {step}", metric="loss")


def final_texts(slack) -> list[str]:
    return [(slack.message(m["ts"]) or m)["text"] for m in slack.messages()]


def test_a_nan_on_64_ranks_is_one_post_that_says_64_of_64(bot, slack):
    for r in range(64):
        post(bot, r, 12_390)
    first = 17
    post(bot, first, 12_400, loss=math.nan, events=[nan_event(first, 12_400)])
    for r in range(64):
        if r != first:
            post(bot, r, 12_400, loss=math.nan, events=[nan_event(r, 12_400)])
    assert wait_for(lambda: any("64/64" in t for t in final_texts(slack)), timeout=20), final_texts(slack)
    time.sleep(1.5)  # past group_wait: nothing else comes
    posts = [m for m in slack.messages() if not m.get("thread_ts")]
    assert len(posts) == 1, [m["text"][:80] for m in posts]
    text = final_texts(slack)[0]
    assert "ERROR nonfinite: run dp-64, on 64/64 ranks (first: rank 17 at step 12,400)" in text
    header = slack.message(posts[0]["ts"])["blocks"][0]["text"]["text"]
    assert "64/64 ranks" in header


def test_a_slow_rank_is_named_as_the_straggler_and_shown_in_status(bot, slack):
    for i in range(12):
        for r in range(8):
            post(bot, r, 10 * i, step_time=0.5 if r == 5 else 0.1, host="gpu-<b>" if r == 5 else "")
        time.sleep(0.1)
    assert wait_for(lambda: any("rank_straggler" in t for t in final_texts(slack)), timeout=20)
    texts = [t for t in final_texts(slack) if "rank_straggler" in t]
    assert len(texts) == 1 and "rank 5 (on gpu-&lt;b&gt;) is a straggler" in texts[0], texts
    assert not any("rank_outlier" in t or "rank_missing" in t for t in final_texts(slack))
    code, answer = bot.request("POST", "/v1/commands", b'{"text": "status dp-64"}', token="operator-token")
    assert code == 200, answer
    status = answer["text"]
    assert "ranks: 8 known, 8 live, 1 marked (!)" in status, status
    row = next(line for line in status.splitlines() if line.startswith("!"))
    assert row.split()[1] == "5" and "rank_straggler" in row and "0.5 s" in row


def test_a_silent_rank_is_a_missing_rank_error(bot, slack):
    for i in range(3):
        for r in range(4):
            post(bot, r, 10 * i)
    deadline = time.time() + 3.5  # missing_after 2 s (below): ranks 0-2 go on, rank 3 is silent
    i = 3
    while time.time() < deadline:
        for r in range(3):
            post(bot, r, 10 * i)
        i += 1
        time.sleep(0.25)
    assert wait_for(lambda: any("rank_missing" in t for t in final_texts(slack)), timeout=10)
    t = next(t for t in final_texts(slack) if "rank_missing" in t)
    assert t.startswith("ERROR rank_missing") and "rank 3" in t and "stopped reporting at step 20" in t


test_a_silent_rank_is_a_missing_rank_error = pytest.mark.parametrize(
    "bot", [{"missing_after": 2.0}], indirect=True)(test_a_silent_rank_is_a_missing_rank_error)
