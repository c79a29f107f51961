"""MindFormers' logs as MindFormers writes them, built from its own format strings, for the reader tests.

The format strings are MindFormers' (`mindformers/core/callback/callback.py`, `MFLossMonitor.print_output_info`,
current and 2023 generations; `mindformers/tools/logger.py` for the prefixes), applied with Python's `%`
and `logging.Formatter` as MindFormers applies them. TensorBoard files are written with tensorboardX (what
MindFormers uses) under MFLossMonitor's tag names, in its `tensorboard_dir/rank_N` layout.

A step is a dict: `step` (global, from 1), `loss`, `lr`, `grad_norm`, `throughput` (samples/s per
device), `time` (seconds since the epoch, UTC); in a data-parallel run optionally `local_loss` and
`local_grad_norm`, the rank's own values that `TrainingStateMonitor` writes (`STATE`, its tags).
"""

from __future__ import annotations

import logging
import os
import time as _time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

# MFLossMonitor.print_output_info, current: the loss part depends on sink mode; no "lr: " when it is unknown.
CURRENT = ("{ Epoch:[%3d/%3d], step:[%5d/%5d], %sper_step_time: %dms, lr: %s, overflow cond: %s, loss_scale: %s, "
           "global_norm: %s%s")
CURRENT_NO_LR = ("{ Epoch:[%3d/%3d], step:[%5d/%5d], %sper_step_time: %dms, overflow cond: %s, loss_scale: %s, "
                 "global_norm: %s%s")
SINK_LOSS = "loss: %5.3f, "
LOSS = "loss:[%5.3f/%5.3f], "
THROUGHPUT = ", train_throughput_per_npu: %.3fT"
PROGRESS = "  %4.1f%% %s %.5f samples/s/p  %s }"
# TrainingStateMonitor._to_log (monitor_config device_local_loss_format / device_local_norm_format: 'log'): the
# rank's own values, one line each after MFLossMonitor's, under the same logger; its TensorBoard tags are the names.
STATE = "Epoch:[%3d/%3d], step:[%5d/%5d] %s: %.4f"
STATE_TAGS = (("local_loss", "device_accum_local_loss"), ("local_grad_norm", "device_local_norm"))
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


def prefixed(message: str, when: float, fmt: str = STDOUT_FORMAT, func: str = "print_output_info",
             level: int = logging.INFO) -> str:
    """One line as MindFormers' logger writes it (`when` in UTC)."""
    formatter = logging.Formatter(fmt)
    formatter.converter = _time.gmtime
    record = logging.LogRecord("mindformers", level, CALLBACK, 529, message, None, None, func=func)
    record.created, record.msecs = when, (when % 1) * 1000
    record.filepath = CALLBACK
    return formatter.format(record)


def _progress_bar(percent: float) -> str:
    return ("|%%-%ds|" % 50) % (int(50 * percent / 100) * "█")  # noqa: UP031 - MindFormers' own format


def _norm(x: float) -> str:
    return f"[{x:.6f}]"  # a 1-element numpy array, as %s prints it


def current_lines(steps: Sequence[dict[str, Any]], *, steps_per_epoch: int, epochs: int, sink: bool = False,
                  lr_known: bool = True, flops: bool = True, progress: bool = True, fmt: str = STDOUT_FORMAT,
                  between: Iterable[str] = (), state: bool = False) -> list[str]:
    """The current generation's lines for `steps` (each printed step; sink mode prints every sink_size-th);
    `state`: TrainingStateMonitor's lines of the step's `local_loss` / `local_grad_norm` after them."""
    out: list[str] = []
    extra = list(between)
    losses: list[float] = []
    total = epochs * steps_per_epoch
    for i, s in enumerate(steps):
        epoch, step = (s["step"] - 1) // steps_per_epoch + 1, (s["step"] - 1) % steps_per_epoch + 1
        losses.append(s["loss"])
        loss = SINK_LOSS % s["loss"] if sink else LOSS % (s["loss"], sum(losses) / len(losses))
        per_step_ms = int(1000.0 / s["throughput"]) if s.get("throughput") else 0
        tail = THROUGHPUT % (150.0 + s["step"] % 7) if flops else ""
        if lr_known:
            msg = CURRENT % (epoch, epochs, step, steps_per_epoch, loss, per_step_ms, f"{s['lr']:.7g}",
                             s.get("overflow", False), s.get("loss_scale", 1.0), _norm(s["grad_norm"]), tail)
        else:
            msg = CURRENT_NO_LR % (epoch, epochs, step, steps_per_epoch, loss, per_step_ms, s.get("overflow", False),
                                   s.get("loss_scale", 1.0), _norm(s["grad_norm"]), tail)
        out.append(prefixed(msg, s["time"], fmt))
        if progress:
            pct = s["step"] / total * 100
            out.append(prefixed(PROGRESS % (pct, _progress_bar(pct), s["throughput"], "0:01:40"), s["time"], fmt))
        if extra and i % 7 == 3:
            out.append(prefixed(extra[i % len(extra)], s["time"], fmt, func="on_train_step_end"))
        if state:
            for key, tag in STATE_TAGS:
                if s.get(key) is not None:
                    out.append(prefixed(STATE % (epoch, epochs, step, steps_per_epoch, tag, s[key]), s["time"], fmt,
                                        func="_to_log"))
    return out


def old_lines(steps: Sequence[dict[str, Any]], *, steps_per_epoch: int, epochs: int, sink_size: int = 1,
              fmt: str = FILE_FORMAT) -> list[str]:
    """The 2023 generation's lines (an `epoch_end:` line after each sink in sink mode)."""
    out: list[str] = []
    losses: list[float] = []
    for s in steps:
        epoch, step = (s["step"] - 1) // steps_per_epoch + 1, (s["step"] - 1) % steps_per_epoch + 1
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
                      global_batch_size: int = 8) -> str:
    """MFLossMonitor's scalars for `steps` in `root/rank_N` (its "... vs samples" twins on the samples axis)."""
    from tensorboardX import SummaryWriter

    folder = os.path.join(root, f"rank_{rank}")
    w = SummaryWriter(logdir=folder)
    for s in steps:
        g, t = s["step"], s["time"]
        samples = g * global_batch_size
        scalars = [("batch-size", global_batch_size, g), ("batch-size vs samples", global_batch_size, samples),
                   ("loss", s["loss"], g), ("loss vs samples", s["loss"], samples),
                   ("learning-rate", s["lr"], g), ("learning-rate vs samples", s["lr"], samples),
                   ("grad-norm", s["grad_norm"], g), ("grad-norm vs samples", s["grad_norm"], samples),
                   ("model-flops-throughput-per-npu", 150.0 + g % 7, g), ("loss-scale", 1.0, g)]
        if timers:
            scalars += [("iteration-time", int(1000.0 / s["throughput"]), g), ("throughput", s["throughput"], g),
                        ("B-samples-per-day", s["throughput"] * 86400 / 1e9, g),
                        ("throughput vs samples", s["throughput"], samples)]
        scalars += [(tag, s[key], g) for key, tag in STATE_TAGS if s.get(key) is not None]  # TrainingStateMonitor
        for tag, value, x in scalars:
            w.add_scalar(tag, value, x, walltime=t)
    w.close()
    return folder
