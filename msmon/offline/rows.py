"""A log's rows: the `Row` every reader yields, the names a log's columns go by (`ALIASES`, a `columns` mapping),
and one value read where it is, with the place named when it is not a number. The readers by format are
readers.py's and events.py's."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from msmon.config.errors import closest
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
log = logging.getLogger("msmon.offline.readers")  # notes on what a log held (damaged lines): the CLI prints them


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

