"""Monitor.step cost, all rules on: p50/p99 microseconds per sampled and per non-sampled step.

    .venv/bin/python bench/bench_monitor.py [--steps 200000]

Sampled steps use step_interval 1; non-sampled steps use step_interval 1000 (so nearly every call
is the fast path). The input is a healthy synthetic run, so detectors do their usual work (no alerts
and no logging on the measured path). Run twice: outputs off, then CSV + TensorBoard on (written by
the background thread, whose GIL share shows up here). Each case runs in --rounds rounds, cases
interleaved; "p50 best round" is the round least disturbed by other load on a shared machine.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import random
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from notifier import Monitor  # noqa: E402


def _inputs(n: int, seed: int = 0) -> list[dict[str, float]]:
    rng = random.Random(seed)
    out = []
    for s in range(n):
        out.append({"loss": 2.0 + 3.0 * (s + 10) ** -0.3 + rng.gauss(0, 0.03),
                    "lr": 3e-4 * min(1.0, (s + 1) / 500), "grad_norm": math.exp(rng.gauss(0, 0.1)),
                    "tokens": 4096.0})
    return out


def measure(step_interval: int, steps: int, outputs: bool) -> tuple[float, float, float]:
    tmp = tempfile.mkdtemp(prefix="msmon-bench-")
    cfg = {"monitor_config": {
        "monitor_on": True, "step_interval": step_interval, "log_interval": 0,
        "alert": {"grad_norm_threshold": 10.0, "baseline_steps": 100},
        "training": {"total_steps": 10 * steps, "warmup_steps": 500, "target_loss": 2.1},
        "csv": {"enable": outputs, "path": os.path.join(tmp, "{run_id}.csv")},
        "tensorboard": {"enable": outputs, "log_dir": os.path.join(tmp, "tb")},
    }}
    mon = Monitor(cfg, "bench")
    data = _inputs(steps)
    clock = time.perf_counter_ns
    t = time.time()
    times = []
    step = mon.step
    for i, m in enumerate(data):
        t += 0.2
        t0 = clock()
        step(i, loss=m["loss"], lr=m["lr"], grad_norm=m["grad_norm"], tokens=m["tokens"], time=t)
        times.append(clock() - t0)
    mon.close()
    times = times[steps // 10:]  # drop the warm-up (baseline period, first windows)
    if step_interval > 1:
        times = [x for i, x in enumerate(times, start=steps // 10) if i % step_interval]
    q = statistics.quantiles(times, n=100)
    return q[49] / 1000.0, q[98] / 1000.0, statistics.fmean(times) / 1000.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200_000, help="steps per case, split over the rounds")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    logging.getLogger("msmon").setLevel(logging.CRITICAL)
    logging.getLogger("msmon").addHandler(logging.NullHandler())
    cases = [(si, outputs) for outputs in (False, True) for si in (1, 1000)]
    per_round = args.steps // args.rounds
    results: dict[tuple[int, bool], list[tuple[float, float, float]]] = {c: [] for c in cases}
    for _ in range(args.rounds):
        for si, outputs in cases:
            results[(si, outputs)].append(measure(si, per_round, outputs))
    print(f"Monitor.step, all 12 rules on, {args.steps:,} steps per case in {args.rounds} rounds, "
          f"Python {sys.version.split()[0]}")
    print(f"{'case':<44} {'p50 us':>8} {'p50 best round':>15} {'p99 us':>8} {'mean us':>8}")
    for si, outputs in cases:
        rounds = results[(si, outputs)]
        label = ("sampled step" if si == 1 else "non-sampled step") + (
            ", CSV + TensorBoard on" if outputs else ", outputs off")
        p50 = statistics.median(r[0] for r in rounds)
        best = min(r[0] for r in rounds)
        p99 = statistics.median(r[1] for r in rounds)
        mean = statistics.median(r[2] for r in rounds)
        print(f"{label:<44} {p50:8.2f} {best:15.2f} {p99:8.2f} {mean:8.2f}")


if __name__ == "__main__":
    main()
