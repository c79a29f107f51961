"""The bot's cross-rank rules on a real data-parallel MindSpore job: 2-3 ranks under msrun on the CPU
(tests/fakes/jobs/ranks_job.py, its knobs in the environment), each rank's own notifier reporting to the
real bot on loopback, what a team would see landing on the local Slack API server."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mindspore")
pytest.importorskip("aiohttp")

from bot.app import STATE  # noqa: E402
from tests.fakes.bot_server import BotServer, wait_for  # noqa: E402
from tests.fakes.process import terminate_group  # noqa: E402

pytestmark = [pytest.mark.mindspore, pytest.mark.slow]
JOB = Path(__file__).parents[1] / "fakes" / "jobs" / "ranks_job.py"
RUN = "ranks-run"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Job:
    """One msrun start of ranks_job.py against `bot`, with `knobs` in its environment."""

    def __init__(self, bot: BotServer, tmp: Path, ranks: int, **knobs: str) -> None:
        msrun = shutil.which("msrun", path=os.path.dirname(sys.executable))
        if msrun is None:
            pytest.skip("msrun (MindSpore's launcher) is not installed")
        self.pids = tmp / "pids"
        self.pids.mkdir()
        env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"],
               "MSMON_BOT_URL": bot.url, "MSMON_JOB_TOKEN": "job-token", "MSMON_SPOOL_DIR": str(tmp / "spool"),
               "MSMON_RANKS_PID_DIR": str(self.pids), "MSMON_RANKS_RUN": RUN, "PYTHONPATH": str(JOB.parents[2]),
               **knobs}
        self.proc = subprocess.Popen([msrun, f"--worker_num={ranks}", f"--local_worker_num={ranks}",
                                      f"--master_port={free_port()}", f"--log_dir={tmp / 'logs'}", "--join=True",
                                      str(JOB)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)

    def pid(self, rank: int) -> int:
        return int((self.pids / f"rank_{rank}.pid").read_text())

    def stop(self) -> None:
        """msrun and every rank, each in a session of its own (msrun starts them with setsid) and one of them
        perhaps SIGSTOPped: killing msrun's group alone left that rank behind, stopped, after the suite."""
        terminate_group(self.proc, grace=5)


@pytest.fixture
def bot(tmp_path: Path, slack: Any, monkeypatch: pytest.MonkeyPatch, bot_server) -> Iterator[BotServer]:
    monkeypatch.setenv("MSMON_TEST_TOKEN", "job-token")
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-test-token")
    b = bot_server({"bot": {
        "port": 0, "state_path": str(tmp_path / "bot.sqlite"), "tokens": [{"project": "*", "env": "MSMON_TEST_TOKEN"}],
        "routes": [{"receiver": "slack", "channel": "C0RANKS"}],
        "slack": {"base_url": slack.base_url, "max_retries": 3},
        "pipeline": {"group_wait": 2.0, "inhibit_warnings": False},
        "rate_limit": {"per_channel": 50, "per_run": 50, "burst": 20},
        "console": {"charts": False},
        "ranks": {"period": 0.5, "missing_after": 5.0, "history": 4, "outlier_checks": 3}}})
    yield b


def alerts(bot: BotServer, rule: str) -> dict[str, str]:
    """device -> severity of the run's alerts of `rule` that fired (firing or since resolved)."""
    bot.app[STATE].flush()
    rows = bot.store.alerts(RUN, "firing") + bot.store.alerts(RUN, "resolved")
    return {a["device"]: a["severity"] for a in rows if a["rule"] == rule}


def posts(slack: Any) -> list[str]:
    """The channel's top-level messages as they stand now (updates applied)."""
    return [(slack.message(m["ts"]) or m)["text"] for m in slack.messages() if not m.get("thread_ts")]


def test_a_bad_shard_is_the_outlier_and_a_nan_on_every_rank_is_one_grouped_error(bot, slack, tmp_path):
    job = Job(bot, tmp_path, 3, MSMON_RANKS_BAD="2", MSMON_RANKS_STEPS="400", MSMON_RANKS_NAN_STEP="300",
              MSMON_RANKS_INTERVAL="5", MSMON_RANKS_PACE="0.03")  # 12 s or more of steps: a dozen envelopes a rank
    try:
        assert wait_for(lambda: "2" in alerts(bot, "rank_outlier"), timeout=150), job.proc.poll()
        assert set(alerts(bot, "rank_outlier")) == {"2"}
        assert wait_for(lambda: any("nonfinite" in t and "3/3 ranks" in t for t in posts(slack)), timeout=150), \
            posts(slack)
        time.sleep(3.0)  # past group_wait: no second message for the same storm
        nan = [t for t in posts(slack) if "nonfinite" in t]
        assert len(nan) == 1 and t_first_rank(nan[0]) in {"0", "1", "2"}, nan
        assert not alerts(bot, "rank_straggler") and not alerts(bot, "rank_missing")
        out, _ = job.proc.communicate(timeout=120)
        assert job.proc.returncode == 0, out[-3000:]
    finally:
        job.stop()


def t_first_rank(text: str) -> str:
    """The rank a storm's message names first ("(first: rank 2 at step ...)")."""
    return text.split("(first: rank ", 1)[1].split(" ", 1)[0]


def test_a_hung_rank_is_the_missing_rank_error(bot, slack, tmp_path):
    # The rank is stopped (SIGSTOP: hung, as a process in uninterruptible I/O or a wedged driver is), the
    # others go on heartbeating while they wait for it in the next all-reduce. A SIGKILL instead closes its
    # connections, and on MindSpore's CPU backend some or all of the other ranks then freeze within a second,
    # their notifiers' threads with them (in every try here): the bot sees those go silent too.
    job = Job(bot, tmp_path, 3, MSMON_RANKS_STEPS="100000", MSMON_RANKS_INTERVAL="5")
    try:
        view = bot.app[STATE].ranks
        assert wait_for(lambda: view.known(RUN) == 3 and all(
            (m.step or 0) > 40 for m in view.runs[RUN].members.values()), timeout=150), job.proc.poll()
        os.kill(job.pid(2), signal.SIGSTOP)
        assert wait_for(lambda: alerts(bot, "rank_missing").get("2") == "ERROR", timeout=60), \
            (alerts(bot, "rank_missing"), {k: (m.rank, m.device, m.step, time.time() - m.last_seen)
                                          for k, m in view.runs[RUN].members.items()})
        assert wait_for(lambda: any("rank_missing" in t for t in posts(slack)), timeout=30), posts(slack)
        text = next(t for t in posts(slack) if "rank_missing" in t)
        assert text.startswith("ERROR rank_missing") and "2 (" in text and "stopped reporting" in text, text
        time.sleep(2.0)
        assert set(alerts(bot, "rank_missing")) == {"2"}  # the others heartbeat while they wait: not missing
    finally:
        job.stop()


def test_a_rank_with_a_slow_data_pipeline_is_named_the_straggler(bot, slack, tmp_path):
    # In lockstep every rank's wall step time is the slowest one's (each waits for it in the all-reduce):
    # what names the slow rank is its own input wait (Sample.data_time), which only it has.
    # Its loader sleeps 0.15 s a batch: longer than a step computes even at load 15-20. At 0.03 s, a loaded machine's
    # own step took as long, the prefetching pipeline kept up, and rank 1 rightly was no straggler (input wait ~1 ms).
    job = Job(bot, tmp_path, 3, MSMON_RANKS_SLOW="1:0.15", MSMON_RANKS_STEPS="300", MSMON_RANKS_INTERVAL="5")
    try:
        view = bot.app[STATE].ranks
        assert wait_for(lambda: view.known(RUN) == 3 and all(
            (m.step or 0) > 100 for m in view.runs[RUN].members.values()), timeout=150), job.proc.poll()
        members = view.runs[RUN].members
        assert wait_for(lambda: "1" in alerts(bot, "rank_straggler"), timeout=60), \
            {k: (m.step_time, list(m.waits)) for k, m in members.items()}
        assert wait_for(lambda: any("rank_straggler" in t for t in posts(slack)), timeout=30), posts(slack)
        text = next(t for t in posts(slack) if "rank_straggler" in t)
        assert "rank 1 (" in text and "device 1" in text and "input wait" in text, text
        assert set(alerts(bot, "rank_straggler")) == {"1"}, {k: (m.step_time, list(m.waits))
                                                            for k, m in members.items()}
        out, _ = job.proc.communicate(timeout=120)
        assert job.proc.returncode == 0, out[-3000:]
        assert set(alerts(bot, "rank_straggler")) == {"1"}  # to the end of the run: no other rank named
    finally:
        job.stop()
