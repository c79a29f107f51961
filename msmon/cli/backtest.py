"""`msmon backtest TRACES_DIR`: replay labelled traces through one or more configs and score them."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from msmon.offline.backtest.engine import BacktestError, read_labels
from msmon.offline.backtest.report import FORMATS
from msmon.offline.backtest.sources import run_backtest
from notifier.config import ConfigError

DEFAULT_CONFIG = "config/monitor.yaml"


def cmd_backtest(args: argparse.Namespace) -> int:
    from msmon.cli.main import _quiet_logging  # the cli module imports this one lazily, so no cycle at import time

    _quiet_logging(args.verbose)
    root = Path(args.traces_dir)
    if not root.is_dir():
        print(f"msmon backtest: {root} is not a folder (TRACES_DIR holds the traces the labels name)", file=sys.stderr)
        return 2
    if args.step_interval is not None and args.step_interval < 1:
        print(f"msmon backtest: --step-interval must be at least 1, got {args.step_interval}", file=sys.stderr)
        return 2
    labels_path = args.labels or str(root / "labels.csv")
    try:
        labels = read_labels(labels_path)
        runs = run_backtest(root, labels, args.config or [DEFAULT_CONFIG], args.step_interval)
    except (BacktestError, ConfigError, OSError) as exc:
        print(f"msmon backtest: {exc}", file=sys.stderr)
        return 2
    print(FORMATS[args.format](runs))
    return 0


def register(sub: Any) -> None:
    """Add `msmon backtest` to the `msmon` command's subparsers."""
    b = sub.add_parser(
        "backtest", help="score configs on labelled traces: faults caught, lead before divergence, false alarms",
        description="Replays every trace listed in the labels through each --config (the same Monitor a live job "
        "runs) and reports per trace the first WARNING and ERROR, the lead in steps before the loss diverged, the "
        "false alarms on clean steps, and a summary. Definitions and the labels format: docs/backtest.md.")
    b.add_argument("traces_dir", metavar="TRACES_DIR", help="folder of traces; paths in the labels are relative to it")
    b.add_argument("--config", action="append", default=None, metavar="YAML",
                   help=f"monitor config; repeat to compare several side by side (default: {DEFAULT_CONFIG})")
    b.add_argument("--labels", default=None, metavar="CSV", help="labels file (default: TRACES_DIR/labels.csv)")
    b.add_argument("--format", choices=tuple(FORMATS), default="text",
                   help="text, markdown (the README tables) or json")
    b.add_argument("--step-interval", type=int, default=None, metavar="N",
                   help="sample every Nth step instead of the configs' step_interval")
    b.add_argument("-v", "--verbose", action="store_true", help="also print msmon's log lines")
    b.set_defaults(func=cmd_backtest)
