"""`msmon backtest TRACES_DIR`: replay labelled traces through one or more configs and score them."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from msmon.cli.common import OK, add_verbose, default_monitor_config, fail, quiet_logging
from msmon.offline.backtest.engine import BacktestError, read_labels
from msmon.offline.backtest.report import FORMATS
from msmon.offline.backtest.sources import run_backtest
from notifier.config import ConfigError


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "backtest", help="score configs on labelled traces: faults caught, lead before divergence, false alarms",
        description="Replays every trace listed in the labels through each --config (the same Monitor a live job "
        "runs) and reports per trace the first WARNING and ERROR, the lead in steps before the loss diverged, the "
        "false alarms on clean steps, and a summary. Definitions and the labels format: docs/backtest.md.")
    p.add_argument("traces_dir", metavar="TRACES_DIR", help="folder of traces; paths in the labels are relative to it")
    p.add_argument("--config", action="append", default=None, metavar="YAML",
                   help="monitor config; repeat to compare several side by side (default: the one shipped with msmon, "
                   "a copy of config/monitor.yaml)")
    p.add_argument("--labels", default=None, metavar="CSV", help="labels file (default: TRACES_DIR/labels.csv)")
    p.add_argument("--format", choices=tuple(FORMATS), default="text",
                   help="text, markdown (the README tables) or json")
    p.add_argument("--step-interval", type=int, default=None, metavar="N",
                   help="sample every Nth step instead of the configs' step_interval")
    add_verbose(p, "also print msmon's log lines")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    quiet_logging(args.verbose)
    root = Path(args.traces_dir)
    if not root.is_dir():
        return fail("backtest", f"{root} is not a folder (TRACES_DIR holds the traces the labels name)")
    if args.step_interval is not None and args.step_interval < 1:
        return fail("backtest", f"--step-interval must be at least 1, got {args.step_interval}")
    try:
        labels = read_labels(args.labels or str(root / "labels.csv"))
        runs = run_backtest(root, labels, args.config or [default_monitor_config()], args.step_interval)
    except (BacktestError, ConfigError, OSError) as exc:
        return fail("backtest", exc)
    print(FORMATS[args.format](runs))
    return OK
