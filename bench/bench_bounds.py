"""What one run and one device cost the bot's memory, and what /healthz takes with many stored runs.

    .venv/bin/python bench/bench_bounds.py [--devices 2000] [--runs 100000] [--requests 300]

1. Memory: the real ingest path (bot/ingest/envelope.py: the store row, the metric ring per device, the device
   gate) takes one envelope of one sample from each of `devices` devices of one run, with the default
   bot.window_samples (600); tracemalloc counts what stays allocated. Prints bytes per device.
2. /healthz: a store of `runs` runs (inserted directly), the real bot served on loopback from it (its
   watchdog, escalator and outbox running), then `requests` sequential GET /healthz: p50, p99, max.
3. An Alertmanager webhook of `--am-alerts` alerts about one host that `--am-runs` runs run on, through
   the inbound handler's record() (what holds the loop): seconds.
4. The escalator's once-a-second pass with `--firing` firing alerts (ten rules on each of firing/10 runs),
   without any escalation policy and with one route naming one: the median of 5 passes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import tracemalloc
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bot.config import BotConfig, load_bot_config  # noqa: E402
from bot.ingest.envelope import Ingest  # noqa: E402
from bot.metrics import BotMetrics  # noqa: E402
from bot.server import BotThread  # noqa: E402
from bot.shared import BotState  # noqa: E402
from bot.store.sqlite import Store  # noqa: E402
from msmon.contract.wire import Envelope, Sample  # noqa: E402


def bytes_each(name: str, tmp: str, n: int, run_of, device_of, **limits: int) -> float:
    """Bytes that stay allocated for each of `n` envelopes of one sample, sent through a fresh bot's real ingest
    to the run and device `run_of(i)` / `device_of(i)` (the first, i = 0, is left out of the count: first-use
    allocations, caches, the store's statements)."""
    cfg = BotConfig(state_path=os.path.join(tmp, f"{name}.sqlite"), **limits)
    state = BotState(cfg, Store(cfg.state_path), BotMetrics())
    ingest = Ingest(state)
    now = time.time()

    def one(i: int) -> None:
        run, device = run_of(i), device_of(i)
        ingest.envelope(Envelope(run_id=run, device=device, sent_at=now, project="p", samples=[
            Sample(run_id=run, device=device, step=1, time=now, loss=2.0, grad_norm=1.0)]))

    one(0)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(1, n + 1):
        one(i)
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return (after - before) / n


def per_device(tmp: str, devices: int) -> float:
    """Bytes each device of one run keeps (its ring of window_samples, its place in the run's rank view)."""
    return bytes_each("mem", tmp, devices, lambda _: "run-mem", lambda d: f"rank-{d}", max_devices=devices + 1)


def per_run(tmp: str, runs: int) -> float:
    """Bytes each run of one device keeps (its row and caches, its ring, its gate), through the ingest."""
    return bytes_each("runs", tmp, runs, lambda r: f"run-{r}", lambda _: "0", max_runs=runs + 1)


def alertmanager(tmp: str, alerts: int, runs: int) -> float:
    from bot.receivers.alertmanager.inbound import AlertmanagerInboundHandler, AmAlert

    cfg = BotConfig(state_path=os.path.join(tmp, "am.sqlite"))
    state = BotState(cfg, Store(cfg.state_path), BotMetrics())
    now = time.time()
    for r in range(runs):
        state.store.touch_run(f"run-{r}", "p", {"host": "node1"}, "0", 10, now)
    handler = AlertmanagerInboundHandler(cfg, state, time.time)
    body = [AmAlert(status="firing", labels={"alertname": f"Disk{i}", "instance": "node1:9100"}) for i in range(alerts)]
    t = time.perf_counter()
    handler.record(body)
    return time.perf_counter() - t


def escalator(tmp: str, firing: int, policy: bool) -> float:
    from bot.escalation.scheduler import Escalator
    from bot.store.sqlite import AlertRow

    bot: dict[str, object] = {"state_path": os.path.join(tmp, f"esc-{policy}.sqlite")}
    if policy:
        bot["escalations"] = {"page": {"levels": [{"after": 600, "mention": ["@oncall"]}]}}
        bot["routes"] = [{"receiver": "console", "channel": "c", "project": "other", "escalation": "page"}]
    cfg = load_bot_config({"bot": bot})
    state = BotState(cfg, Store(cfg.state_path), BotMetrics())
    now = time.time()
    with state.store.tx():
        for r in range(firing // 10):
            state.store.touch_run(f"run-{r}", "p", {}, "0", 5, now)
        state.store.save_alerts([AlertRow(f"run-{i // 10}|rule{i % 10}|0", f"run-{i // 10}", f"rule{i % 10}", "0",
                                          "ERROR", "firing", 5, now) for i in range(firing)])
    esc = Escalator(state)
    times = []
    for _ in range(5):
        t = time.perf_counter()
        esc.sync()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def fill_runs(path: str, runs: int) -> None:
    store = Store(path)
    now = time.time()
    with store.tx():
        store.db.executemany(
            "INSERT INTO runs(run_id, project, labels, devices, first_seen, last_seen, last_step, last_heartbeat, "
            "last_progress, paused, gone) VALUES(?,?,?,?,?,?,?,?,?,0,0)",
            [(f"run-{i:06d}", "p", "{}", json.dumps(["0"]), now - 7200, now - 3600 + i * 1e-3, 100, now - 3600,
              now - 3600) for i in range(runs)])
    store.db.close()


def healthz(tmp: str, runs: int, requests: int) -> list[float]:
    path = os.path.join(tmp, "many.sqlite")
    fill_runs(path, runs)
    bot = BotThread(load_bot_config({"bot": {"port": 0, "state_path": path, "console": {"charts": False},
                                             "max_runs": 1000}}))
    try:
        time.sleep(3.0)  # the background passes start
        times = []
        for _ in range(requests):
            t = time.perf_counter()
            with urllib.request.urlopen(bot.url + "/healthz", timeout=120) as r:
                r.read()
            times.append((time.perf_counter() - t) * 1e3)
            time.sleep(0.01)
        return times
    finally:
        bot.stop()


def rings(runs: int) -> tuple[float, float]:
    """Bytes the health checkpoint rings keep: each of `runs` runs sends full rings (RING_DEVICES + 4 devices x
    MAX_RING checkpoints, every health 256 characters and why 512, all distinct: the worst a job token can send),
    through Windows.add_plan (what the heartbeat path calls). (bytes a run, bytes in all)."""
    from bot.store.windows import RING_DEVICES, Windows
    from msmon.contract.wire import MAX_RING, Heartbeat, RingCheckpoint

    w = Windows(600, 1000)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for r in range(runs):
        for d in range(RING_DEVICES + 4):
            ring = [RingCheckpoint(step=s, time=0.0, health=f"h{r}-{d}-{s}".ljust(256, "h"),
                                   why=f"w{r}-{d}-{s}".ljust(512, "w")) for s in range(MAX_RING)]
            w.add_plan(Heartbeat(run_id=f"run-{r}", device=str(d), time=0.0, checkpoints=ring))
            del ring
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return (after - before) / min(runs, len(w.checkpoints)), after - before


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=100_000)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--am-alerts", type=int, default=3000)
    ap.add_argument("--am-runs", type=int, default=200)
    ap.add_argument("--firing", type=int, default=20_000)
    ap.add_argument("--ring-runs", type=int, default=300, help="runs sending full checkpoint rings (kept: 256)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for policy in (False, True):
            how = "a route naming a policy" if policy else "no policy"
            ms = escalator(tmp, a.firing, policy) * 1e3
            print(f"escalator pass with {a.firing:,} firing alerts, {how}: {ms:.0f} ms (median of 5)")
        took = alertmanager(tmp, a.am_alerts, a.am_runs)
        print(f"Alertmanager webhook of {a.am_alerts:,} alerts x {a.am_runs} runs on one host: {took:.2f} s")
        print(f"memory: {per_run(tmp, 1000) / 1024:.1f} KB per run of one device (1,000 runs through the ingest)")
        each, total = rings(a.ring_runs)
        print(f"memory: health checkpoint rings, worst case (full rings, longest texts): {each / 1024:.0f} KB a run, "
              f"{total / 2**20:.0f} MB for {a.ring_runs} runs")
        b = per_device(tmp, a.devices)
        print(f"memory: {b / 1024:.1f} KB per device (window_samples 600, {a.devices} devices of one run through the "
              f"ingest); bot.max_devices 4096 bounds a run at {b * 4096 / 2**20:.0f} MB")
        t = sorted(healthz(tmp, a.runs, a.requests))
        p99 = t[min(len(t) - 1, int(len(t) * 0.99))]
        print(f"/healthz with {a.runs:,} stored runs: p50 {statistics.median(t):.1f} ms, p99 {p99:.1f} ms, "
              f"max {t[-1]:.1f} ms over {len(t)} requests")


if __name__ == "__main__":
    main()
