"""Reading recorded metrics logs into `Row`s: msmon's CSV, any CSV or JSONL with a column mapping,
TensorBoard event files (a file, or a folder of them: msmon's own LOG_DIR/RUN_ID/device_N layout, or
MindFormers' tensorboard_dir/rank_N), and MindFormers' text logs (a file, or a folder of per-rank logs:
msrun_log/worker_N.log, log/rank_N/info.log; the lines are parsed by `msmon.offline.mindformers`).

    for row in read_log("run.csv", columns={"loss": "train_loss"}):
        monitor.step(row.step, loss=row.loss, ...)

Errors say where (file:line, or the event file and step) and what to do. NaN and Inf cells are data;
a non-number, a missing column, or a step that does not increase (per device) is an error.
"""

from __future__ import annotations

import csv
import heapq
import json
import logging
import math
import os
import re
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import IO, Any, Generic, TypeVar

from msmon.config.errors import closest
from msmon.offline import mindformers
from notifier.outputs.tensorboard_sink import TAGS

_TB = dict(TAGS)  # msmon's own TensorBoard tags, so its event files replay with no mapping
# Row field -> names tried in order (msmon's own CSV and TensorBoard names first, then common ones).
ALIASES: dict[str, tuple[str, ...]] = {
    "step": ("step", "iteration", "iter", "global_step"),
    "loss": ("loss", _TB["loss"], "train_loss", "lm_loss", "lm loss", "loss/train"),
    "lr": ("learning_rate", "lr", _TB["learning_rate"], "train/lr", "learning-rate"),
    "grad_norm": ("grad_norm", _TB["grad_norm"], "global_norm", "grad-norm", "gradient_norm", "norm"),
    # MindFormers: "throughput" (samples/s per device) when timers are logged, else its model-flops rate
    "throughput": ("tokens_per_s", _TB["tokens_per_s"], "throughput", "tokens_per_sec",
                   "model-flops-throughput-per-npu"),  # = FLOPS_TAG
    "time": ("time", "timestamp"),
    "time_ms": ("train_time_ms_cumulative",),
    "device": ("device", "rank"),
    # a data-parallel rank's own values (msmon's local_grad_norm; MindFormers' TrainingStateMonitor tags)
    "local_loss": ("local_loss", "device_accum_local_lm_loss", "device_accum_local_loss"),
    "local_grad_norm": ("local_grad_norm", _TB["local_grad_norm"], "device_local_norm"),
    # fp16 dynamic loss scaling: the step was skipped (MindFormers' "overflow cond"), and the scale
    "overflow": ("overflow", _TB["overflow"], "overflow_cond", "overflow cond", "is_overflow"),
    "loss_scale": ("loss_scale", _TB["loss_scale"], "scaling_sens", "loss-scale"),
}
METRICS = ("loss", "lr", "grad_norm", "throughput")
LOCAL = ("local_loss", "local_grad_norm")  # read where present; never the only metric a log must have
SCALING = ("overflow", "loss_scale")  # read where present, like LOCAL
# Spellings accepted on the left of --columns, for the Row field they mean.
KEY_SYNONYMS = {"learning_rate": "lr", "tokens_per_s": "throughput", "iteration": "step"}
FORMATS = ("csv", "jsonl", "tensorboard", "mindformers")
AUTO = "auto"  # the format from the name, else the content (`detect_format`)
T = TypeVar("T")
log = logging.getLogger(__name__)  # notes on what a log held (damaged lines): msmon's commands print them


class ReplayError(ValueError):
    """A log that cannot be read as it is; the message names the place and the fix."""


@dataclass
class Row:
    step: int
    loss: float | None = None
    lr: float | None = None
    grad_norm: float | None = None
    throughput: float | None = None
    time: float | None = None
    device: str | None = None
    local_loss: float | None = None  # the rank's own loss (data parallel), where the log has it
    local_grad_norm: float | None = None  # the rank's own grad norm before the all-reduce
    overflow: bool | None = None  # dynamic loss scaling: the step overflowed and was skipped
    loss_scale: float | None = None  # the loss scale the step ran with


def parse_columns(spec: str | None) -> dict[str, str]:
    """`step=iter,loss=train_loss` -> {"step": "iter", "loss": "train_loss"} (Row field -> name in the log)."""
    if not spec:
        return {}
    out: dict[str, str] = {}
    for item in spec.split(","):
        key, sep, name = item.partition("=")
        key, name = key.strip(), name.strip()
        if not sep or not key or not name:
            raise ReplayError(f"--columns: {item!r} is not FIELD=NAME (e.g. --columns step=iter,loss=train_loss)")
        key = KEY_SYNONYMS.get(key, key)
        if key not in ALIASES:
            hint = closest(key, ALIASES)
            raise ReplayError(f"--columns: unknown field {key!r}" + (f"; did you mean {hint}?" if hint else "")
                              + f" (fields: {', '.join(ALIASES)})")
        out[key] = name
    return out


def _choose(present: list[str], columns: Mapping[str, str], where: str, what: str,
            fields: Iterable[str]) -> dict[str, str]:
    """Row field -> name in the log: the mapping given, else the first alias present (exact, then any case)."""
    lowered = {p.lower(): p for p in present}
    chosen: dict[str, str] = {}
    for arg in fields:
        if arg in columns:
            name = columns[arg]
            if name not in present:
                hint = closest(name, present)
                raise ReplayError(f"{where}: --columns {arg}={name}: there is no {what} {name!r}"
                                  + (f"; did you mean {hint!r}?" if hint else "")
                                  + f" ({what}s present: {', '.join(present) or 'none'})")
            chosen[arg] = name
            continue
        for alias in ALIASES[arg]:
            found = alias if alias in present else lowered.get(alias.lower())
            if found is not None:
                chosen[arg] = found
                break
    if not any(m in chosen for m in METRICS):
        looked = "; ".join(f"{m}: {', '.join(ALIASES[m])}" for m in METRICS)
        raise ReplayError(f"{where}: no metric {what} found (looked for {looked}); {what}s present: "
                          f"{', '.join(present) or 'none'}. Map yours with --columns loss=NAME,grad_norm=NAME")
    return chosen


def _number(value: object, where: str, col: str, what: str = "column") -> float | None:
    """A cell or JSON value as a float; empty/null is None; "nan" and "inf" are data."""
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip()
        if not text:
            return None
        try:
            return float(text)
        except ValueError:
            pass
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    shown = value.strip() if isinstance(value, str) else value
    raise ReplayError(f"{where}: {what} {col!r} holds {shown!r}, which is not a number; fix or delete that line "
                      "(empty cells, nan and inf are fine)")


_TRUE, _FALSE = ("1", "true", "yes", "1.0"), ("0", "false", "no", "0.0")


def flag(value: object, where: str, col: str, what: str = "column") -> bool | None:
    """A yes/no cell (the overflow flag): True/False, 1/0, empty or null is None."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return bool(value)
    text = str(value).strip().lower()
    if not text:
        return None
    if text in _TRUE or text in _FALSE:
        return text in _TRUE
    raise ReplayError(f"{where}: {what} {col!r} holds {value!r}, not a yes/no flag (True/False or 1/0)")


def _step(value: object, where: str, col: str, what: str) -> int:
    v = _number(value, where, col, what)
    if v is None:
        raise ReplayError(f"{where}: the step ({what} {col!r}) is empty; every row needs a step number")
    if not math.isfinite(v) or v != int(v) or v < 0:
        raise ReplayError(f"{where}: the step ({what} {col!r}) is {value!r}, not a whole number >= 0")
    return int(v)


_CUT = "A resumed run logs some steps again: keep one attempt's rows (cut the log at the restart) and replay that"


class _StepOrder:
    """Steps must increase per device; says where the offending row and the earlier one are."""

    def __init__(self) -> None:
        self.last: dict[str | None, tuple[int, str]] = {}

    def check(self, device: str | None, step: int, where: str, here: str, fix: str = _CUT) -> None:
        prev = self.last.get(device)
        if prev is not None and step <= prev[0]:
            dev = f" on device {device}" if device is not None else ""
            what = "is repeated" if step == prev[0] else f"comes after step {prev[0]}"
            raise ReplayError(f"{where}: step {step} {what}{dev}: steps must increase (step {prev[0]} is at "
                              f"{prev[1]}). {fix if prev[1] != here else _CUT}")
        self.last[device] = (step, here)


def _row(values: Mapping[str, object], chosen: Mapping[str, str], where: str, what: str) -> Row:
    row = Row(step=_step(values.get(chosen["step"]), where, chosen["step"], what))
    for arg in ("loss", "lr", "grad_norm", "throughput", "time", *LOCAL):
        if arg in chosen:
            setattr(row, arg, _number(values.get(chosen[arg]), where, chosen[arg], what))
    for arg in SCALING:
        if arg in chosen:
            v = values.get(chosen[arg])
            setattr(row, arg, flag(v, where, chosen[arg], what) if arg == "overflow"
                    else _number(v, where, chosen[arg], what))
    if row.time is None and "time_ms" in chosen:
        ms = _number(values.get(chosen["time_ms"]), where, chosen["time_ms"], what)
        row.time = None if ms is None else ms / 1000.0
    if "device" in chosen:
        dev = values.get(chosen["device"])
        row.device = None if dev in (None, "") else str(dev)
    return row


def _has_metric(row: Row) -> bool:
    """False for rows with no training metric at all (an evaluation-only row): they are skipped."""
    return not (row.loss is None and row.lr is None and row.grad_norm is None and row.throughput is None
                and row.local_loss is None and row.local_grad_norm is None)


# -- text formats ---------------------------------------------------------------------------------


@dataclass
class _Counted(Generic[T]):
    """Items passed through, their total weight counted (bytes of lines, or rows) for a progress bar."""

    items: Iterable[T]
    weight: Callable[[T], int]
    done: int = 0

    def __iter__(self) -> Iterator[T]:
        for x in self.items:
            self.done += self.weight(x)
            yield x


def _decoded(lines: Iterable[bytes]) -> Iterator[str]:
    for raw in lines:
        yield raw.decode("utf-8", errors="replace")


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


# -- TensorBoard ------------------------------------------------------------------------------------

_DEVICE_DIR = re.compile(r"(?:device|rank)_([A-Za-z0-9][\w.-]*)")  # msmon's device_N (a slug), MindFormers' rank_N
_TENSOR_FORMATS = {1: "<f", 2: "<d"}  # DT_FLOAT, DT_DOUBLE


def _event_files(root: str) -> dict[str, list[str]]:
    """Folder -> its event files in name (= creation) order."""
    if os.path.isfile(root):
        return {os.path.dirname(root): [root]}
    found: dict[str, list[str]] = {}
    for folder, _, files in sorted(os.walk(root)):
        events = sorted(f for f in files if "tfevents" in f)
        if events:
            found[folder] = [os.path.join(folder, f) for f in events]
    if not found:
        raise ReplayError(f"{root}: no TensorBoard event files (events.out.tfevents.*) in this folder or below")
    return found


def _devices(root: str, folders: list[str]) -> dict[str, str | None]:
    """Folder -> device: one folder is the default device; msmon's device_N siblings are devices N."""
    if len(folders) == 1:
        m = _DEVICE_DIR.fullmatch(os.path.basename(folders[0]))
        return {folders[0]: m.group(1) if m else None}
    matches = {f: _DEVICE_DIR.fullmatch(os.path.basename(f)) for f in folders}
    if all(matches.values()) and len({os.path.dirname(f) for f in folders}) == 1:
        return {f: m.group(1) for f, m in matches.items() if m}
    listed = ", ".join(os.path.relpath(f, root) for f in folders)
    raise ReplayError(f"{root}: event files in several folders ({listed}) that are not one run's device_N folders; "
                      "replay one of them")


def _records(path: str) -> Iterator[tuple[int, bytes]]:
    """(byte offset, payload) of each TFRecord; a truncated last record (a file being written) ends it."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        offset = 0
        while True:
            header = f.read(12)
            if len(header) < 12:
                return
            (length,) = struct.unpack("<Q", header[:8])
            if length > size - offset:
                return
            data = f.read(length)
            if len(data) < length or len(f.read(4)) < 4:
                return
            yield offset, data
            offset += 16 + length


def _scalar(value: Any) -> float | None:
    kind = value.WhichOneof("value")
    if kind == "simple_value":
        return float(value.simple_value)
    if kind != "tensor":
        return None
    t = value.tensor
    if any(d.size != 1 for d in t.tensor_shape.dim):
        return None
    fmt = _TENSOR_FORMATS.get(t.dtype)
    if fmt is None:
        return None
    if t.tensor_content:
        return float(struct.unpack_from(fmt, t.tensor_content)[0])
    vals = t.float_val if t.dtype == 1 else t.double_val
    return float(vals[0]) if vals else None


def _read_event_folder(files: list[str], device: str | None,
                       columns: Mapping[str, str]) -> tuple[list[Row], dict[str, str]]:
    """The folder's rows, and the tag each Row field was read from."""
    from tensorboardX.proto.event_pb2 import Event  # protobuf only for TensorBoard logs

    series: dict[str, list[tuple[int, float, float, str]]] = {}  # tag -> (step, value, wall time, file)
    for path in files:
        for offset, data in _records(path):
            ev = Event()
            try:
                ev.ParseFromString(data)
            except Exception:  # noqa: BLE001 - protobuf's DecodeError; any parse failure means the same
                raise ReplayError(f"{path}: the record at byte {offset} is not a TensorBoard event (a corrupted "
                                  "or foreign file?); move that file out of the folder") from None
            for v in ev.summary.value:
                x = _scalar(v)
                if x is not None:
                    series.setdefault(v.tag, []).append((ev.step, x, ev.wall_time, path))
    where = files[0] if len(files) == 1 else os.path.dirname(files[0])
    chosen = _choose(sorted(series), columns, where, "tag", (*METRICS, *LOCAL, *SCALING))
    rows: dict[int, Row] = {}
    for arg, tag in chosen.items():
        order = _StepOrder()
        for step, x, wall, path in series[tag]:
            order.check(device, step, f"{path} (tag {tag!r}, step {step})", os.path.basename(path),
                        "The folder holds several attempts of the run, one event file each: replay one file "
                        f"(msmon replay {path}), or move the others out of the folder")
            row = rows.get(step)
            if row is None:
                row = rows[step] = Row(step=step, time=wall, device=device)
            setattr(row, arg, bool(x) if arg == "overflow" else x)
    return [rows[s] for s in sorted(rows)], chosen


FLOPS_TAG = "model-flops-throughput-per-npu"


def _missing_ranks(root: str, ranks: Iterable[str | None]) -> None:
    """Say which ranks of a multi-rank run have no log (numbered 0..N-1, some absent): they are not replayed."""
    numbers = sorted({int(r) for r in ranks if r is not None and r.isdigit()})
    if len(numbers) < 2:
        return
    gone = sorted(set(range(numbers[-1] + 1)) - set(numbers))
    if gone:
        shown = ", ".join(map(str, gone[:10])) + (" ..." if len(gone) > 10 else "")
        log.warning(f"{root}: logs of {len(numbers)} ranks, none of rank(s) {shown}: those are not replayed (a rank's "
                    "log lost, or not copied with the others?); each rank present is a device of its own")


def _read_tensorboard(root: str, columns: Mapping[str, str]) -> list[Row]:
    """Every scalar row of a run, all devices merged in step order (event files are read whole)."""
    folders = _event_files(root)
    devices = _devices(root, list(folders))
    _missing_ranks(root, devices.values())
    read = [_read_event_folder(files, devices[folder], columns) for folder, files in folders.items()]
    rows = [r for part, _ in read for r in part]
    rows.sort(key=lambda r: (r.step, r.device or ""))
    if any(chosen.get("throughput") == FLOPS_TAG for _, chosen in read):
        log.warning(f"{root}: the throughput is MindFormers' {FLOPS_TAG!r} (model TFLOPS per NPU, not samples/s: "
                    "it writes 'throughput' only with tensorboard.log_timers_to_tensorboard: True); the "
                    "throughput_drop rule judges its drops, but an expected rate in samples/s does not apply to it")
    return rows


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
