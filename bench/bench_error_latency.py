"""ERROR -> chat while the bot's ingest is saturated: a real `msmon serve` process (SQLite, default delivery and
rate limits, charts on) posting to the local Slack API, `--ranks` simulated ranks of one run each posting an
envelope (a sample and a heartbeat) once a second from `--clients` processes (bench_ranks.py's clients), and
one ERROR of a new run every 2 s from this process. Printed: the envelopes/s the bot took against those
offered, the ERRORs' latency from the job's POST to Slack's chat.postMessage (p50, p99, max), and where that
time went: each stage's p50 and p99 from the bot's delivery trace (bot/delivery/trace.py, MSMON_DELIVERY_TRACE),
one clock (time.monotonic) for the bench, the bot and the local Slack API. The load average is printed before
and after: the machine's other work slows every stage that needs a CPU.

    .venv/bin/python bench/bench_error_latency.py [--ranks 1000] [--clients 2] [--seconds 60]
"""

from __future__ import annotations

import argparse
import json
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
    print(f"load average before: {_load()}")
    with tempfile.TemporaryDirectory() as tmp, SlackAPIServer() as slack:
        env = {"BENCH_TOKEN": TOKEN, "SLACK_BOT_TOKEN": "xoxb-bench",  # the trace kept where the caller says
               "MSMON_DELIVERY_TRACE": os.environ.get("MSMON_DELIVERY_TRACE", f"{tmp}/trace.jsonl")}
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
        trace = _read_trace(env["MSMON_DELIVERY_TRACE"])
    shown, arrived = {}, {}
    for call in slack.calls_to("chat.postMessage"):
        for run, t in sent.items():
            if run not in shown and f"run {run}," in str(call.params.get("text", "")):
                shown[run] = call.time - t
                arrived[run] = call.time
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
        _stages(sent, arrived, trace)
    else:
        print(f"ERROR -> Slack: none of {len(sent)} shown")
    print(f"load average after: {_load()}")


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _read_trace(path: str) -> dict[str, dict[str, float]]:
    """run -> its first alert message's stage times (bot/delivery/trace.py), with `deferred` among them."""
    out: dict[str, dict[str, float]] = {}
    if not os.path.exists(path):
        return out
    with open(path, encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            if rec["kind"] == "alert" and rec["run"] not in out:
                out[rec["run"]] = {**rec["stages"], "deferred": rec["deferred"]}
    return out


# Consecutive segments from the job's POST to Slack's receipt of chat.postMessage (they add up to the total), then
# the chart's own, which overlap them (the text waits for the chart at most CHART_WAIT).
SEGMENTS = (
    ("POST -> bot took it (HTTP, the loop's queue)", "sent", "received"),
    ("took -> first picked (ingest, commit, ring, worker wake, query)", "received", "first_pick"),
    ("  of which took -> ring (ingest and commit)", "received", "ring"),
    ("  of which ring -> worker loop woke", "ring", "wake"),
    ("  of which woke -> picked (due query)", "wake", "pick"),
    ("first picked -> picked for good (rate-limit deferrals)", "first_pick", "pick"),
    ("picked -> lane's turn (claim)", "pick", "turn"),
    ("turn -> planned (delivery stages)", "turn", "planned"),
    ("planned -> text POST begins (store reads, chart wait)", "planned", "post_start"),
    ("text POST -> Slack got it", "post_start", "arrived"),
)
CHART = (
    ("chart: queued -> a thread began it", "chart_queued", "chart_start"),
    ("chart: drawing", "chart_start", "chart_end"),
    ("chart: drawn -> the loop took it back", "chart_end", "chart_back"),
)


def _stages(sent: dict[str, float], arrived: dict[str, float], trace: dict[str, dict[str, float]]) -> None:
    rows = [{**trace[run], "sent": sent[run], "arrived": arrived[run]} for run in arrived if run in trace]
    if not rows:
        print("no delivery trace (MSMON_DELIVERY_TRACE): no stage breakdown")
        return
    deferred = sum(1 for r in rows if r["deferred"])
    print(f"where the time went ({len(rows)} ERRORs traced, {deferred} deferred by a rate limit at least once), "
          f"p50 / p99 / max in seconds:")
    for name, a, b in SEGMENTS + CHART:
        d = sorted(max(r[b] - r[a], 0.0) for r in rows if a in r and b in r)
        if d:
            p99 = d[min(len(d) - 1, round(0.99 * (len(d) - 1)))]
            print(f"  {name:62s} {statistics.median(d):6.2f} {p99:6.2f} {d[-1]:6.2f}  (n={len(d)})")


if __name__ == "__main__":
    main()
