"""`msmon demo`: the whole story on the embedded defaults (SQLite, console receiver, no account).

The bot starts in this process; the incident trace is replayed through a `Monitor` whose
transport posts to the bot exactly as a training job would; the bot's console receiver prints the
alerts (with chart PNGs written to a folder) as they arrive.
"""

from __future__ import annotations

import logging
import os
import secrets
import time

from notifier import Monitor
from notifier.config import load_config
from notifier.replay import read_csv
from notifier.transport import BotTransport
from notifier.wire import Event

from .config import load_bot_config
from .server import BotThread


def run_demo(trace: str, monitor_config: str, out_dir: str, pace: float = 0.002) -> tuple[list[Event], BotThread]:
    """Replay `trace` through a Monitor that reports to a bot started here, `pace` seconds per step
    (a 10 s step in 2 ms: fast, but slow enough that what happened first arrives first)."""
    token = secrets.token_urlsafe(16)
    os.environ["MSMON_DEMO_TOKEN"] = token
    bot_cfg = load_bot_config({"bot": {
        "port": 0, "state_path": os.path.join(out_dir, "bot.sqlite"),
        "tokens": [{"project": "*", "env": "MSMON_DEMO_TOKEN"}],
        "pipeline": {"group_wait": 0.05}, "console": {"charts_dir": os.path.join(out_dir, "charts")}}})
    for suffix in ("", "-wal", "-shm"):  # a fresh demo each time
        path = bot_cfg.state_path + suffix
        if os.path.exists(path):
            os.remove(path)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    bot = BotThread(bot_cfg)
    cfg = load_config(monitor_config)
    cfg.bot.url, cfg.bot.token_env = bot.url, "MSMON_DEMO_TOKEN"
    cfg.bot.spool_dir = os.path.join(out_dir, "spool")
    cfg.tensorboard.log_dir = os.path.join(out_dir, "tb_logs")
    transport = BotTransport(bot.url, "demo-13b", "0", token, spool_dir=cfg.bot.spool_dir, flush_interval=0.05)
    mon = Monitor(cfg, "demo-13b", transport=transport)
    events: list[Event] = []
    for r in read_csv(trace):
        events += mon.step(r.step, loss=r.loss, lr=r.lr, grad_norm=r.grad_norm, throughput=r.throughput, time=r.time)
        time.sleep(pace)
    mon.close()  # flushes the transport
    deadline = time.monotonic() + 30
    while bot.store.depth() and time.monotonic() < deadline:
        time.sleep(0.1)
    return events, bot
