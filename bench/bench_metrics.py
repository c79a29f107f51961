"""What the per-run gauges cost a Prometheus scrape of /metrics, measured in one run.

    .venv/bin/python bench/bench_metrics.py [--runs 1000] [--devices 8] [--rounds 20]

The bot's state (metric windows, SQLite store) is filled with `runs` x `devices` devices, one firing
alert per run and a finished command per run; then the registry is rendered (prometheus_client's
generate_latest, what GET /metrics returns) with the run collector and, in the same rounds, without
it (the counters only); and the part of a scrape that holds the bot's event loop (collecting the
families: BotMetrics.render writes the text in a worker thread). Prints each median, the ratios, the
series and bytes per scrape.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from prometheus_client import generate_latest  # noqa: E402

from bot.config import BotConfig  # noqa: E402
from bot.metrics import BotMetrics  # noqa: E402
from bot.shared import BotState  # noqa: E402
from bot.store.sqlite import AlertRow, Store  # noqa: E402
from msmon.contract.wire import Sample  # noqa: E402


def fill(state: BotState, runs: int, devices: int) -> None:
    now = time.time()
    rows = []
    for r in range(runs):
        run_id = f"run-{r:05d}"
        for d in range(devices):
            state.windows.add(Sample(run_id=run_id, device=str(d), step=100, time=now, loss=2.0, grad_norm=1.0,
                                     samples_per_s=64.0, tokens_per_s=4096.0))
        rows.append(AlertRow(f"{run_id}|grad_norm|0", run_id, "grad_norm", "0", "ERROR", "firing", 100, now))
    with state.store.tx():
        state.store.save_alerts(rows)
        state.store.db.executemany(
            "INSERT INTO commands(id, created_at, run_id, status, updated_at) VALUES(?, ?, ?, 'done', ?)",
            [(f"c{r}", now - 0.3, f"run-{r:05d}", now) for r in range(runs)])


def median_ms(fn: object, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=20)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = BotConfig(state_path=os.path.join(tmp, "bot.sqlite"), max_runs=a.runs, window_samples=10)
        bare = BotMetrics()
        watched = BotMetrics()
        state = BotState(cfg, Store(cfg.state_path), watched)
        watched.watch(state)
        fill(state, a.runs, a.devices)
        text = generate_latest(watched.registry)
        with_runs, counters, on_loop = [], [], []
        for _ in range(5):  # interleaved, so all see the same machine load
            with_runs.append(median_ms(lambda: generate_latest(watched.registry), a.rounds))
            counters.append(median_ms(lambda: generate_latest(bare.registry), a.rounds))
            on_loop.append(median_ms(lambda: list(watched.registry.collect()), a.rounds))
        series = sum(1 for line in text.splitlines() if not line.startswith(b"#"))
        full, base = statistics.median(with_runs), statistics.median(counters)
        print(f"/metrics with {a.runs} runs x {a.devices} devices: {series} series, {len(text) / 1e6:.2f} MB, "
              f"median {full:.1f} ms per scrape")
        held = statistics.median(on_loop)
        print(f"counters only: median {base:.2f} ms; ratio {full / base:.0f}x; "
              f"{full * 1e3 / series:.2f} us per series")
        print(f"held on the event loop (collecting): median {held:.1f} ms = {held / full:.2f} of a scrape; "
              "the text is written in a worker thread")


if __name__ == "__main__":
    main()
