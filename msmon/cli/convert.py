"""`msmon convert LOG -o OUT.csv`: any log msmon reads, written as msmon's CSV (which replays with no mapping)."""

from __future__ import annotations

import argparse
import csv
import itertools
import math
import os
import sys
from collections.abc import Iterable
from typing import IO, Any

from msmon.cli.common import OK, add_log_options, add_verbose, fail, quiet_logging, show_reader_notes
from msmon.offline.readers import LogReader, ReplayError, Row, parse_columns, read_log

COLUMNS = ("step", "loss", "lr", "grad_norm", "throughput", "time", "device")  # Row's fields, in this order
SCALING = ("overflow", "loss_scale")  # and these where the log has them


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "convert", help="write a metrics log (MindFormers, TensorBoard, JSONL, any CSV) as msmon's CSV",
        description="Reads LOG as `msmon replay` does (the same formats, the same detection, --columns for names msmon "
        f"does not know) and writes one row per step and device: {','.join(COLUMNS)}. Empty cells are values the "
        "log does not hold; nan and inf are kept. msmon replay, calibrate and backtest read the result with no "
        "mapping.")
    p.add_argument("log", help="any log msmon replay reads: a MindFormers worker_N.log / info.log or its output "
                   "folder, TensorBoard event files, JSONL, CSV")
    p.add_argument("-o", "--output", required=True, metavar="OUT.csv", help="the CSV to write ('-': stdout)")
    add_log_options(p)
    add_verbose(p)
    p.set_defaults(func=run)


def _cell(v: float | str | bool | None) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return str(int(v))
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else ("nan" if math.isnan(v) else ("inf" if v > 0 else "-inf"))
    return str(v)


def write_csv(rows: Iterable[Row], out: IO[str]) -> int:
    """The rows as msmon's CSV on `out`; returns how many. A log with dynamic loss scaling (its first row has an
    overflow flag or a loss scale, as MindFormers' `overflow cond` / `loss_scale`) gets those two columns too."""
    w = csv.writer(out, lineterminator="\n")
    it = iter(rows)
    first = next(it, None)
    columns = COLUMNS + SCALING if first is not None and (first.overflow is not None or first.loss_scale is not None) \
        else COLUMNS
    w.writerow(columns)
    n = 0
    for r in (it if first is None else itertools.chain((first,), it)):
        w.writerow([_cell(getattr(r, c)) for c in columns])
        n += 1
    return n


def _write_file(source: LogReader, path: str) -> int:
    """Written beside `path` and renamed at the end: a log that fails half-way leaves no half CSV."""
    tmp = f"{path}.partial"
    try:
        with open(tmp, "w", newline="", encoding="utf-8") as f:
            n = write_csv(source, f)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return n


def run(args: argparse.Namespace) -> int:
    quiet_logging(args.verbose)
    show_reader_notes("convert")
    if args.output != "-" and os.path.abspath(args.output) == os.path.abspath(args.log):
        return fail("convert", f"-o {args.output} is the log itself; name another file")
    try:
        source = read_log(args.log, parse_columns(args.columns), args.format_in)
        n = write_csv(source, sys.stdout) if args.output == "-" else _write_file(source, args.output)
    except (ReplayError, OSError) as exc:
        return fail("convert", exc)
    if args.output != "-":
        print(f"wrote {args.output}: {n:,} rows ({source.format}: {args.log})", file=sys.stderr)
    return OK
