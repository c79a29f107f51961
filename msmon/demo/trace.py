"""The demo incident: a 13B fine-tune whose grad norm creeps up for 40 minutes before the loss blows up.

The trace is made here, deterministically, so the demo needs no data set, no GPU and no network:
loss settling toward 1.82 with realistic noise, a grad norm that starts climbing at step 2160
(10 s steps: 40 minutes before the spike), and the loss jumping to 6.47 at step 2400.
"""

from __future__ import annotations

import csv
import math
import os
import random

from notifier.outputs.csv_sink import CSV_COLUMNS

SPIKE_STEP = 2400
CREEP_START = 2160
STEP_SECONDS = 10.0
TOKENS_PER_STEP = 15_200  # 1520 tokens/s at 10 s per step


def make_trace(path: str, steps: int = 2600, seed: int = 7, run_id: str = "demo-13b") -> str:
    """Write the incident trace as an msmon CSV (one row per step) and return its path."""
    rng = random.Random(seed)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    t0 = 1_764_000_000.0
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, CSV_COLUMNS, restval="")  # by name: a column msmon adds later stays empty here
        w.writeheader()
        for step in range(steps):
            loss = 1.82 + 0.55 * math.exp(-step / 350.0) + rng.gauss(0.0, 0.03)
            grad = 0.9 * math.exp(rng.gauss(0.0, 0.08))
            if step >= CREEP_START:
                grad *= math.exp((step - CREEP_START) / 100.0)
            if step >= SPIKE_STEP:
                loss = 6.47 + rng.gauss(0.0, 0.08)
            lr = 2e-5 * min(1.0, (step + 1) / 200.0)
            dt = STEP_SECONDS * math.exp(rng.gauss(0.0, 0.01))
            t0 += dt
            w.writerow({"time": t0, "run_id": run_id, "device": "0", "step": step, "loss": round(loss, 5),
                        "learning_rate": lr, "grad_norm": round(grad, 5),
                        "tokens_per_s": round(TOKENS_PER_STEP / dt, 1), "step_time": round(dt, 4),
                        "max_step_time": round(dt, 4)})
    return path
