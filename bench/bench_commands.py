"""Command latency, chat to applied in the job, on loopback, measured in one run.

    .venv/bin/python bench/bench_commands.py [--commands 60]

A real MindSpore toy job (notifier/mindspore/toy.py, ~100 steps/s on this CPU) reports to the real
bot; signed Slack slash commands (`/msmon scale-lr bench 1.0`, harmless) are posted one at a time
at random moments. Latency = the job's clock when its rank applied the command at a step boundary
(ActionResult.time) minus the moment the slash command was sent: it includes the bot's apply step
(a margin past the run's latest step, so that every rank of a data-parallel job can act together),
the long poll, and the wait for that step. Bot and job share this process (one GIL).
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import mindspore as ms  # noqa: E402

from bot.config import load_bot_config  # noqa: E402
from bot.server import BotThread  # noqa: E402
from notifier.mindspore import MonitorCallback  # noqa: E402
from notifier.mindspore.toy import dataset, model, regression_data  # noqa: E402
from tests.fakes.slack_signing import SECRET, slash  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--commands", type=int, default=60)
    args = ap.parse_args()
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    tmp = tempfile.mkdtemp(prefix="msmon-bench-cmd-")
    os.environ.update(MSMON_BENCH_TOKEN="bench-token", SLACK_SIGNING_SECRET=SECRET)
    bot = BotThread(load_bot_config({"bot": {
        "port": 0, "state_path": os.path.join(tmp, "bot.sqlite"),
        "tokens": [{"project": "*", "env": "MSMON_BENCH_TOKEN"}],
        "console": {"charts": False}, "commands": {"allow": [{"users": ["U0BENCH"]}]}}}))
    cb = MonitorCallback({"monitor_config": {"monitor_on": True, "step_interval": 1, "log_interval": 0,
                                             "bot": {"url": bot.url, "token_env": "MSMON_BENCH_TOKEN",
                                                     "heartbeat_interval": 1.0,
                                                     "spool_dir": os.path.join(tmp, "spool")}}}, run_id="bench",
                         checkpoint_dir=os.path.join(tmp, "ckpt"))
    x, y = regression_data()
    m, _, _ = model(lr=0.01)
    job = threading.Thread(target=lambda: m.train(1, dataset(x, y, 256, 30_000), callbacks=[cb],
                                                  dataset_sink_mode=False), daemon=True)
    job.start()
    while (bot.store.run("bench") or {}).get("last_step") is None or bot.store.run("bench")["last_step"] < 200:
        time.sleep(0.1)
    sent: dict[str, float] = {}
    for _ in range(args.commands):
        time.sleep(random.uniform(0.1, 0.4))
        t = time.time()
        code, body = slash(bot.url, "scale-lr bench 1.0", user="U0BENCH")
        assert code == 200 and "queued as" in body["text"], body
        sent[body["text"].split("queued as ")[1].split(":")[0]] = t
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and sum(r.command_id in sent for r in cb.control.results) < len(sent):
        time.sleep(0.1)
    lat = sorted(r.time - sent[r.command_id] for r in cb.control.results if r.command_id in sent)
    steps = [r.step - bot.store.commands.get(r.command_id)["apply_step"] for r in cb.control.results
             if r.command_id in sent]
    cb.control.request("stop")
    job.join(30)
    bot.stop()
    q = statistics.quantiles(lat, n=100, method="inclusive")
    print(f"command latency, signed /msmon slash command -> applied at a step boundary in a real MindSpore job "
          f"(~{cb.monitor.transport.last_step / 1:.0f} steps run), n={len(lat)}: p50 {q[49] * 1e3:.0f} ms, "
          f"p99 {q[98] * 1e3:.0f} ms, max {lat[-1] * 1e3:.0f} ms; applied exactly at the bot's apply step: "
          f"{sum(s == 0 for s in steps)}/{len(steps)} (late by up to {max(steps)} steps)")


if __name__ == "__main__":
    main()
