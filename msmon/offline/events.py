"""TensorBoard event files read into `Row`s: one file, or a folder of them (msmon's own LOG_DIR/RUN_ID/device_N
layout, MindFormers' tensorboard_dir/rank_N), each device's scalars by tag, the TFRecord framing checked."""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from .rows import LOCAL, METRICS, SCALING, ReplayError, Row, _choose, _StepOrder, log

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

