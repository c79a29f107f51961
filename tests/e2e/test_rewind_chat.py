"""Rewind through the real bot on loopback: an operator's `rewind` typed while a real MindSpore job diverges,
`status` listing the job's health checkpoints; and a rule's rewind in a 2-rank msrun job, which goes through the
bot and comes back as one command every rank applies at the same step (tests/fakes/jobs/rewind_job.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mindspore")
pytest.importorskip("aiohttp")

from tests.fakes.bot_server import wait_for  # noqa: E402
from tests.fakes.process import job_command, terminate_group  # noqa: E402

pytestmark = [pytest.mark.mindspore, pytest.mark.slow]
JOB = Path(__file__).parents[1] / "fakes" / "jobs" / "rewind_job.py"


@pytest.fixture
def bot(tmp_path, monkeypatch, bot_server):  # noqa: ANN001, ANN201
    monkeypatch.setenv("MSMON_TEST_TOKEN", "job-token")
    monkeypatch.setenv("MSMON_OPERATOR", "operator-token")
    return bot_server({"bot": {"port": 0, "state_path": str(tmp_path / "bot.sqlite"),
                               "tokens": [{"project": "*", "env": "MSMON_TEST_TOKEN"}], "console": {"charts": False},
                               "commands": {"apply_lead": 0.5,
                                            "operators": [{"user": "cli:ops", "env": "MSMON_OPERATOR"}],
                                            "allow": [{"users": ["cli:ops"]}]}}})


def command(bot, text: str, timeout: float = 90.0) -> dict:  # noqa: ANN001
    code, answer = bot.request("POST", "/v1/commands", json.dumps({"text": text}).encode(), token="operator-token")
    assert code == 200, answer
    if not answer.get("command"):  # a bot verb (status): answered at once
        return answer
    cid = answer["command"]["id"]
    assert wait_for(lambda: bot.request("GET", f"/v1/commands/{cid}", token="operator-token")[1]["status"]
                    in ("done", "failed"), timeout=timeout)
    return bot.request("GET", f"/v1/commands/{cid}", token="operator-token")[1]


def start(bot, tmp: Path, ranks: int = 1, **knobs: str) -> subprocess.Popen:  # noqa: ANN001
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"],
           "MSMON_BOT_URL": bot.url, "MSMON_JOB_TOKEN": "job-token", "MSMON_SPOOL_DIR": str(tmp / "spool"),
           "MSMON_RW_OUT": str(tmp), "PYTHONPATH": str(JOB.parents[2]), **knobs}
    cmd = job_command(JOB, ranks, tmp / "logs", env)
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def finish(job: subprocess.Popen, timeout: float = 300) -> str:
    try:
        out, _ = job.communicate(timeout=timeout)
    finally:
        terminate_group(job)
    assert job.returncode == 0, out[-4000:]
    return out


def test_an_operators_rewind_from_chat_and_the_ring_in_status(tmp_path, bot):
    job = start(bot, tmp_path, MSMON_RW_FAULT="batches:300:10:30", MSMON_RW_PACE="0.05", MSMON_RW_STEPS="700")
    try:
        def step() -> int:
            run = bot.request("GET", "/v1/runs/rw-run", token="operator-token")[1]
            return int(run.get("last_step") or 0) if isinstance(run, dict) else 0

        assert wait_for(lambda: step() >= 330, timeout=120), "the job did not get past its fault"
        status = command(bot, "status rw-run")
        text = json.dumps(status)
        assert "health checkpoints (device 0)" in text and "step 250 healthy" in text, text[:2000]
        view = command(bot, "rewind rw-run before-alert skip 100")
        assert view["status"] == "done", view
        detail = json.dumps(view)
        assert "rewound from step" in detail and "to the checkpoint of step 250" in detail, detail[:3000]
        # before-alert is the run's earliest firing alert as the bot knows it: the same step for every rank
        assert view.get("params", {}).get("before", 0) >= 300 and view["params"].get("alert"), view.get("params")
    finally:
        out = finish(job)
    rank = json.loads((tmp_path / "rank_0.json").read_text())
    assert rank["attempt"] == 1, out[-2000:]
    losses = [loss for _, loss in rank["losses"][-50:]]
    assert all(loss < 1.0 for loss in losses), losses[-5:]


def test_a_rules_rewind_in_a_two_rank_run_goes_through_the_bot_and_every_rank_applies_it(tmp_path, bot):
    actions = [{"rule": "loss_spike", "severity": "ERROR", "action": "rewind", "skip": 100},
               {"rule": "nonfinite", "severity": "ERROR", "action": "rewind", "skip": 100}]
    job = start(bot, tmp_path, ranks=2, MSMON_RW_FAULT="batches:600:20:30", MSMON_RW_PACE="0.02",
                MSMON_RW_STEPS="500", MSMON_RW_ACTIONS=json.dumps(actions))
    out = finish(job, timeout=400)
    ranks = [json.loads((tmp_path / f"rank_{r}.json").read_text()) for r in range(2)]
    done = [[x for x in r["results"] if x["action"] == "rewind" and x["applied"] and "rewound from" in x["detail"]]
            for r in ranks]
    assert all(len(d) == 1 for d in done), ([r["results"] for r in ranks], out[-3000:])
    assert done[0][0]["step"] == done[1][0]["step"], done  # one step, every rank
    assert done[0][0]["detail"].split(";")[0] == done[1][0]["detail"].split(";")[0]
    assert all(d[0]["source"].startswith("command c") and "from rule " in d[0]["source"] for d in done), done
    assert all(r["attempt"] == 1 for r in ranks)
    # a second rank's request for the same spike, if any, is answered as moot on every rank: one rewind
    moot = [[x for x in r["results"] if x["action"] == "rewind" and not x["applied"]] for r in ranks]
    assert len(moot[0]) == len(moot[1]) and all("already" in x["detail"] for m in moot for x in m), moot


def test_a_rewind_from_chat_with_one_ranks_checkpoint_truncated_is_refused_on_every_rank(tmp_path, bot):
    """issue 36, as reported: two ranks, rank 1's ring checkpoint truncated, `rewind RUN to 275` from chat loaded on
    rank 0 and was refused on rank 1. Now the command fails on both, its report names rank 1 and the file's problem,
    and both ranks train on from where they were, with one set of weights."""
    job = start(bot, tmp_path, ranks=2, MSMON_RW_PACE="0.05", MSMON_RW_STEPS="420",
                MSMON_RW_CORRUPT="1:truncated:250:301")
    try:
        def step() -> int:
            run = bot.request("GET", "/v1/runs/rw-run", token="operator-token")[1]
            return int(run.get("last_step") or 0) if isinstance(run, dict) else 0

        assert wait_for(lambda: step() >= 305, timeout=240), "the job did not reach step 305"
        view = command(bot, "rewind rw-run to 275", timeout=120)
        assert view["status"] == "failed", view
        results = view["results"]
        assert set(results) == {"0", "1"} and not any(r["ok"] for r in results.values()), results
        assert "rank 1 refused" in results["1"]["detail"] and "does not load" in results["1"]["detail"], results
        assert "rank 1 refused (see its answer)" in results["0"]["detail"], results
        assert results["0"]["step"] == results["1"]["step"] >= view["apply_step"], (results, view["apply_step"])
    finally:
        out = finish(job, timeout=400)
    ranks = [json.loads((tmp_path / f"rank_{r}.json").read_text()) for r in range(2)]
    assert all(r["attempt"] == 0 and [s for s, _ in r["losses"]] == list(range(1, 421)) for r in ranks), out[-2000:]
    assert ranks[0]["weights"] == ranks[1]["weights"]
