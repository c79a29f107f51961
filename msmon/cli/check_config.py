"""`msmon check-config FILE`: validate a training YAML's monitor_config and say what it monitors."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from msmon.cli.common import OK, USAGE
from notifier.config import ConfigError, load_config
from notifier.monitor import describe


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("check-config", help="validate a training YAML's monitor_config and say what it "
                              "monitors")
    p.add_argument("file")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        cfg = load_config(args.file)
    except ConfigError as exc:
        print(exc, file=sys.stderr)  # the error names the file and line itself
        return USAGE
    if not cfg.monitor_on:
        print(f"{args.file}: valid, but monitoring is OFF (monitor_config.monitor_on is false): nothing will be "
              "monitored. Set monitor_on: true.")
        return OK
    print(f"{args.file}: valid")
    for line in describe(cfg, cfg.bot.run_id or "(run id given in code)"):
        print(line)
    if cfg.tensorboard.enable:
        print(f"TensorBoard: {cfg.tensorboard.log_dir}/RUN_ID/device_N")
    if cfg.csv.enable:
        print(f"CSV: {cfg.csv.path}")
    print("Remember to attach it: Model.train(..., callbacks=[MonitorCallback(config, run_id=...)]) or call "
          "Monitor.step() in your loop.")
    return OK
