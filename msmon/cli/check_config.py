"""`msmon check-config FILE`: validate a training YAML's monitor_config (msmon's keys, MindFormers' or both) and
say what it monitors and how each MindFormers key was taken."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from typing import Any

from msmon.cli.common import OK, USAGE
from msmon.config.yamlio import load_yaml
from notifier.config import ConfigError, load_config
from notifier.config.mindformers import callback_entry
from notifier.config.model import Taken
from notifier.monitor import describe


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("check-config", help="validate a training YAML's monitor_config and say what it "
                              "monitors")
    p.add_argument("file", help="a training YAML with a top-level monitor_config, or a monitor_config file")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        cfg = load_config(args.file)
    except ConfigError as exc:
        print(exc, file=sys.stderr)  # the error names the file and line itself
        return USAGE
    entry = _entry(args.file)
    if not cfg.monitor_on:
        where = "its MsmonCallback entry says monitor_on: false" if entry else "monitor_config.monitor_on is false"
        print(f"{args.file}: valid, but monitoring is OFF ({where}): nothing will be monitored. Set monitor_on: "
              "true.")
        _print_mindformers(cfg.mindformers)
        return OK
    print(f"{args.file}: valid")
    run_id = entry.get("run_id") if entry else None
    for line in describe(cfg, str(run_id or cfg.bot.run_id or "(run id given in code)")):
        print(line)
    if cfg.tensorboard.enable:
        print(f"TensorBoard: {cfg.tensorboard.log_dir}/RUN_ID/device_N")
    if cfg.csv.enable:
        print(f"CSV: {cfg.csv.path}")
    if cfg.mindformers:
        print("MindFormers keys are taken as listed above (msmon's own keys win where both are set).")
    if entry:
        print("Attached by the file's callbacks entry (type: MsmonCallback): MindFormers builds it; launch "
              "run_mindformer.py with --register_path naming notifier.mindformers.REGISTER_PATH "
              "(docs/user-guide/mindformers.md).")
    else:
        print("Remember to attach it: Model.train(..., callbacks=[MonitorCallback(config, run_id=...)]) or call "
              "Monitor.step() in your loop.")
    return OK


def _entry(path: str) -> Mapping[str, Any] | None:
    """The file's MsmonCallback entry of a MindFormers callbacks list, if it has one (the file loaded already)."""
    found = callback_entry(load_yaml(path))
    return found[1] if found else None


def _print_mindformers(taken: tuple[Taken, ...]) -> None:
    """How each MindFormers key was taken, also when monitoring is off (describe() is not printed then)."""
    for t in taken:
        print(f"  MindFormers {t}")
