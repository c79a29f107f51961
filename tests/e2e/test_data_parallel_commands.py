"""Chat commands on a real 2-rank data-parallel MindSpore job (msrun, CPU collectives): every rank
applies each command at the same step, so a pause or a stop never leaves one rank alone in a
collective, and the bot reports a command done once every rank has answered."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("mindspore")
pytest.importorskip("aiohttp")

from tests.fakes.bot_server import wait_for  # noqa: E402
from tests.fakes.process import terminate_group  # noqa: E402

pytestmark = [pytest.mark.mindspore, pytest.mark.slow, pytest.mark.timing]
JOB = Path(__file__).parents[1] / "fakes" / "jobs" / "data_parallel_job.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def command(bot, text: str, timeout: float = 60.0) -> dict:
    code, answer = bot.request("POST", "/v1/commands", f'{{"text": "{text}"}}'.encode(), token="operator-token")
    assert code == 200, answer
    cid = answer["command"]["id"]
    assert wait_for(lambda: bot.request("GET", f"/v1/commands/{cid}", token="operator-token")[1]["status"]
                    in ("done", "failed"), timeout=timeout)
    view: dict = bot.request("GET", f"/v1/commands/{cid}", token="operator-token")[1]
    assert view["status"] == "done", view
    return view


def test_every_rank_applies_each_command_at_the_same_step(tmp_path, monkeypatch, bot_server):
    msrun = shutil.which("msrun", path=os.path.dirname(sys.executable))
    if msrun is None:
        pytest.skip("msrun (MindSpore's launcher) is not installed")
    monkeypatch.setenv("MSMON_TEST_TOKEN", "job-token")
    monkeypatch.setenv("MSMON_OPERATOR", "operator-token")
    bot = bot_server({"bot": {"port": 0, "state_path": str(tmp_path / "bot.sqlite"),
                              "tokens": [{"project": "*", "env": "MSMON_TEST_TOKEN"}],
                              "console": {"charts": False},
                              # apply_lead 0.5 s (default 0.25): margin for a 2-core CI machine running both ranks
                              "commands": {"apply_lead": 0.5,
                                           "operators": [{"user": "cli:ops", "env": "MSMON_OPERATOR"}],
                                           "allow": [{"users": ["cli:ops"]}]}}})
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"],
           "MSMON_BOT_URL": bot.url, "MSMON_JOB_TOKEN": "job-token", "MSMON_CKPT_DIR": str(tmp_path / "ckpt"),
           "MSMON_SPOOL_DIR": str(tmp_path / "spool"), "PYTHONPATH": str(JOB.parents[2])}
    job = subprocess.Popen([msrun, "--worker_num=2", "--local_worker_num=2", f"--master_port={free_port()}",
                            f"--log_dir={tmp_path / 'logs'}", "--join=True", str(JOB)], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        # Past the warm-up (graph compile, first steps slower than the rest): the apply step's margin is the
        # run's pace, which a job that has run 50 steps has not settled yet (both ranks then land 1 step late).
        assert wait_for(lambda: len((bot.store.run("dp-run") or {}).get("devices", [])) == 2
                        and (bot.store.run("dp-run")["last_step"] or 0) > 200, timeout=180), job.poll()
        ckpt = command(bot, "save-checkpoint dp-run")
        steps = {dev: r["step"] for dev, r in ckpt["results"].items()}
        assert set(steps) == {"0", "1"} and set(steps.values()) == {ckpt["apply_step"]}, repr(ckpt)
        assert all(os.path.exists(r["path"]) for r in ckpt["results"].values())

        paused = command(bot, "pause dp-run")
        at = {r["step"] for r in paused["results"].values()}
        assert at == {paused["apply_step"]}
        time.sleep(1.0)
        assert bot.store.run("dp-run")["last_step"] == paused["apply_step"] and bot.store.run("dp-run")["paused"]
        resumed = command(bot, "resume dp-run")
        assert all("resumed at step" in r["detail"] for r in resumed["results"].values())

        stopped = command(bot, "stop dp-run confirm")
        assert {r["step"] for r in stopped["results"].values()} == {stopped["apply_step"]}
        out, _ = job.communicate(timeout=120)
        assert job.returncode == 0, out[-3000:]
    finally:
        terminate_group(job, grace=0)  # msrun and its ranks (each in a session of its own; a paused one too)
