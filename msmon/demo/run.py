"""`msmon demo`: the whole story on the embedded defaults (SQLite, console receiver, no account).

The bot starts in this process; the incident trace is replayed through a `Monitor` whose
transport posts to the bot exactly as a training job would; the bot's console receiver prints the
alerts (with chart PNGs written to a folder) as they arrive, through a `Story` (msmon/demo/story.py)
that keeps a command and its answer together.
"""

from __future__ import annotations

import logging
import os
import secrets
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import TextIO, cast

from bot.config import load_bot_config
from bot.receivers.console import ConsoleReceiver
from bot.server import BotThread
from msmon.contract.wire import Event
from msmon.demo.story import Story
from msmon.offline.readers import read_csv
from msmon.offline.replay import replay
from notifier import Monitor
from notifier.config import load_config
from notifier.transport import BotTransport


def run_demo(trace: str, monitor_config: str, out_dir: str, story: Story, pace: float = 0.002
             ) -> tuple[list[Event], BotThread]:
    """Replay `trace` through a Monitor that reports to a bot started here, `pace` seconds per step
    (a 10 s step in 2 ms: fast, but slow enough that what happened first arrives first). The bot's
    console receiver writes to `story`."""
    token = secrets.token_urlsafe(16)
    os.environ["MSMON_DEMO_TOKEN"] = token
    os.environ["MSMON_OPERATOR_TOKEN"] = secrets.token_urlsafe(16)  # for `msmon cmd` in part 2
    bot_cfg = load_bot_config({"bot": {
        "port": 0, "state_path": os.path.join(out_dir, "bot.sqlite"),
        "tokens": [{"project": "*", "env": "MSMON_DEMO_TOKEN"}],
        "console": {"charts_dir": os.path.join(out_dir, "charts")},
        # A terminal has no chat API's rate to respect: every message goes at once, in the order it came.
        "rate_limit": {"per_channel": 1000, "per_run": 1000, "global_rate": 1000, "burst": 1000},
        # ... and every alert is shown, a WARNING during an ERROR too, so each step `status` names is printed above;
        # one device, nothing to group: each goes out as it comes, so a WARNING is never printed after a later ERROR.
        "pipeline": {"group_wait": 0.0, "inhibit_warnings": False},
        "commands": {"operators": [{"user": "demo:you", "env": "MSMON_OPERATOR_TOKEN"}],
                     "allow": [{"project": "*", "users": ["demo:you"]}]}}})
    for suffix in ("", "-wal", "-shm"):  # a fresh demo each time
        path = bot_cfg.state_path + suffix
        if os.path.exists(path):
            os.remove(path)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    console = ConsoleReceiver(bot_cfg.console.charts_dir, out=cast(TextIO, story))  # Story writes like a TextIO
    bot = BotThread(bot_cfg, receivers={"console": console})
    cfg = load_config(monitor_config)
    cfg.bot.url, cfg.bot.token_env = bot.url, "MSMON_DEMO_TOKEN"
    cfg.bot.spool_dir = os.path.join(out_dir, "spool")
    cfg.tensorboard.log_dir = os.path.join(out_dir, "tb_logs")
    transport = BotTransport(bot.url, "demo-13b", "0", token, spool_dir=cfg.bot.spool_dir, flush_interval=0.05)
    mon = Monitor(cfg, "demo-13b", transport=transport)
    events = replay(read_csv(trace), mon, on_row=lambda _: time.sleep(pace))  # closing mon flushes the transport
    deadline = time.monotonic() + 30
    while bot.store.depth() and time.monotonic() < deadline:
        time.sleep(0.1)
    return events, bot


COMMANDS = ("save-checkpoint demo-ms", "pause demo-ms", "status demo-ms", "resume demo-ms",
            "scale-lr demo-ms 0.125", "stop demo-ms confirm")


def _first_error(bot: BotThread, run_id: str) -> dict[str, object] | None:
    return next((a for a in bot.store.alerts(run_id, "firing") if a["severity"] == "ERROR"), None)


@dataclass
class Chatops:
    """What part two did: whether every command worked, and the alerts the job raised (in order)."""

    ok: bool
    events: list[Event] = field(default_factory=list)
    at: int = 0  # the step the bad schedule starts
    jump: float = 1.0


def run_chatops(bot: BotThread, out_dir: str, story: Story, timeout: float = 180.0) -> Chatops:
    """Part two: a real MindSpore training reports to `bot`, goes unstable, and is handled with
    `msmon cmd` (a real CLI process) once its first ERROR is out."""
    from msmon.demo.mindspore_job import UnstableJob  # MindSpore only here

    job = UnstableJob(bot.url, "MSMON_DEMO_TOKEN", out_dir)
    job.start()
    deadline = time.monotonic() + timeout
    while (_first_error(bot, job.run_id) is None or bot.store.depth()) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _first_error(bot, job.run_id) is None:
        story.say("the toy job raised no ERROR in time: the demo stops it")
        job.callback.control.request("stop")
        return Chatops(False, job.events, job.at, job.jump)
    ok = True
    env = {**os.environ, "MSMON_BOT_URL": bot.url}
    for text in COMMANDS:
        story.settle(bot.store.depth)  # what the bot has to say comes first
        with story.held():  # and nothing it says comes between a command and its answer
            story.say(f'\n$ msmon cmd "{text}"')
            done = subprocess.run([sys.executable, "-m", "msmon.cli.main", "cmd", text, "--wait", "30"], env=env,
                                  capture_output=True, text=True, timeout=60)
            story.say((done.stdout + done.stderr).rstrip())
        ok = ok and done.returncode == 0
    job.join(60)
    story.settle(bot.store.depth)
    return Chatops(ok, job.events, job.at, job.jump)
