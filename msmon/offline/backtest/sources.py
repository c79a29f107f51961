"""Reading the traces a labels file lists (any CSV `msmon.offline.readers.read_csv` reads, MindFormers'
text logs (a worker_N.log, or a run's output folder: every rank), and BLOOM's chronicle windows, one
trace per section of `bloom-chronicles/iterations.csv`) and running a backtest over them: each trace is
read once and replayed through every config."""

from __future__ import annotations

import csv
import dataclasses
import math
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from msmon.offline.backtest.engine import BacktestError, Label, Run, replay_config, run_trace
from msmon.offline.readers import ReplayError, Row, read_csv, read_log
from notifier.config import MonitorConfig


@dataclasses.dataclass(frozen=True)
class Format:
    read: Callable[[Path, str], list[Row]]  # (file, section after '#', or "") -> rows
    # A log whose lines were already sampled by the job (a few quoted lines, every 10th step...) is
    # replayed with every line a sample, whatever the config's step_interval.
    every_line_sampled: bool = False
    folders: bool = False  # a trace may be a folder (a run's per-rank logs)


@dataclasses.dataclass(frozen=True)
class Trace:
    label: Label
    rows: list[Row]
    step_interval: int | None  # forced for this trace (None: the config's)


def _no_section(path: Path, section: str, what: str) -> None:
    if section:
        raise BacktestError(f"{path}#{section}: a {what} trace has no sections; drop '#{section}' or set "
                            "the format (bloom)")


def _read_csv(path: Path, section: str) -> list[Row]:
    _no_section(path, section, "plain CSV")
    return list(read_csv(str(path)))


def _read_mindformers(path: Path, section: str) -> list[Row]:
    _no_section(path, section, "MindFormers")
    return list(read_log(str(path), fmt="mindformers"))


def _float(text: str | None) -> float | None:
    text = (text or "").strip()
    return float(text) if text else None


def _read_bloom(path: Path, section: str) -> list[Row]:
    """One section of BLOOM's iterations.csv: iteration, lm_loss (blank: not printed, i.e. NaN),
    learning_rate, grad_norm (0.000: not logged, as in tr1-13B)."""
    if not section:
        raise BacktestError(f"{path}: name the section of a bloom trace after '#', e.g. "
                            f"'{path.name}#Experiment 12'")
    rows: list[Row] = []
    with open(path, newline="", encoding="utf-8") as f:
        for line, rec in enumerate(csv.DictReader(f), start=2):
            if rec.get("section") != section:
                continue
            try:
                step = int(rec["iteration"])
                loss = _float(rec["lm_loss"])
                grad = _float(rec["grad_norm"])
                lr = _float(rec["learning_rate"])
            except (KeyError, ValueError) as exc:
                raise BacktestError(f"{path}:{line}: not a BLOOM iterations row ({exc})") from None
            if rows and step <= rows[-1].step:
                raise BacktestError(f"{path}:{line}: section {section!r} repeats or goes back to iteration {step} "
                                    "(lines from different runs?); it cannot be replayed as one trace")
            rows.append(Row(step=step, loss=math.nan if loss is None else loss,
                            grad_norm=None if grad == 0.0 else grad, lr=lr))
    if not rows:
        raise BacktestError(f"{path}: no rows in section {section!r}")
    return rows


FORMATS: dict[str, Format] = {
    "csv": Format(_read_csv),
    "bloom": Format(_read_bloom, every_line_sampled=True),
    # Printed steps are what a live callback sees (every step, or every sink), so they are sampled as live.
    "mindformers": Format(_read_mindformers, folders=True),
}


def _format(label: Label) -> Format:
    fmt = FORMATS.get(label.format)
    if fmt is None:
        raise BacktestError(f"{label.trace}: unknown format {label.format!r}; formats are {', '.join(FORMATS)}")
    return fmt


def expand(root: Path, labels: Sequence[Label]) -> list[Label]:
    """One label per trace: a glob pattern in `trace` becomes one label per matching file (sorted)."""
    out: list[Label] = []
    for label in labels:
        fmt = _format(label)
        name, _, section = label.trace.partition("#")
        if not any(c in name for c in "*?["):
            out.append(label)
            continue
        matches = sorted(p for p in root.glob(name) if p.is_file() or (fmt.folders and p.is_dir()))
        if not matches:
            raise BacktestError(f"{root}: no file matches {name!r} (a trace pattern in the labels)")
        for p in matches:
            trace = p.relative_to(root).as_posix() + (f"#{section}" if section else "")
            out.append(dataclasses.replace(label, trace=trace))
    return out


def load(root: Path, label: Label) -> Trace:
    """The rows of one labelled trace, read from `root` / its path."""
    fmt = _format(label)
    name, _, section = label.trace.partition("#")
    path = root / name
    if not (path.is_file() or (fmt.folders and path.is_dir())):
        raise BacktestError(f"{path}: no such trace file (listed in the labels as {label.trace!r}; paths are "
                            f"relative to the traces folder {root})")
    try:
        rows = fmt.read(path, section)
    except ReplayError as exc:
        raise BacktestError(str(exc)) from None
    if not rows:
        raise BacktestError(f"{path}: no training rows (loss, LR or grad norm) to replay")
    return Trace(label, rows, 1 if fmt.every_line_sampled else None)


def traces(root: Path, labels: Sequence[Label]) -> Iterator[Trace]:
    """Every labelled trace, read one at a time."""
    for label in expand(root, labels):
        yield load(root, label)


def run_backtest(root: Path, labels: Sequence[Label], configs: Sequence[str],
                 step_interval: int | None = None) -> list[Run]:
    """Replay every labelled trace under `root` through each config; one Run per config, in order.

    `step_interval` replaces the configs' own (not for logs whose every line is a sample)."""
    base = {c: replay_config(c, step_interval) for c in configs}
    forced: dict[tuple[str, int], MonitorConfig] = {}
    runs = [Run(c, base[c].step_interval, []) for c in configs]
    for trace in traces(root, labels):
        for run in runs:
            cfg = base[run.config]
            if trace.step_interval is not None:
                key = (run.config, trace.step_interval)
                if key not in forced:
                    forced[key] = replay_config(run.config, trace.step_interval)
                cfg = forced[key]
            run.results.append(run_trace(trace.label, trace.rows, cfg))
    return runs
