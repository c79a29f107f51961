"""Reading MindFormers text logs against msmon's CSV of the same steps, in one run (README "Offline analysis").

    .venv/bin/python bench/bench_mindformers.py [--steps 100000]

The same synthetic run (tests/fakes/analysis_data.py) is written as msmon's CSV and as a MindFormers
msrun worker log (MFLossMonitor's current lines with their progress lines, tests/fakes/mindformers_logs.py);
each is read alone and read + replayed through the full Monitor. Ratios are MindFormers / CSV.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

ROOT = Path(__file__).resolve().parents[1]
T = TypeVar("T")
sys.path.insert(0, str(ROOT))

from msmon.offline.readers import read_log  # noqa: E402
from msmon.offline.replay import run_replay  # noqa: E402
from tests.fakes import analysis_data as data  # noqa: E402
from tests.fakes import mindformers_logs as mfl  # noqa: E402


def timed(fn: Callable[[], T]) -> tuple[T, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def rates(path: str) -> tuple[float, float]:
    """(rows/s read alone, rows/s read + replayed)."""
    cfg = {"monitor_config": {"monitor_on": True, "log_interval": 0}}
    n, read_s = timed(lambda: sum(1 for _ in read_log(path)))
    result, replay_s = timed(lambda: run_replay(path, cfg))
    assert result.rows == n
    return n / read_s, n / replay_s


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=100_000)
    args = p.parse_args()
    logging.getLogger("msmon").setLevel(logging.CRITICAL)  # the Monitor's start-up summary, once per replay
    records = data.run(args.steps, seed=5)
    with tempfile.TemporaryDirectory() as tmp:
        csv_path = data.write_csv(Path(tmp) / "run.csv", records)
        lines = mfl.current_lines(mfl.steps_from(records), steps_per_epoch=args.steps, epochs=1, between=mfl.NOISE)
        log = mfl.write(Path(tmp) / "msrun_log" / "worker_0.log", lines)
        got = {name: rates(path) for name, path in (("csv", csv_path), ("mindformers", log))}
    for name, (read, replay) in got.items():
        print(f"{name:12} {args.steps:,} rows: read {read:,.0f} rows/s; read + replay {replay:,.0f} rows/s")
    (cr, cp), (mr, mp) = got["csv"], got["mindformers"]
    print(f"mindformers / csv: read {mr / cr:.2f}x, read + replay {mp / cp:.2f}x")


if __name__ == "__main__":
    main()
