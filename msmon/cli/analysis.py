"""`msmon replay` and `msmon calibrate`: offline analysis of recorded logs with the live detectors."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from typing import Any

from msmon.core.trend import NOT_ENOUGH
from msmon.offline.readers import FORMATS, ReplayError, parse_columns, read_log
from msmon.offline.replay import Progress, Replayed, alert_json, alert_line, run_replay
from notifier.config import ConfigError

_COLUMNS_HELP = ("FIELD=NAME,...: the log's column names (CSV), keys (JSONL) or tags (TensorBoard) for step, loss, lr, "
                 "grad_norm, throughput, time, time_ms, device; unmapped fields are found by their usual names")


def _quiet(verbose: bool) -> None:
    from msmon.cli.main import _quiet_logging  # the cli module imports this one lazily, so no cycle at import time

    _quiet_logging(verbose)


def _want_progress(args: argparse.Namespace) -> bool:
    if args.progress is not None:
        return bool(args.progress)
    return sys.stderr.isatty()


def _print_trend(result: Replayed, args: argparse.Namespace, out: Any) -> None:
    summary = result.trend(args.total_steps, args.target_loss, args.trend_window)
    for line in summary.describe() if summary is not None else [NOT_ENOUGH]:
        print(line if line.startswith("trend") else f"trend: {line}", file=out)


def cmd_replay(args: argparse.Namespace) -> int:
    _quiet(args.verbose)
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        print("msmon replay: --plot needs matplotlib: pip install 'msmon[bot]' (or pip install matplotlib)",
              file=sys.stderr)
        return 2
    progress = Progress(f"replaying {args.log}") if _want_progress(args) else None
    try:
        result = run_replay(args.log, args.config, args.run_id, columns=parse_columns(args.columns), fmt=args.format_in,
                            progress=progress)
    except (ConfigError, ReplayError, OSError) as exc:
        if progress is not None and progress.drawn:
            print(file=sys.stderr)
        print(f"msmon replay: {exc}", file=sys.stderr)
        return 2
    json_mode = args.format == "json"
    for e in result.events:
        print(alert_json(e) if json_mode else alert_line(e))
    summary_out = sys.stderr if json_mode else sys.stdout  # stdout stays pure JSON lines in json mode
    if not args.no_trend:
        _print_trend(result, args, summary_out)
    if args.plot:
        from msmon.offline.plot import plot_replay

        plot_replay(result, args.plot, title=f"{args.log} through {args.config}")
        print(f"plot: {args.plot}", file=summary_out)
    print(f"{result.counts()} in {result.rows:,} rows ({result.format})", file=summary_out)
    return 0


def _add_replay(sub: Any) -> None:
    r = sub.add_parser("replay", help="run a metrics log (CSV, JSONL, TensorBoard) through the detectors; print the "
                       "alerts and the loss trend",
                       description="Replays LOG through the same Monitor a live job runs and prints every alert. "
                       "Writes no CSV/TensorBoard output and sends nothing to a bot.")
    r.add_argument("log", help="msmon CSV, any CSV, JSONL, a TensorBoard event file or a folder of them")
    r.add_argument("--config", default="config/monitor.yaml", help="monitor_config YAML (default: %(default)s)")
    r.add_argument("--run-id", default="replay")
    r.add_argument("--columns", default=None, metavar="MAPPING", help=_COLUMNS_HELP)
    r.add_argument("--input-format", dest="format_in", choices=FORMATS, default=None,
                   help="the log's format (default: from its name, else its content)")
    r.add_argument("--format", choices=("text", "json"), default="text",
                   help="json: one JSON object per alert per line on stdout, nothing else (summary on stderr)")
    r.add_argument("--plot", default=None, metavar="OUT.png", help="draw the curves with the alerts marked")
    r.add_argument("--total-steps", type=int, default=None, help="planned last step, for the loss forecast "
                   "(default: training.total_steps of the config)")
    r.add_argument("--target-loss", type=float, default=None, help="loss to reach, for the ETA "
                   "(default: training.target_loss of the config)")
    r.add_argument("--trend-window", type=int, default=None, metavar="STEPS",
                   help="steps per trend window (default: a fifth of the steps run, at least 1000)")
    r.add_argument("--no-trend", action="store_true", help="do not print the loss trend")
    r.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar on stderr (default: when stderr is a terminal)")
    r.add_argument("-v", "--verbose", action="store_true", help="also print msmon's log lines (stderr)")
    r.set_defaults(func=cmd_replay)


def cmd_calibrate(args: argparse.Namespace) -> int:
    from msmon.offline.calibrate import CalibrationError, calibrate
    from notifier.config import load_config

    _quiet(args.verbose)
    try:
        base = load_config(args.config) if args.config else None
        rows = read_log(args.baseline, parse_columns(args.columns), args.format_in)
        result = calibrate(rows, steps=args.steps, start=args.start, base=base, source=args.baseline)
    except (ConfigError, ReplayError, OSError) as exc:
        print(f"msmon calibrate: {exc}", file=sys.stderr)
        return 2
    except CalibrationError as exc:
        print(f"msmon calibrate: cannot calibrate from {exc}", file=sys.stderr)
        return 1
    text = result.to_yaml()
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text)
        print(f"wrote {args.out}:")
        for line in result.header:
            print(f"  {line}")
        print(f"Use it: msmon replay LOG --config {args.out}, or paste its alert: and training: sections into your "
              "monitor_config.")
    else:
        sys.stdout.write(text)
    if result.alerts_on_baseline:
        raised = "; ".join(result.alerts_on_baseline)
        print(f"msmon calibrate: the baseline itself raises alerts through these levels ({raised}): review them "
              "before use", file=sys.stderr)
        return 1
    return 0


def _add_calibrate(sub: Any) -> None:
    c = sub.add_parser("calibrate", help="measure a healthy baseline log and write thresholds (a monitor_config "
                       "fragment with a note on every number)",
                       description="Measures the loss's normal fluctuation, the typical grad norm and the stable "
                       "throughput over the first --steps steps of BASELINE with the live detectors' own scores, and "
                       "writes levels a margin above what the baseline reached (looser during warmup). Exit 1, with "
                       "the reason, when the baseline is too short or too noisy.")
    c.add_argument("baseline", help="a log of a healthy run (any format msmon replay reads)")
    c.add_argument("--steps", type=int, default=1000, help="baseline length in steps (default: %(default)s)")
    c.add_argument("--start", type=int, default=None, help="first step of the baseline (default: the log's first)")
    c.add_argument("--out", default=None, metavar="thresholds.yaml", help="write the fragment here (default: stdout)")
    c.add_argument("--config", default=None, help="the monitor_config the levels are for: its step_interval and "
                   "rule windows are used (default: msmon's defaults, every step sampled)")
    c.add_argument("--columns", default=None, metavar="MAPPING", help=_COLUMNS_HELP)
    c.add_argument("--input-format", dest="format_in", choices=FORMATS, default=None)
    c.add_argument("-v", "--verbose", action="store_true", help="also print msmon's log lines (stderr)")
    c.set_defaults(func=cmd_calibrate)


def register(sub: Any) -> None:
    """Add the `replay` and `calibrate` subcommands to msmon's subparsers."""
    _add_replay(sub)
    _add_calibrate(sub)
