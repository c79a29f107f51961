"""MindFormers' logs as MindFormers writes them, built from its own format strings, for the reader tests.

The format strings are MindFormers' own, read from `mindformers/core/callback/callback.py` of each release on PyPI
(`MFLossMonitor.print_output_info`, `TrainingStateMonitor._to_log`) and `mindformers/tools/logger.py` (the
prefixes), applied with Python's `%` and `logging.Formatter` as MindFormers applies them; the values are printed
as MindFormers prints them (`%s` of a NumPy float32 array for the LR, the global norm and the loss scale).
`VERSIONS` says what changed from release to release:

    1.0.0        { Epoch:[%3d/%3d], step:[%5d/%5d], loss: %5.3f, per_step_time: %dms, lr: %s, overflow cond: %s,
                 loss_scale: %s   (non-sink: `loss:[%5.3f/%5.3f], `; no `lr: %s, ` when the LR is unknown), then
                 `  %4.1f%% %s %.2f samples/s/p  %s }`
    1.1.0, 1.2.0 the progress line's samples/s/p with %.5f
    1.3.x        `, global_norm: %s` after the loss scale
    1.6.0        `%s` after it: `, train_throughput_per_npu: %.3fT` when the model's FLOPs are known;
                 TrainingStateMonitor: `Epoch:[%3d/%3d], step:[%5d/%5d] %s: %.4f` (tags device_accum_local_lm_loss,
                 device_local_norm, ...); TensorBoard scalars
    1.7.0        the loss with 6 decimals (`loss: %5.6f, `, `loss:[%5.6f/%5.6f], `), then `lm_loss: %5.6f, `,
                 `load_balancing_loss: ...`, `mtp_loss: ...` when the model prints its separate losses
    1.8.0-2.0.0  TrainingStateMonitor: `... %s: %s` (the value as NumPy prints it)
    2.1.0        `indexer_loss: %5.6f, ` too

TensorBoard files are written with tensorboardX (what MindFormers uses) under MFLossMonitor's tag names, in its
`tensorboard_dir/rank_N` layout, with the `... vs samples` twins (x axis in samples, not steps; tensorboardX writes
`loss vs samples` as `loss_vs_samples`, as in a real MindFormers run's folder).

A step is a dict: `step` (global, from 1), `loss`, `lr`, `grad_norm`, `throughput` (samples/s per
device), `time` (seconds since the epoch, UTC); optionally `overflow`, `loss_scale`, and in a data-parallel run
`local_loss` and `local_grad_norm`, the rank's own values that `TrainingStateMonitor` writes.
`printed(step, version)` is what a reader can read back of it: the values as the log holds them.
"""

from __future__ import annotations

import logging
import math
import os
import time as _time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Version:
    """What one MindFormers release prints (see the module's docstring)."""

    name: str
    loss: str = "%5.3f"  # the loss's format
    samples: str = "%.5f"  # the progress line's samples/s/p
    norm: bool = True  # `, global_norm: %s` (1.3 on)
    flops: bool = True  # the `%s` tail (train_throughput_per_npu) after it (1.6 on)
    separate: tuple[str, ...] = ()  # the separate losses it can print after the loss (1.7 on)
    state: str | None = "%s"  # TrainingStateMonitor's value format (1.6 on), None before it
    tensorboard: bool = True  # MFLossMonitor's scalars (1.6 on)


_SEPARATE = ("lm_loss", "load_balancing_loss", "mtp_loss")
VERSIONS = {v.name: v for v in (
    *(Version(name, samples="%.2f" if name == "1.0" else "%.5f", norm=False, flops=False, state=None,
              tensorboard=False) for name in ("1.0", "1.1", "1.2")),
    Version("1.3", flops=False, state=None, tensorboard=False),
    Version("1.6", state="%.4f"),
    Version("1.7", loss="%5.6f", separate=_SEPARATE, state="%.4f"),
    *(Version(name, loss="%5.6f", separate=_SEPARATE) for name in ("1.8", "1.9", "2.0")),
    Version("2.1", loss="%5.6f", separate=(*_SEPARATE, "indexer_loss")),
)}
NEWEST = VERSIONS["2.1"]

# MFLossMonitor.print_output_info, current generation: the message is put together as MindFormers does (1.7 on:
# "{ Epoch:[%3d/%3d], step:[%5d/%5d], " + loss_info + separate_loss + "per_step_time: ..."; before 1.7 the loss
# was one of the %-arguments of the same text).
HEAD = "{ Epoch:[%3d/%3d], step:[%5d/%5d], "
SINK_LOSS = "loss: %s, "  # with the version's loss format in place of %s
LOSS = "loss:[%s/%s], "
SEPARATE = "%s: %5.6f, "
TAIL = "per_step_time: %dms, lr: %s, overflow cond: %s, loss_scale: %s"
TAIL_NO_LR = "per_step_time: %dms, overflow cond: %s, loss_scale: %s"
NORM = ", global_norm: %s"
THROUGHPUT = ", train_throughput_per_npu: %.3fT"
PROGRESS = "  %4.1f%% %s {samples} samples/s/p  %s }}"
# TrainingStateMonitor._to_log (monitor_config device_local_loss_format / device_local_norm_format: 'log'): the
# rank's own values, one line each after MFLossMonitor's, under the same logger; its TensorBoard tags are the names.
STATE = "Epoch:[%3d/%3d], step:[%5d/%5d] %s: %.4f"  # 1.6, 1.7
STATE_S = "Epoch:[%3d/%3d], step:[%5d/%5d] %s: %s"  # 1.8 on
STATE_TAGS = (("local_loss", "device_accum_local_lm_loss"), ("local_grad_norm", "device_local_norm"))
# The 2023 generation.
OLD = ("Epoch:[%3d/%3d], step:[%5d/%5d], loss:[%5.3f/%5.3f], time:%5.3f ms, lr:%s, overflow cond: %s, "
       "loss_scale: %s")
OLD_EPOCH_END = "Per sink_size step time: %.3f ms, per step time: %.3f ms, avg loss: %.3f"
# The 2022 generation: epochs printed from 0 (`cb_params.cur_epoch_num - 1`), the LR as words when unknown.
OLDEST = "Epoch:[%3d/%3d], step:[%5d/%5d], loss:[%5.3f/%5.3f], time:%5.3f ms, lr:%s"
OLDEST_NO_LR = ("CPU Mode Not Support Compute LR Now.", "Not Set LR.")
# mindformers/tools/logger.py: stdout (what msrun_log/worker_N.log captures) and the info.log file handler.
STDOUT_FORMAT = "%(asctime)s - %(name)s[%(filepath)s:%(lineno)d] - %(levelname)s - %(message)s"
FILE_FORMAT = "[%(levelname)s] %(asctime)s [%(filepath)s:%(lineno)d] %(funcName)s: %(message)s"
CALLBACK = "mindformers/core/callback/callback.py"


def prefixed(message: str, when: float, fmt: str | None = STDOUT_FORMAT, func: str = "print_output_info",
             level: int = logging.INFO) -> str:
    """One line as MindFormers' logger writes it (`when` in UTC); `fmt` None: the message alone."""
    if fmt is None:
        return message
    formatter = logging.Formatter(fmt)
    formatter.converter = _time.gmtime
    record = logging.LogRecord("mindformers", level, CALLBACK, 529, message, None, None, func=func)
    record.created, record.msecs = when, (when % 1) * 1000
    record.filepath = CALLBACK
    return formatter.format(record)


def shown(x: float, shape: tuple[int, ...] = ()) -> str:
    """`%s` of the NumPy float32 array MindFormers holds (a 0-d LR and loss scale, a 1-element global norm)."""
    return str(np.full(shape, x, dtype=np.float32))


def _bar(percent: float) -> str:
    return ("|%%-%ds|" % 50) % (int(50 * percent / 100) * "█")  # noqa: UP031 - MindFormers' own format


def _position(step: int, steps_per_epoch: int) -> tuple[int, int]:
    return (step - 1) // steps_per_epoch + 1, (step - 1) % steps_per_epoch + 1


def step_line(s: dict[str, Any], *, version: Version = NEWEST, steps_per_epoch: int, epochs: int, sink: bool,
              mean: float, lr_known: bool = True, flops: bool = True, separate: int = 0) -> str:
    """MFLossMonitor's message for step `s` (`mean`: the epoch's mean loss so far, which non-sink mode prints;
    `separate`: how many of the version's separate losses the model prints)."""
    epoch, step = _position(s["step"], steps_per_epoch)
    loss = version.loss % s["loss"]
    text = HEAD % (epoch, epochs, step, steps_per_epoch)
    text += SINK_LOSS % loss if sink else LOSS % (loss, version.loss % mean)
    text += "".join(SEPARATE % (name, s["loss"] * 0.9) for name in version.separate[:separate])
    per_step_ms = int(1000.0 / s["throughput"]) if s.get("throughput") else 0
    overflow = "True" if s.get("overflow") else "False"  # `%s` of its NumPy bool, or the word it puts in
    scale = shown(s.get("loss_scale", 1.0))
    text += (TAIL % (per_step_ms, shown(s["lr"]), overflow, scale) if lr_known
             else TAIL_NO_LR % (per_step_ms, overflow, scale))
    if version.norm:
        text += NORM % shown(s["grad_norm"], (1,))
    if version.flops and flops:
        text += THROUGHPUT % (150.0 + s["step"] % 7)
    return text


def progress_line(s: dict[str, Any], *, version: Version = NEWEST, total: int) -> str:
    pct = s["step"] / total * 100
    remain = timedelta(seconds=int((total - s["step"]) / max(s["throughput"], 1e-9)))
    return PROGRESS.format(samples=version.samples) % (pct, _bar(pct), s["throughput"], remain)


def state_value(x: float, version: Version = NEWEST) -> str:
    """TrainingStateMonitor's value: `%.4f` (1.6, 1.7) or `%s` of a NumPy float32 (1.8 on)."""
    return "%.4f" % x if version.state == "%.4f" else shown(x)  # noqa: UP031 - MindFormers' own format


def state_line(s: dict[str, Any], tag: str, value: float, *, version: Version = NEWEST, steps_per_epoch: int,
               epochs: int) -> str:
    epoch, step = _position(s["step"], steps_per_epoch)
    if version.state == "%.4f":
        return STATE % (epoch, epochs, step, steps_per_epoch, tag, value)
    return STATE_S % (epoch, epochs, step, steps_per_epoch, tag, shown(value))


def current_lines(steps: Sequence[dict[str, Any]], *, steps_per_epoch: int, epochs: int, sink: bool = False,
                  lr_known: bool = True, flops: bool = True, progress: bool = True, fmt: str | None = STDOUT_FORMAT,
                  between: Iterable[str] = (), state: bool = False, version: Version | str = NEWEST,
                  separate: int = 0) -> list[str]:
    """The current generation's lines for `steps` (each printed step; sink mode prints every sink_size-th);
    `state`: TrainingStateMonitor's lines of the step's `local_loss` / `local_grad_norm` after them."""
    v = VERSIONS[version] if isinstance(version, str) else version
    out: list[str] = []
    extra = list(between)
    losses: list[float] = []
    total = epochs * steps_per_epoch
    for i, s in enumerate(steps):
        losses.append(s["loss"])
        msg = step_line(s, version=v, steps_per_epoch=steps_per_epoch, epochs=epochs, sink=sink,
                        mean=float(np.mean(losses)), lr_known=lr_known, flops=flops, separate=separate)
        out.append(prefixed(msg, s["time"], fmt))
        if progress:
            out.append(prefixed(progress_line(s, version=v, total=total), s["time"], fmt))
        if extra and i % 7 == 3:
            out.append(prefixed(extra[i % len(extra)], s["time"], fmt, func="on_train_step_end"))
        if state and v.state is not None:
            for key, tag in STATE_TAGS:
                if s.get(key) is not None:
                    out.append(prefixed(state_line(s, tag, s[key], version=v, steps_per_epoch=steps_per_epoch,
                                                   epochs=epochs), s["time"], fmt, func="_to_log"))
    return out


def printed(s: dict[str, Any], version: Version | str = NEWEST, *, lr_known: bool = True) -> dict[str, Any]:
    """What a reader reads back of step `s` from `version`'s lines: each value as the log holds it."""
    v = VERSIONS[version] if isinstance(version, str) else version
    out: dict[str, Any] = {
        "step": s["step"], "loss": float(v.loss % s["loss"]), "lr": float(shown(s["lr"])) if lr_known else None,
        "grad_norm": float(shown(s["grad_norm"], (1,)).strip("[]")) if v.norm else None,  # as the line: `[0.05273438]`
        "throughput": float(v.samples % s["throughput"]),
        "time": math.floor(s["time"]) + int(s["time"] % 1 * 1000) / 1000,  # the prefix's milliseconds, as %03d
        "overflow": bool(s.get("overflow", False)), "loss_scale": float(shown(s.get("loss_scale", 1.0)))}
    for key, _ in STATE_TAGS:
        if s.get(key) is not None and v.state is not None:
            out[key] = float(state_value(s[key], v))
    return out


def old_lines(steps: Sequence[dict[str, Any]], *, steps_per_epoch: int, epochs: int, sink_size: int = 1,
              fmt: str = FILE_FORMAT) -> list[str]:
    """The 2023 generation's lines (an `epoch_end:` line after each sink in sink mode)."""
    out: list[str] = []
    losses: list[float] = []
    for s in steps:
        epoch, step = _position(s["step"], steps_per_epoch)
        losses.append(s["loss"])
        ms = 1000.0 * sink_size / s["throughput"] if s.get("throughput") else 0.0
        msg = OLD % (epoch, epochs, step, steps_per_epoch, s["loss"], sum(losses) / len(losses), ms,
                     f"[{s['lr']:.7g}]", False, 65536.0)
        out.append(prefixed(msg, s["time"], fmt))
        if sink_size > 1:
            out.append(prefixed(OLD_EPOCH_END % (ms, ms / sink_size, s["loss"]), s["time"] + 0.01, fmt,
                                func="epoch_end"))
    return out


PREAMBLE = (
    "......setting tensorboard......",
    ".........Build Callbacks For Train..........",
    ".........Starting Training Model..........",
    ".........Model Compiling, Please Wait a Moment...........",
)
NOISE = (
    "opt_global_step: 12, skip_data_grad_norm_threshold: 3.0, is_skip: [False]",
    "Full model flops is 123456789, Shard model flops is 12345678.",
    "embedding_local_norm: 1.2345",
    "default_lr: 1.500000e-06, equal to `lr:` above.",  # 1.9 on, with grouped LRs (_log_grouped_lr_info)
    "group_0_lr: 1.500000e-06, group_0_params: ['model.layers.0.attention.wq.weight']",
)


def steps_from(rows: Iterable[dict[str, Any]], every: int = 1) -> list[dict[str, Any]]:
    """analysis_data runs (steps from 0, tokens_per_s) as MindFormers' steps (from 1; samples/s); every Nth."""
    out = []
    for r in rows:
        step = r["step"] + 1
        if step % every == 0:
            out.append({"step": step, "loss": r["loss"], "lr": r["learning_rate"], "grad_norm": r["grad_norm"],
                        "throughput": r["tokens_per_s"] / 1000.0, "time": r["time"]})
    return out


def write(path: Path, lines: Iterable[str], preamble: bool = True) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    head = [prefixed(p, 1_700_000_000.0, func="training_process") for p in PREAMBLE] if preamble else []
    path.write_text("\n".join([*head, *lines]) + "\n", encoding="utf-8")
    return str(path)


# -- TensorBoard -------------------------------------------------------------------------------------------

def write_tensorboard(root: Path, steps: Sequence[dict[str, Any]], rank: int = 0, *, timers: bool = True,
                      loss_scale: bool = True, global_batch_size: int = 8) -> str:
    """MFLossMonitor's scalars for `steps` in `root/rank_N`, as 1.6-2.1 write them: each with its "... vs samples"
    twin on the samples axis; `timers` and `loss_scale`: tensorboard.log_timers_to_tensorboard and
    log_loss_scale_to_tensorboard; TrainingStateMonitor's tags for the rank's own values."""
    from tensorboardX import SummaryWriter

    folder = os.path.join(root, f"rank_{rank}")
    w = SummaryWriter(logdir=folder)
    for s in steps:
        g, t = s["step"], s["time"]
        samples = g * global_batch_size
        pairs = [("batch-size", global_batch_size), ("loss", s["loss"]), ("learning-rate", s["lr"]),
                 ("grad-norm", s["grad_norm"])]
        if loss_scale:
            pairs.append(("loss-scale", s.get("loss_scale", 1.0)))
        if timers:
            pairs += [("iteration-time", int(1000.0 / s["throughput"])), ("throughput", s["throughput"])]
        scalars = [("model-flops-throughput-per-npu", 150.0 + g % 7, g)]
        scalars += [(tag, value, g) for tag, value in pairs] + [(f"{tag} vs samples", value, samples)
                                                               for tag, value in pairs]
        if timers:
            scalars.append(("B-samples-per-day", s["throughput"] * 86400 / 1e9, g))
        scalars += [(tag, s[key], g) for key, tag in STATE_TAGS if s.get(key) is not None]  # TrainingStateMonitor
        for tag, value, x in scalars:
            w.add_scalar(tag, value, x, walltime=t)
    w.close()
    return folder
