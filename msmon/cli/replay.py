"""`msmon replay LOG`: run a recorded metrics log through the live detectors; print the alerts and the trend."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from typing import Any, TextIO

from msmon.cli.common import (
    DEFAULT_CONFIG_HELP,
    OK,
    add_log_options,
    add_verbose,
    default_monitor_config,
    fail,
    quiet_logging,
    show_reader_notes,
)
from msmon.core.trend import NOT_ENOUGH
from msmon.offline.readers import ReplayError, parse_columns
from msmon.offline.replay import Progress, Replayed, alert_json, alert_line, run_replay
from notifier.config import ConfigError


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("replay", help="run a metrics log (CSV, JSONL, TensorBoard, MindFormers) through the "
                              "detectors; print the alerts and the loss trend",
                              description="Replays LOG through the same Monitor a live job runs and prints every "
                              "alert. Writes no CSV/TensorBoard output and sends nothing to a bot.")
    p.add_argument("log", help="msmon CSV, any CSV, JSONL, a TensorBoard event file or a folder of them, a MindFormers "
                   "log (worker_N.log, info.log) or its output folder (every rank)")
    p.add_argument("--config", default=None, help=DEFAULT_CONFIG_HELP)
    p.add_argument("--run-id", default="replay", help="the run id the alerts carry (default: %(default)s)")
    add_log_options(p)
    p.add_argument("--format", choices=("text", "json"), default="text",
                   help="json: one JSON object per alert per line on stdout, nothing else (summary on stderr)")
    p.add_argument("--plot", default=None, metavar="OUT.png", help="draw the curves with the alerts marked")
    p.add_argument("--total-steps", type=int, default=None, help="planned last step, for the loss forecast "
                   "(default: training.total_steps of the config)")
    p.add_argument("--target-loss", type=float, default=None, help="loss to reach, for the ETA "
                   "(default: training.target_loss of the config)")
    p.add_argument("--trend-window", type=int, default=None, metavar="STEPS",
                   help="steps per trend window (default: a fifth of the steps run, at least 1000)")
    p.add_argument("--no-trend", action="store_true", help="do not print the loss trend")
    p.add_argument("--levels", default=None, metavar="JSONL", help="live threshold changes to apply at their steps "
                   "(default: LOG's own, RUN.levels.jsonl beside RUN.csv, when the job wrote one)")
    p.add_argument("--no-levels", action="store_true", help="replay at the config's levels only, even when the "
                   "job's level changes lie beside LOG")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar on stderr (default: when stderr is a terminal)")
    add_verbose(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    quiet_logging(args.verbose)
    show_reader_notes("replay")
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        return fail("replay", "--plot needs matplotlib: pip install 'msmon[bot]' (or pip install matplotlib)")
    progress = Progress(f"replaying {args.log}") if _want_progress(args) else None
    try:
        config = args.config or default_monitor_config()
        result = run_replay(args.log, config, args.run_id, columns=parse_columns(args.columns), fmt=args.format_in,
                            progress=progress, levels=args.levels, find=not args.no_levels)
    except (ConfigError, ReplayError, OSError) as exc:
        if progress is not None and progress.drawn:
            print(file=sys.stderr)  # end the bar's line first
        return fail("replay", exc)
    json_mode = args.format == "json"
    for note in missing_metrics(result):
        print(f"msmon replay: note: {note}", file=sys.stderr)
    for e in result.events:
        print(alert_json(e) if json_mode else alert_line(e))
    summary_out = sys.stderr if json_mode else sys.stdout  # stdout stays pure JSON lines in json mode
    if result.levels_file is not None:
        print(f"levels: {len(result.levels)} live threshold change(s) from {result.levels_file} applied at their "
              "steps (--no-levels: the config's levels only)", file=summary_out)
    if not args.no_trend:
        _print_trend(result, args, summary_out)
    if args.plot:
        from msmon.offline.plot import plot_replay  # matplotlib: only for --plot

        plot_replay(result, args.plot, title=f"{args.log} through {args.config or 'the default config'}")
        print(f"plot: {args.plot}", file=summary_out)
    print(f"{result.counts()} in {result.rows:,} rows ({result.format})", file=summary_out)
    return OK


# monitor_config.metrics name -> (the Curves field, the --columns field that maps it)
_METRIC_FIELDS = {"loss": ("loss", "loss"), "learning_rate": ("lr", "lr"), "grad_norm": ("grad_norm", "grad_norm"),
                  "throughput": ("throughput", "throughput")}


def missing_metrics(result: Replayed) -> list[str]:
    """One line per metric the config watches that no row of the log carried: its rules never ran."""
    if not result.rows:
        return []
    notes = []
    for metric in result.monitor.config.metrics:
        attr, column = _METRIC_FIELDS[metric]
        if all(v is None for c in result.curves.values() for v in getattr(c, attr)):
            notes.append(f"{metric} is in the config's metrics but not in this log ({result.rows:,} rows read), so "
                         f"the rules on it did not run; if the log names it otherwise, map it with --columns "
                         f"{column}=NAME, or drop it from monitor_config.metrics")
    return notes


def _want_progress(args: argparse.Namespace) -> bool:
    if args.progress is not None:
        return bool(args.progress)
    return sys.stderr.isatty()


def _print_trend(result: Replayed, args: argparse.Namespace, out: TextIO) -> None:
    summary, robust = result.trend(args.total_steps, args.target_loss, args.trend_window)
    for line in summary.describe() if summary is not None else [NOT_ENOUGH]:
        print(line if line.startswith("trend") else f"trend: {line}", file=out)
    if robust is not None and robust.set_aside:
        print(f"trend: robust fit: {robust.set_aside} of {robust.blocks} blocks of steps were spikes off a Theil-Sen "
              "line through the block medians and were put on it, so they do not tilt the trend", file=out)
