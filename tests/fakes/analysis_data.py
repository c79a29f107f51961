"""A synthetic but realistic training run for the replay / calibrate tests, and writers for each log format.

LR warmup over the first 200 steps, a loss settling from 2.4 toward 1.85 with 1.5% noise, a grad
norm around 0.9 (lognormal), throughput around 1500 tokens/s at 10 s per step; optional incidents.
"""

from __future__ import annotations

import csv
import json
import math
import random
from collections.abc import Iterable
from pathlib import Path
from typing import Any

WARMUP = 200


def run(steps: int = 1500, seed: int = 3, *, loss_jump: tuple[int, int, float] | None = None,
        grad_jump: tuple[int, int, float] | None = None, noise: float = 0.03) -> list[dict[str, Any]]:
    """One dict per step. `loss_jump=(start, length, added)`, `grad_jump=(start, length, factor)`."""
    rng = random.Random(seed)
    t = 1_700_000_000.0
    out = []
    for step in range(steps):
        loss = 1.85 + 0.55 * math.exp(-step / 300.0) + rng.gauss(0.0, noise)
        grad = 0.9 * math.exp(rng.gauss(0.0, 0.08))
        if loss_jump and loss_jump[0] <= step < loss_jump[0] + loss_jump[1]:
            loss += loss_jump[2]
        if grad_jump and grad_jump[0] <= step < grad_jump[0] + grad_jump[1]:
            grad *= grad_jump[2]
        dt = 10.0 * math.exp(rng.gauss(0.0, 0.01))
        t += dt
        out.append({"step": step, "loss": round(loss, 5), "learning_rate": 3e-4 * min(1.0, (step + 1) / WARMUP),
                    "grad_norm": round(grad, 5), "tokens_per_s": round(15_000 / dt, 1), "time": round(t, 3)})
    return out


def write_csv(path: Path, rows: Iterable[dict[str, Any]], rename: dict[str, str] | None = None) -> str:
    rows = list(rows)
    rename = rename or {}
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow([rename.get(k, k) for k in rows[0]])
        for r in rows:
            w.writerow(list(r.values()))
    return str(path)


def write_jsonl(path: Path, rows: Iterable[dict[str, Any]], rename: dict[str, str] | None = None) -> str:
    rename = rename or {}
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps({rename.get(k, k): v for k, v in r.items()}) + "\n")
    return str(path)


def monitor_yaml(path: Path, extra: str = "") -> str:
    """A monitor_config with every step sampled, no output files, the levels at their defaults."""
    path.write_text("monitor_config:\n  monitor_on: true\n  log_interval: 0\n  alert:\n    grad_norm_threshold: 10.0\n"
                    + extra)
    return str(path)
