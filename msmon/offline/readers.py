"""Reading recorded metrics logs into `Row`s: msmon's CSV, any CSV or JSONL with a column mapping,
TensorBoard event files (a file, or a folder of them: msmon's own LOG_DIR/RUN_ID/device_N layout, or
MindFormers' tensorboard_dir/rank_N; read by events.py), and MindFormers' text logs (a file, or a folder of per-rank
logs: msrun_log/worker_N.log, log/rank_N/info.log; the lines are parsed by `msmon.offline.mindformers`).

    for row in read_log("run.csv", columns={"loss": "train_loss"}):
        monitor.step(row.step, loss=row.loss, ...)

Errors say where (file:line, or the event file and step) and what to do. NaN and Inf cells are data;
a non-number, a missing column, or a step that does not increase (per device) is an error.
"""

from __future__ import annotations

import csv
import heapq
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import IO, Any

from msmon.config.errors import closest
from msmon.offline import mindformers

from .events import _missing_ranks, _read_tensorboard
from .rows import (
    ALIASES,
    AUTO,
    FORMATS,
    KEY_SYNONYMS,
    LOCAL,
    METRICS,
    SCALING,
    ReplayError,
    Row,
    _choose,
    _Counted,
    _decoded,
    _has_metric,
    _row,
    _StepOrder,
    flag,
    log,
    parse_columns,
)

# -- text formats ---------------------------------------------------------------------------------

def _read_csv(path: str, lines: Iterable[str], columns: Mapping[str, str]) -> Iterator[Row]:
    it = iter(lines)
    first = next(it, None)
    if first is None or not first.strip():
        raise ReplayError(f"{path}:1: no header line (the file is empty or starts with a blank line); a CSV log needs "
                          "a header such as step,loss,learning_rate,grad_norm")
    delimiter = "\t" if "\t" in first and "," not in first else ","
    reader = csv.reader(_chain(first, it), delimiter=delimiter)
    header = [h.strip() for h in next(reader)]
    chosen = _choose(header, columns, f"{path}:1", "column", ALIASES)
    if "step" not in chosen:
        hint = closest("step", header)
        raise ReplayError(f"{path}:1: no step column (looked for {', '.join(ALIASES['step'])}); columns: "
                          f"{', '.join(header)}. Name it with --columns step=COLUMN"
                          + (f" (perhaps --columns step={hint})" if hint else ""))
    order = _StepOrder()
    width = len(header)
    for cells in reader:
        line = reader.line_num
        if not cells or (len(cells) == 1 and not cells[0].strip()):
            continue
        where = f"{path}:{line}"
        if len(cells) != width:
            raise ReplayError(f"{where}: {len(cells)} cells, but the header has {width} columns "
                              "(a truncated or merged line?); fix or delete that line")
        values = dict(zip(header, cells, strict=True))
        row = _row(values, chosen, where, "column")
        if not _has_metric(row):
            continue
        order.check(row.device, row.step, where, f"line {line}")
        yield row


def _chain(first: str, rest: Iterator[str]) -> Iterator[str]:
    yield first
    yield from rest


JSONL_SCAN = 1000  # objects scanned for the keys a JSONL log has, before mapping them


def _read_jsonl(path: str, lines: Iterable[str], columns: Mapping[str, str]) -> Iterator[Row]:
    objects = _json_objects(path, lines)
    head: list[tuple[int, dict[str, Any]]] = []
    keys: dict[str, None] = {}
    for item in objects:
        head.append(item)
        keys.update(dict.fromkeys(item[1]))
        if len(head) >= JSONL_SCAN:
            break
    present = list(keys)
    chosen = _choose(present, columns, f"{path}:{head[0][0] if head else 1}", "key", ALIASES)
    if "step" not in chosen:
        raise ReplayError(f"{path}: no step key in its first {len(head)} objects (looked for "
                          f"{', '.join(ALIASES['step'])}); keys: {', '.join(present)}. Name it with --columns step=KEY")
    order = _StepOrder()
    for line, obj in _chain_items(head, objects):
        where = f"{path}:{line}"
        if chosen["step"] not in obj:
            if any(name in obj for arg, name in chosen.items() if arg in METRICS):
                raise ReplayError(f"{where}: metrics but no {chosen['step']!r} key: every object needs a step")
            continue  # a metadata line ({"event": "start"}, an eval summary)
        row = _row(obj, chosen, where, "key")
        if not _has_metric(row):
            continue
        order.check(row.device, row.step, where, f"line {line}")
        yield row


def _chain_items(head: list[tuple[int, dict[str, Any]]],
                 rest: Iterator[tuple[int, dict[str, Any]]]) -> Iterator[tuple[int, dict[str, Any]]]:
    yield from head
    yield from rest


def _json_objects(path: str, lines: Iterable[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    for i, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            obj = json.loads(text.strip())  # NaN / Infinity literals are accepted: they are data
        except json.JSONDecodeError as exc:
            raise ReplayError(f"{path}:{i}: not valid JSON ({exc.msg} at column {exc.colno}); a JSONL log has one "
                              "JSON object per line") from None
        if not isinstance(obj, dict):
            raise ReplayError(f"{path}:{i}: expected a JSON object such as {{\"step\": 1, \"loss\": 2.5}}, "
                              f"got {type(obj).__name__}")
        yield i, obj


# -- MindFormers text logs -------------------------------------------------------------------------

_WORKER = re.compile(r"worker_(\d+)\.log")  # msrun's output/msrun_log/worker_N.log
_RANK_DIR = re.compile(r"rank_(\d+)")  # output/log/rank_N/
_INFO = re.compile(r"info\.log(?:\.(\d+))?")  # info.log and its rotated info.log.1 (older), ...


def _rank_of(path: str) -> str | None:
    """The rank a MindFormers log belongs to, from its name (worker_N.log, rank_N/info.log); None if it does not say."""
    m = _WORKER.fullmatch(os.path.basename(path))
    if m:
        return m.group(1)
    r = _RANK_DIR.fullmatch(os.path.basename(os.path.dirname(os.path.abspath(path))))
    return r.group(1) if r and _INFO.fullmatch(os.path.basename(path)) else None


def _rank_logs(root: str) -> dict[str | None, list[str]]:
    """Rank -> its log files, oldest first: a file is one rank; a folder holds msrun's worker_N.log files,
    else the older log/rank_N/info.log (with its rotated info.log.K). Both at once: the worker logs (not rotated)."""
    if os.path.isfile(root):
        return {_rank_of(root): [root]}
    # kind -> rank -> folder -> (age, file): info.log.K is older the larger K is
    found: dict[str, dict[str | None, dict[str, list[tuple[int, str]]]]] = {"worker": {}, "info": {}}
    for folder, _, files in sorted(os.walk(root)):
        for name in sorted(files):
            info = _INFO.fullmatch(name) if _RANK_DIR.fullmatch(os.path.basename(folder)) else None
            kind = "worker" if _WORKER.fullmatch(name) else "info" if info else None
            if kind is not None:
                path = os.path.join(folder, name)
                age = int(info.group(1) or 0) if info else 0
                found[kind].setdefault(_rank_of(path), {}).setdefault(folder, []).append((-age, path))
    for ranks in found.values():
        for rank, folders in ranks.items():
            if len(folders) > 1:
                raise ReplayError(f"{root}: rank {rank} has logs in several folders ({', '.join(folders)}): several "
                                  "runs are below this folder; replay one run's output folder")
        if ranks:
            return {rank: [p for _, p in sorted(*folders.values())]  # one folder each (checked above)
                    for rank, folders in ranks.items()}
    raise ReplayError(f"{root}: no MindFormers logs in this folder or below (looked for msrun_log/worker_N.log and "
                      "log/rank_N/info.log); give the log file itself")


def _rank_rows(rank: str | None, files: list[str], counters: list[_Counted[bytes]]) -> Iterator[Row]:
    """One rank's rows from its files in order, steps increasing; a note on each file's damaged lines."""
    order = _StepOrder()
    for path in files:
        with open(path, "rb") as f:
            counted = _Counted(f, len)
            counters.append(counted)
            report = mindformers.Report()
            for rec in mindformers.records(_decoded(counted), report):
                row = Row(rec.step, rec.loss, rec.lr, rec.grad_norm, rec.throughput, rec.time, rank,
                          rec.local_loss, rec.local_grad_norm, rec.overflow, rec.loss_scale)
                if not _has_metric(row):
                    continue
                order.check(rank, row.step, f"{path}:{rec.line}", f"{path}:{rec.line}")
                yield row
        note = report.summary(path) if report.lines else (
            f"{path}: no MindFormers training line (Epoch:[e/E], step:[s/S], loss ...) in it: the run printed no "
            "step, or this is not a training log")
        if note is not None:
            log.warning(note)


def _read_mindformers(root: str, columns: Mapping[str, str]) -> LogReader:
    """Every rank of a run, merged in step order as the files are read (each rank's steps increase)."""
    if columns:
        raise ReplayError(f"{root}: --columns does not apply to a MindFormers log: its fields are read by name "
                          "(loss, lr, global_norm, samples/s/p)")
    ranks = _rank_logs(root)
    _missing_ranks(root, ranks)
    counters: list[_Counted[bytes]] = []
    streams = [_rank_rows(rank, files, counters) for rank, files in ranks.items()]
    rows = streams[0] if len(streams) == 1 else heapq.merge(*streams, key=lambda r: (r.step, r.device or ""))
    size = sum(os.path.getsize(p) for files in ranks.values() for p in files)
    return LogReader(root, "mindformers", iter(rows), lambda: sum(c.done for c in counters), size,
                     tuple(r for r in ranks if r is not None))


# -- entry point ------------------------------------------------------------------------------------

SNIFF = 1 << 20  # bytes read in turn, up to SNIFF_MAX, for a MindFormers training line (a long preamble first)
SNIFF_MAX = 16 * SNIFF


def _is_mindformers(f: IO[bytes], head: bytes) -> bool:
    """A training line within the first SNIFF_MAX bytes (from `head`, then read on from `f`)."""
    chunk, read = head, len(head)
    while chunk:
        if mindformers.MARKER.search(chunk):
            return True
        if read >= SNIFF_MAX:
            return False
        more = f.read(SNIFF)
        chunk, read = chunk[-64:] + more if more else b"", read + len(more)
    return False


def detect_format(path: str) -> str:
    """csv, jsonl, tensorboard or mindformers, from the name, else from the content."""
    if os.path.isdir(path):
        return "mindformers" if not _has_events(path) and _has_rank_logs(path) else "tensorboard"
    if "tfevents" in os.path.basename(path):
        return "tensorboard"
    ext = os.path.splitext(path)[1].lower()
    if ext in (".jsonl", ".ndjson", ".json"):
        return "jsonl"
    if ext in (".csv", ".tsv"):
        return "csv"
    with open(path, "rb") as f:
        head = f.read(512)
        if _is_mindformers(f, head):
            return "mindformers"
    if head.lstrip().startswith(b"{"):
        return "jsonl"
    try:
        head.decode("utf-8")
    except UnicodeDecodeError:
        return "tensorboard"
    return "tensorboard" if b"\x00" in head else "csv"


def _has_events(root: str) -> bool:
    return any("tfevents" in f for _, _, files in os.walk(root) for f in files)


def _has_rank_logs(root: str) -> bool:
    """Any MindFormers log by its name below `root` (the reader then says whether they make one run)."""
    return any(_rank_of(os.path.join(folder, name)) is not None
               for folder, _, files in os.walk(root) for name in files)


@dataclass
class LogReader:
    """The rows of one log, in order; `fraction()` says how much of it has been read (progress bars)."""

    path: str
    format: str
    _rows: Iterator[Row] = field(repr=False)
    _done: Callable[[], int] = field(repr=False)
    _size: int = 0
    devices: tuple[str, ...] = ()  # the ranks (devices) a folder of per-rank logs holds, when it says

    def __iter__(self) -> Iterator[Row]:
        return self._rows

    def __next__(self) -> Row:
        return next(self._rows)

    def fraction(self) -> float:
        return min(1.0, self._done() / self._size) if self._size else 0.0


def read_log(path: str, columns: Mapping[str, str] | None = None, fmt: str | None = None) -> LogReader:
    """Rows of a metrics log, whatever its format (`fmt`: csv, jsonl, tensorboard or mindformers; None or auto:
    detected).

    `columns` maps Row fields (step, loss, lr, grad_norm, throughput, time, time_ms, device) to this
    log's column names, JSON keys or TensorBoard tags; unmapped fields are found by their usual names.
    """
    cols = dict(columns or {})
    if not os.path.exists(path):
        raise ReplayError(f"{path}: no such file or folder")
    kind = detect_format(path) if fmt in (None, AUTO) else fmt
    if kind not in FORMATS:
        raise ReplayError(f"unknown log format {kind!r}; formats: {', '.join(FORMATS)}")
    if kind == "mindformers":
        return _read_mindformers(path, cols)
    if kind == "tensorboard":
        rows = _read_tensorboard(path, cols)
        counted_rows = _Counted(rows, lambda _: 1)
        devices = tuple(dict.fromkeys(r.device for r in rows if r.device is not None))
        return LogReader(path, kind, iter(counted_rows), lambda: counted_rows.done, len(rows), devices)
    if os.path.isdir(path):
        raise ReplayError(f"{path} is a folder; a {kind} log is one file")
    f = open(path, "rb")  # noqa: SIM115 - closed when the rows are exhausted (or the reader collected)
    counted = _Counted(f, len)
    read = _read_csv if kind == "csv" else _read_jsonl
    return LogReader(path, kind, _closing(f, read(path, _decoded(counted), cols)), lambda: counted.done,
                     os.fstat(f.fileno()).st_size)


def _closing(f: IO[bytes], rows: Iterator[Row]) -> Iterator[Row]:
    with f:
        yield from rows


def read_csv(path: str, columns: Mapping[str, str] | None = None) -> Iterator[Row]:
    """Rows of a CSV metrics log (msmon's own, or any with `columns` naming its columns)."""
    return read_log(path, columns, "csv")


__all__ = ["ALIASES", "AUTO", "FORMATS", "KEY_SYNONYMS", "LOCAL", "METRICS", "SCALING", "LogReader", "ReplayError",
           "Row", "detect_format", "flag", "log", "parse_columns", "read_csv", "read_log"]
