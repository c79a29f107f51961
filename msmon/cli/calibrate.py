"""`msmon calibrate BASELINE`: measure a healthy run's log and write thresholds, a note on every number."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from msmon.cli.common import FAILED, OK, add_log_options, add_verbose, fail, quiet_logging, show_reader_notes
from msmon.offline.calibrate import Calibration, CalibrationError, calibrate
from msmon.offline.readers import ReplayError, parse_columns, read_log
from notifier.config import ConfigError, load_config


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("calibrate", help="measure a healthy baseline log and write thresholds (a "
                              "monitor_config fragment with a note on every number)",
                              description="Measures the loss's normal fluctuation, the typical grad norm and the "
                              "stable throughput over the first --steps steps of BASELINE with the live detectors' "
                              "own scores, and writes levels a margin above what the baseline reached (looser during "
                              "warmup). Exit 1, with the reason, when the baseline is too short or too noisy.")
    p.add_argument("baseline", help="a log of a healthy run (any format msmon replay reads)")
    p.add_argument("--steps", type=int, default=1000, help="baseline length in steps (default: %(default)s)")
    p.add_argument("--start", type=int, default=None, help="first step of the baseline (default: the log's first)")
    p.add_argument("--out", default=None, metavar="thresholds.yaml", help="write the fragment here (default: stdout)")
    p.add_argument("--config", default=None, help="the monitor_config the levels are for: its step_interval and "
                   "rule windows are used (default: msmon's defaults, every step sampled)")
    add_log_options(p)
    add_verbose(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    quiet_logging(args.verbose)
    show_reader_notes("calibrate")
    try:
        base = load_config(args.config) if args.config else None
        rows = read_log(args.baseline, parse_columns(args.columns), args.format_in)
        result = calibrate(rows, steps=args.steps, start=args.start, base=base, source=args.baseline)
    except (ConfigError, ReplayError, OSError) as exc:
        return fail("calibrate", exc)
    except CalibrationError as exc:
        return fail("calibrate", f"cannot calibrate from {exc}", FAILED)
    _write(result, args.out)
    if result.alerts_on_baseline:
        raised = "; ".join(result.alerts_on_baseline)
        return fail("calibrate", f"the baseline itself raises alerts through these levels ({raised}): review them "
                    "before use", FAILED)
    return OK


def _write(result: Calibration, out: str | None) -> None:
    """The fragment to `out` with a summary on stdout, or the fragment alone on stdout."""
    text = result.to_yaml()
    if not out:
        sys.stdout.write(text)
        return
    with open(out, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {out}:")
    for line in result.header:
        print(f"  {line}")
    print(f"Use it: msmon replay LOG --config {out}, or paste its alert: and training: sections into your "
          "monitor_config.")
