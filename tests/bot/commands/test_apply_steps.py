"""The apply steps the bot gives a run's commands, against the real bot on loopback: they never go backwards
for a run, and a pause the job answered "not applied" (CommandOrder's answer on a rank, notifier/control/order.py)
does not mark the run paused. No MindSpore here."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

pytest.importorskip("aiohttp")

from msmon.contract.wire import Heartbeat, encode  # noqa: E402
from notifier.control import CommandOrder, Request  # noqa: E402
from tests.fakes.bot_server import wait_for  # noqa: E402


def req(cid: str, action: str, at: int | None = None, **params: Any) -> Request:
    return Request(action, params, f"command {cid}", cid, at)


@pytest.fixture
def bot(tmp_path, monkeypatch, bot_server):
    monkeypatch.setenv("MSMON_TEST_TOKEN", "job-token")
    monkeypatch.setenv("MSMON_OPERATOR", "operator-token")
    b = bot_server({"bot": {
        "port": 0, "state_path": str(tmp_path / "bot.sqlite"),
        "tokens": [{"project": "llm", "env": "MSMON_TEST_TOKEN"}],
        "routes": [{"receiver": "console", "channel": "ops"}],
        "console": {"charts_dir": str(tmp_path / "charts")},
        "commands": {"allow": [{"project": "llm", "users": ["cli:carol"]}],
                     "operators": [{"user": "cli:carol", "env": "MSMON_OPERATOR"}]}}})
    yield b


def operator(bot, text: str) -> dict:
    code, body = bot.request("POST", "/v1/commands", json.dumps({"text": text}).encode(), token="operator-token")
    assert code == 200, body
    command: dict = body["command"]
    return command


def test_apply_steps_never_go_backwards_for_a_run(bot):
    from msmon.contract.wire import Envelope, Sample

    now = time.time()
    samples = [Sample(run_id="run-9", device="0", step=100 + 10 * k, time=now - 3.0 + 0.1 * k, loss=1.0)
               for k in range(10)]  # 100 steps/s, newest report 2.1 s old
    env = Envelope(run_id="run-9", device="0", sent_at=now, project="llm", samples=samples)
    assert bot.request("POST", "/v1/ingest", encode(env))[0] == 202
    pause = operator(bot, "pause run-9")
    # the job says it is paused (a rule's pause): the bot now plans from the last step, without the lag
    hb = Heartbeat(run_id="run-9", device="0", time=time.time(), step=190, paused=True)
    assert bot.request("POST", "/v1/heartbeat", encode(hb))[0] == 202
    assert wait_for(lambda: bot.store.run("run-9")["paused"], timeout=5)
    ckpt = operator(bot, "save-checkpoint run-9")
    resume = operator(bot, "resume run-9")
    assert [c["id"] for c in (pause, ckpt, resume)] == ["c1", "c2", "c3"]
    assert pause["apply_step"] > 190 + 200  # the lag covered
    assert ckpt["apply_step"] >= pause["apply_step"] and resume["apply_step"] >= ckpt["apply_step"]


def test_a_pause_the_job_did_not_apply_does_not_mark_the_run_paused(bot):
    """The bot learns pause/resume from the job's results before the next heartbeat: only a pause that
    really started says the run is paused, not one the job answered "not applied"."""
    from msmon.contract.wire import ActionResult, Envelope, Sample

    now = time.time()
    samples = [Sample(run_id="run-9", device="0", step=100 + k, time=now - 1.0 + 0.1 * k, loss=1.0) for k in range(10)]
    assert bot.request("POST", "/v1/ingest", encode(Envelope(run_id="run-9", device="0", sent_at=now, project="llm",
                                                             samples=samples)))[0] == 202
    pause, resume = operator(bot, "pause run-9"), operator(bot, "resume run-9")
    # the rank got the resume first and the pause after it had handled the resume (CommandOrder's answers)
    order = CommandOrder()
    order.offer(req(resume["id"], "resume", resume["apply_step"]))
    decided = order.decide(resume["apply_step"], 0.0)
    order.offer(req(pause["id"], "pause", pause["apply_step"]))
    decided += order.decide(resume["apply_step"] + 1, 0.1)
    assert [o.req.action for o in decided] == ["resume", "pause"] and decided[1].detail.startswith("not applied")
    for o in decided:
        res = ActionResult(run_id="run-9", device="0", step=resume["apply_step"], time=time.time(),
                           action=o.req.action, ok=True, detail=o.detail, command_id=o.req.command_id,
                           applied=o.kind != "skip", paused=False)  # as JobControl answers them
        env = Envelope(run_id="run-9", device="0", sent_at=time.time(), project="llm", actions=[res])
        assert bot.request("POST", "/v1/ingest", encode(env))[0] == 202
    assert wait_for(lambda: bot.store.commands.get(pause["id"])["status"] == "done", timeout=5)
    assert not bot.store.run("run-9")["paused"]


# -- end to end: a real MindSpore job, the real bot on loopback -----------------------------------------
