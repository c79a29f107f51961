"""`status` says how old its answer is (issue 36: it answered ~700 steps stale without saying so): a run not heard
from lately says when it was last heard, and metrics older than the run's last reported step (samples shed while
the bot was overloaded, or not sent) say which step they are of. The real bot on loopback, its clock moved."""

from __future__ import annotations

import json
import time

import pytest

from msmon.contract.wire import Envelope, Heartbeat, Sample, encode

pytest.importorskip("aiohttp")


def test_a_stale_status_says_how_old_it_is(tmp_path, monkeypatch, bot_server):
    monkeypatch.setenv("MSMON_TEST_TOKEN", "job-token")
    monkeypatch.setenv("MSMON_OPERATOR", "operator-token")
    later = [0.0]
    bot = bot_server({"bot": {
        "port": 0, "state_path": str(tmp_path / "bot.sqlite"), "console": {"charts": False},
        "tokens": [{"project": "llm", "env": "MSMON_TEST_TOKEN"}],
        "commands": {"operators": [{"user": "cli:ops", "env": "MSMON_OPERATOR"}],
                     "allow": [{"project": "*", "users": ["cli:ops"]}]}}}, clock=lambda: time.time() + later[0])

    def status() -> str:
        code, answer = bot.request("POST", "/v1/commands", json.dumps({"text": "status run-s"}).encode(),
                                   token="operator-token")
        assert code == 200, answer
        return str(answer["text"])

    now = time.time()
    samples = [Sample(run_id="run-s", device="0", step=s, time=now, loss=2.0) for s in range(1, 11)]
    assert bot.request("POST", "/v1/ingest", encode(Envelope(run_id="run-s", device="0", sent_at=now,
                                                             project="llm", samples=samples)))[0] == 202
    fresh = status()
    assert "last heard" not in fresh and "metrics as of" not in fresh, fresh
    # its samples stop reaching the bot (shed), its steps still do
    hb = Heartbeat(run_id="run-s", device="0", time=now, step=710, project="llm")
    assert bot.request("POST", "/v1/heartbeat", encode(hb))[0] == 202
    later[0] = 12 * 60.0
    said = status()
    assert "step 710" in said and "last heard 12m" in said, said
    assert "metrics as of step 10, 700 steps before the last reported step, sampled 12m" in said, said
