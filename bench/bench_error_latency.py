"""ERROR -> chat while the bot's ingest is saturated: a real `msmon serve` process (SQLite, default delivery and
rate limits, charts on) posting to the local Slack API, `--ranks` simulated ranks of one run each posting an
envelope (a sample and a heartbeat) once a second from `--clients` processes (bench_ranks.py's clients), and
one ERROR of a new run every 2 s from this process. Printed: the envelopes/s the bot took against those
offered, and the ERRORs' latency from the job's POST to Slack's chat.postMessage (p50, p99, max).

    .venv/bin/python bench/bench_error_latency.py [--ranks 1000] [--clients 2] [--seconds 60]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_ranks import TOKEN, _client  # noqa: E402

from msmon.contract.wire import Envelope, encode  # noqa: E402
from tests.fakes.records import event  # noqa: E402
from tests.fakes.serve_process import ServeProcess  # noqa: E402
from tests.fakes.slack_api import SlackAPIServer  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=1000)
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=float(os.environ.get("MSMON_BENCH_SECONDS", "60")))
    a = ap.parse_args()
    env = {"BENCH_TOKEN": TOKEN, "SLACK_BOT_TOKEN": "xoxb-bench"}
    with tempfile.TemporaryDirectory() as tmp, SlackAPIServer() as slack:
        cfg = {"bot": {"state_path": f"{tmp}/bot.sqlite", "tokens": [{"project": "*", "env": "BENCH_TOKEN"}],
                       "routes": [{"receiver": "slack", "channel": "C0ALERTS"}], "slack": {"base_url": slack.base_url},
                       "console": {"charts_dir": f"{tmp}/charts"}}}
        from pathlib import Path

        bot = ServeProcess(Path(tmp), "bot", cfg, env)
        q: multiprocessing.Queue = multiprocessing.Queue()  # type: ignore[type-arg]
        parts = [range(i, a.ranks, a.clients) for i in range(a.clients)]
        clients = [multiprocessing.Process(target=_client, args=(bot.url + "/v1/ingest", part, a.seconds,
                                                                 a.seconds * 10, q)) for part in parts]
        sent: dict[str, float] = {}
        posted: list[float] = []  # each ERROR's POST -> 202 (the ingest's share of the latency)
        try:
            for c in clients:
                c.start()
            time.sleep(min(5.0, a.seconds / 4))  # the load is on
            t_end = time.monotonic() + a.seconds - 10
            i = 0
            while time.monotonic() < t_end:
                run = f"run-err-{i:03d}"
                body = encode(Envelope(run_id=run, device="0", sent_at=time.time(), project="llm",
                                       events=[event(run=run)]))
                req = urllib.request.Request(bot.url + "/v1/ingest", data=body, method="POST", headers={
                    "Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
                sent[run] = time.monotonic()
                with urllib.request.urlopen(req, timeout=30) as r:
                    r.read()
                posted.append(time.monotonic() - sent[run])
                i += 1
                time.sleep(2.0)
            got = [q.get(timeout=a.seconds + 600) for _ in clients]
            for c in clients:
                c.join(30)
            time.sleep(3)
        finally:
            for c in clients:
                if c.is_alive():
                    c.terminate()
            bot.stop()
    shown = {}
    for call in slack.calls_to("chat.postMessage"):
        for run, t in sent.items():
            if run not in shown and f"run {run}," in str(call.params.get("text", "")):
                shown[run] = call.time - t
    lat = sorted(shown.values())
    took = sum(g["ok"] for g in got) / max(g["elapsed"] for g in got)
    print(f"{a.ranks} ranks, one envelope a second each ({a.ranks}/s offered): the bot took {took:,.0f}/s")
    if lat:
        p99 = lat[min(len(lat) - 1, round(0.99 * (len(lat) - 1)))]
        print(f"ERROR -> Slack chat.postMessage: {len(lat)} of {len(sent)} shown; p50 {statistics.median(lat):.2f} s, "
              f"p99 {p99:.2f} s, max {lat[-1]:.2f} s")
        print("slowest: " + ", ".join(f"{x:.2f} s" for x in lat[-3:][::-1]))
        posted.sort()
        print(f"of which the ERROR's POST -> 202 (ingest): p50 {statistics.median(posted):.2f} s, "
              f"max {posted[-1]:.2f} s")
    else:
        print(f"ERROR -> Slack: none of {len(sent)} shown")


if __name__ == "__main__":
    main()
