"""A storm of ERRORs to one group robot, with the settings a user gets: the real bot (bot.server, its default
rate limits, backoff, timeouts and charts) on loopback, the local DingTalk or WeCom robot (tests/fakes: it
checks each request as the platform documents and refuses the 21st message of a minute, DingTalk then
throttling the robot for 10 minutes), real time.

    .venv/bin/python bench/bench_storm.py [--robot dingtalk|wecom] [--alerts 200] [--over 60] [--seconds 180]

`--alerts` distinct runs each post one firing ERROR, spread evenly over `--over` seconds. Printed: how many
runs were shown in the chat (in a message of their own or in a summary) 60, 120 and 180 s after the first,
when the last one was, the robot's posts (messages, summaries, charts), the most it took in any 60 s window
(the platform allows 20) and the refusals it answered (its throttle: must be 0).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from msmon.contract.wire import Envelope, encode  # noqa: E402
from tests.fakes.bot_server import BotServer  # noqa: E402
from tests.fakes.dingtalk_api import DingTalkRobot  # noqa: E402
from tests.fakes.im_robot import FakeRobot  # noqa: E402
from tests.fakes.peers import ThreadedRobot  # noqa: E402
from tests.fakes.records import event  # noqa: E402
from tests.fakes.wecom_api import WeComRobot  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--robot", choices=("dingtalk", "wecom"), default="dingtalk")
    ap.add_argument("--alerts", type=int, default=200)
    ap.add_argument("--over", type=float, default=60.0)
    ap.add_argument("--seconds", type=float, default=float(os.environ.get("MSMON_BENCH_SECONDS", "180")))
    a = ap.parse_args()
    robot: FakeRobot = DingTalkRobot(time.time) if a.robot == "dingtalk" else WeComRobot(time.time)
    path = "/robot/send?access_token=robot-token" if a.robot == "dingtalk" else "/cgi-bin/webhook/send?key=robot-key"
    os.environ["MSMON_BENCH_TOKEN"] = "job-token"
    with tempfile.TemporaryDirectory() as tmp, ThreadedRobot(robot) as served:
        os.environ["DINGTALK_WEBHOOK_URL" if a.robot == "dingtalk" else "WECOM_WEBHOOK_URL"] = served.url + path
        bot = BotServer({"bot": {"port": 0, "state_path": f"{tmp}/bot.sqlite",
                                 "tokens": [{"project": "*", "env": "MSMON_BENCH_TOKEN"}],
                                 "routes": [{"receiver": a.robot}],
                                 "console": {"charts_dir": f"{tmp}/charts"}}})
        runs = [f"run-{i:03d}" for i in range(a.alerts)]
        shown: dict[str, float] = {}
        t0 = time.time()
        try:
            for i, run in enumerate(runs):
                time.sleep(max(0.0, t0 + i * a.over / a.alerts - time.time()))
                body = encode(Envelope(run_id=run, device="0", sent_at=time.time(), project="llm",
                                       events=[event(run=run)]))
                bot.request("POST", "/v1/ingest", body)
            while time.time() - t0 < a.seconds and len(shown) < len(runs):
                time.sleep(0.5)
                for call in list(robot.delivered):
                    text = json.dumps(call.body, ensure_ascii=False)
                    for run in runs:
                        if run not in shown and f"run {run}," in text:
                            shown[run] = call.at - t0
        finally:
            bot.stop()
    calls = robot.calls
    ok = [c for c in calls if c.ok]
    kinds = {"message": 0, "summary": 0, "chart": 0}
    for c in ok:
        text = json.dumps(c.body, ensure_ascii=False)
        kinds["summary" if "held back" in text else "chart" if c.body.get("msgtype") in ("image", "actionCard")
              else "message"] += 1
    sizes = [json.dumps(c.body, ensure_ascii=False).count("run run-") for c in ok
             if "held back" in json.dumps(c.body, ensure_ascii=False)]
    window = max((sum(1 for d in ok if c.at <= d.at < c.at + 60) for c in ok), default=0)
    last = max(shown.values(), default=float("nan"))
    print(f"{a.alerts} ERRORs of distinct runs over {a.over:.0f} s to one {a.robot} robot, default settings")
    for t in (60, 120, 180):
        print(f"  shown within {t:>3} s: {sum(1 for s in shown.values() if s <= t)} of {a.alerts}")
    print(f"  last shown at +{last:.0f} s; posts: {kinds['message']} messages, {kinds['summary']} summaries, "
          f"{kinds['chart']} charts (runs per summary: {sizes});\n  most in any 60 s: {window} (platform: 20); "
          f"refused: {len(calls) - len(ok)}")


if __name__ == "__main__":
    main()
