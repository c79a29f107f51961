"""Figures for `msmon replay` / `msmon calibrate` (README "Offline analysis").

    .venv/bin/python bench/bench_analysis.py            # speed on a 100k-step synthetic run, every format
    .venv/bin/python bench/bench_analysis.py --traces   # + calibrated vs default levels on the real traces

Speed: rows per second through `run_replay` (reading + the full Monitor) for msmon CSV, JSONL and
msmon's own TensorBoard output, and the time `calibrate` takes on a 1000-step baseline.
Traces: each of the 73 modded-nanogpt runs calibrated on its own first 1000 steps, then replayed
whole through those levels; false alarms per 10k steps against config/monitor.yaml's defaults (at
every step), and how many injected incidents each catches (per run: a loss rise of 4 sigma for 20
steps, and a 20% throughput drop for 300 steps).
"""

from __future__ import annotations

import argparse
import csv
import logging
import os
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from msmon.contract.wire import Status  # noqa: E402
from msmon.offline.calibrate import CalibrationError, calibrate  # noqa: E402
from msmon.offline.readers import Row, read_log  # noqa: E402
from msmon.offline.replay import replay, replay_monitor, run_replay  # noqa: E402
from notifier import Monitor  # noqa: E402
from tests.fakes import analysis_data as data  # noqa: E402

TRACES = ROOT.parent / "shared" / "data" / "real-traces"


def speed(steps: int) -> None:
    records = data.run(steps, seed=5)
    cfg = {"monitor_config": {"monitor_on": True, "log_interval": 0}}
    with tempfile.TemporaryDirectory() as tmp:
        paths = {"csv": data.write_csv(Path(tmp) / "run.csv", records),
                 "jsonl": data.write_jsonl(Path(tmp) / "run.jsonl", records)}
        tb = {"monitor_config": {"monitor_on": True, "log_interval": 0,
                                 "tensorboard": {"enable": True, "log_dir": os.path.join(tmp, "tb")}}}
        mon = Monitor(tb, "bench", clock=lambda: 0.0)
        for i, r in enumerate(records):
            if i % 5000 == 0:
                mon.flush()  # the live writer drops samples when its queue is full; a benchmark wants them all
            mon.step(r["step"], loss=r["loss"], lr=r["learning_rate"], grad_norm=r["grad_norm"],
                     throughput=r["tokens_per_s"], time=r["time"])
        mon.close()
        paths["tensorboard"] = os.path.join(tmp, "tb")
        for fmt, path in paths.items():
            t0 = time.perf_counter()
            n = sum(1 for _ in read_log(path))
            read_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            result = run_replay(path, cfg)
            total = time.perf_counter() - t0
            print(f"{fmt:<12} {n:,} rows: read {n / read_s:,.0f} rows/s; read + replay {result.rows / total:,.0f} "
                  f"rows/s ({total:.2f} s)")
        rows = list(read_log(paths["csv"]))
        t0 = time.perf_counter()
        calibrate(rows, steps=1000)
        print(f"calibrate    1,000-step baseline (incl. its check replay): {time.perf_counter() - t0:.2f} s")


def firing(events: list) -> list[tuple[int, str]]:  # type: ignore[type-arg]
    return [(e.step, e.rule) for e in events if e.status is Status.FIRING and not e.repeat]


def traces() -> None:
    defaults = yaml.safe_load((ROOT / "config" / "monitor.yaml").read_text())
    defaults["monitor_config"]["step_interval"] = 1
    defaults["monitor_config"]["tensorboard"]["enable"] = False
    with open(TRACES / "modded-nanogpt" / "index.csv", newline="") as f:
        runs = [r["run"] for r in csv.DictReader(f)]
    rng = random.Random(0)
    steps = refused = injected = with_throughput = 0
    false_alarms = {"default": 0, "calibrated": 0}
    caught = {(name, kind): 0 for name in ("default", "calibrated") for kind in ("loss", "throughput")}
    for run in runs:
        rows = list(read_log(str(TRACES / "modded-nanogpt" / "runs" / f"{run}.csv")))
        try:
            cal = yaml.safe_load(calibrate(rows, steps=1000).to_yaml())
        except CalibrationError:
            refused += 1
            continue
        steps += len(rows)
        injected += 1
        with_throughput += "throughput_drop" in cal["monitor_config"]["alert"]["rules"]
        configs = {"default": defaults, "calibrated": cal}
        for name, cfg in configs.items():
            false_alarms[name] += len(firing(replay(rows, replay_monitor(cfg, run))))
        at = rng.randrange(1500, max(1501, len(rows) - 400))
        for kind, (rule, bad) in {"loss": ("loss_spike", _loss_rise(rows, at)),
                                  "throughput": ("throughput_drop", _slowdown(rows, at))}.items():
            for name, cfg in configs.items():
                got = firing(replay(bad, replay_monitor(cfg, run)))
                caught[(name, kind)] += any(r == rule and at <= step < at + 400 for step, r in got)
    print(f"modded-nanogpt: {len(runs)} runs, {refused} refused by calibrate, {steps:,} steps replayed; one injected "
          f"incident of each kind per run after step 1500; throughput_drop calibrated in {with_throughput} runs (the "
          "others' 1000 steps hold too few 10 s spans: defaults kept)")
    for name in ("default", "calibrated"):
        print(f"  {name:<10} false alarms {false_alarms[name]} ({false_alarms[name] / steps * 1e4:.3f} per 10k steps); "
              f"loss +4 sigma x 20 steps caught {caught[(name, 'loss')]}/{injected}; "
              f"throughput -20% x 300 steps caught {caught[(name, 'throughput')]}/{injected}")


def _loss_rise(rows: list[Row], at: int) -> list[Row]:
    """The loss 4x its normal fluctuation (IQR / 1.349 over steps 1000-1500) higher for 20 steps."""
    losses = sorted(r.loss for r in rows[1000:1500] if r.loss is not None)
    rise = 4 * (losses[3 * len(losses) // 4] - losses[len(losses) // 4]) / 1.349
    return [Row(r.step, r.loss + rise if r.loss is not None and at <= r.step < at + 20 else r.loss,
                r.lr, r.grad_norm, r.throughput, r.time) for r in rows]


def _slowdown(rows: list[Row], at: int) -> list[Row]:
    """Each step from `at` for 300 steps takes 1.25x as long (20% less throughput); later times shift."""
    out: list[Row] = []
    extra = 0.0
    prev: float | None = None
    for r in rows:
        if r.time is not None and prev is not None and at <= r.step < at + 300:
            extra += 0.25 * (r.time - prev)
        if r.time is not None:
            prev = r.time
        out.append(Row(r.step, r.loss, r.lr, r.grad_norm, r.throughput, None if r.time is None else r.time + extra))
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=100_000)
    p.add_argument("--traces", action="store_true")
    args = p.parse_args()
    log = logging.getLogger("msmon")
    log.addHandler(logging.NullHandler())
    log.propagate = False
    log.setLevel(logging.CRITICAL)
    speed(args.steps)
    if args.traces:
        traces()


if __name__ == "__main__":
    main()
