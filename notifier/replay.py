"""Replay a recorded metrics log through the same `Monitor` that runs live."""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from .monitor import Monitor
from .wire import Event

# Monitor.step argument -> column names tried in order (msmon's own CSV first).
COLUMNS: dict[str, tuple[str, ...]] = {
    "step": ("step", "iteration", "iter", "global_step"),
    "loss": ("loss", "train_loss", "lm_loss"),
    "lr": ("learning_rate", "lr"),
    "grad_norm": ("grad_norm", "global_norm", "norm"),
    "throughput": ("tokens_per_s", "throughput"),
    "time": ("time", "timestamp"),
    "time_ms": ("train_time_ms_cumulative",),
    "device": ("device",),
}


class ReplayError(ValueError):
    pass


@dataclass
class Row:
    step: int
    loss: float | None = None
    lr: float | None = None
    grad_norm: float | None = None
    throughput: float | None = None
    time: float | None = None
    device: str | None = None


def _number(text: str, path: str, line: int, col: str) -> float | None:
    text = text.strip()
    if not text:
        return None
    try:
        return float(text)  # "nan" and "inf" are data
    except ValueError:
        raise ReplayError(f"{path}:{line}: column {col!r} holds {text!r}, which is not a number") from None


def read_csv(path: str, columns: Mapping[str, str] | None = None) -> Iterator[Row]:
    """Rows of a metrics CSV. `columns` maps Monitor.step argument names to this file's column names."""
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        header = reader.fieldnames or []
        chosen: dict[str, str] = {}
        for arg, names in COLUMNS.items():
            if columns and arg in columns:
                if columns[arg] not in header:
                    raise ReplayError(f"{path}: no column {columns[arg]!r} (columns: {', '.join(header)})")
                chosen[arg] = columns[arg]
                continue
            for name in names:
                if name in header:
                    chosen[arg] = name
                    break
        if "step" not in chosen:
            raise ReplayError(f"{path}: no step column (looked for {', '.join(COLUMNS['step'])}; "
                              f"columns: {', '.join(header)})")
        last = None
        for i, rec in enumerate(reader, start=2):
            step_v = _number(rec[chosen["step"]], path, i, chosen["step"])
            if step_v is None or not math.isfinite(step_v):
                raise ReplayError(f"{path}:{i}: empty or invalid step")
            row = Row(step=int(step_v))
            for arg in ("loss", "lr", "grad_norm", "throughput", "time"):
                if arg in chosen:
                    setattr(row, arg, _number(rec[chosen[arg]], path, i, chosen[arg]))
            if "time_ms" in chosen and row.time is None:
                ms = _number(rec[chosen["time_ms"]], path, i, chosen["time_ms"])
                row.time = None if ms is None else ms / 1000.0
            if "device" in chosen:
                row.device = rec[chosen["device"]] or None
            if row.loss is None and row.grad_norm is None and row.lr is None:
                continue  # e.g. an evaluation-only row
            key = (row.device, row.step)
            if last is not None and last[0] == row.device and row.step <= last[1]:
                raise ReplayError(f"{path}:{i}: step {row.step} comes after step {last[1]}: steps must increase")
            last = key
            yield row


def replay(rows: Iterable[Row], monitor: Monitor) -> list[Event]:
    """Feed every row to `monitor` as a live job would; all events raised, in order."""
    events: list[Event] = []
    for r in rows:
        events.extend(monitor.step(r.step, loss=r.loss, lr=r.lr, grad_norm=r.grad_norm,
                                   throughput=r.throughput, time=r.time, device=r.device))
    monitor.close()
    return events
