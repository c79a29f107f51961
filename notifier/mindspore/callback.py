"""`MonitorCallback`: msmon inside `Model.train` / `model.fit`.

    from notifier.mindspore import MonitorCallback
    model.train(epochs, dataset, callbacks=[MonitorCallback("train.yaml", run_id="run-42")])

On a step that is not sampled the callback only times the step (a few microseconds). On a sampled
step it reads the loss (and, when the train cell returns them, the LR and grad norm) from
`net_outputs`, hands everything to `Monitor.step`, and queues the `actions:` of the events raised;
queued actions run before the next step starts.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Mapping
from typing import Any

from mindspore import nn
from mindspore.train import Callback

from msmon.contract.wire import ActionResult, Event

from ..config import MonitorConfig
from ..control import JobControl
from ..monitor import Monitor
from .backend import MindSporeBackend

log = logging.getLogger("msmon")


def _scalar(x: Any) -> float | None:
    if x is None:
        return None
    try:
        return float(x.asnumpy().reshape(-1)[0]) if hasattr(x, "asnumpy") else float(x)
    except (TypeError, ValueError, IndexError):
        return None


def parse_outputs(out: Any) -> tuple[float | None, float | None, float | None]:
    """(loss, lr, grad_norm) from a train cell's outputs: a loss tensor; MindFormers' / msmon's
    `(loss, overflow, scaling_sens, lr, global_norm)`; or any tuple whose first item is the loss."""
    if isinstance(out, (tuple, list)):
        if not out:
            return None, None, None
        if len(out) == 5:
            return _scalar(out[0]), _scalar(out[3]), _scalar(out[4])
        return _scalar(out[0]), None, None
    return _scalar(out), None, None


def find_optimizer(cb: Any) -> Any:
    """The optimizer of a training: Model's own, else the one inside the train cell."""
    opt = getattr(cb, "optimizer", None)
    if opt is not None:
        return opt
    net = getattr(cb, "train_network", None)
    opt = getattr(net, "optimizer", None)
    if opt is not None:
        return opt
    if net is not None and hasattr(net, "cells_and_names"):
        for _, cell in net.cells_and_names():
            if isinstance(cell, nn.Optimizer):
                return cell
    return None


def _rank() -> str:
    for var in ("RANK_ID", "RANK", "MS_NODE_ID"):
        if os.environ.get(var, "").isdigit():
            return os.environ[var]
    return "0"


class MonitorCallback(Callback):  # type: ignore[misc]
    """msmon's monitor as a MindSpore callback.

    config: a path (training YAML or standalone), a mapping or a MonitorConfig.
    run_id: shown in every line and alert. device: defaults to the rank from RANK_ID / RANK.
    checkpoint_dir: where save_checkpoint and stop write. seq_length: tokens per sample, for
    tokens/s (else `training.seq_length`, else the second dimension of an integer input batch).
    on_event / on_action: hooks called with each Event / ActionResult (the bot transport uses them).
    """

    def __init__(
        self,
        config: str | os.PathLike[str] | Mapping[str, Any] | MonitorConfig,
        run_id: str = "run",
        *,
        device: str | int | None = None,
        checkpoint_dir: str = "./checkpoints",
        seq_length: int | None = None,
        pause_timeout: float | None = None,
        on_event: Callable[[Event], None] | None = None,
        on_action: Callable[[ActionResult], None] | None = None,
        monitor: Monitor | None = None,
    ) -> None:
        super().__init__()
        self.monitor = monitor if monitor is not None else Monitor(
            config, run_id, device=_rank() if device is None else device)
        self.backend = MindSporeBackend(checkpoint_dir)
        self.control = JobControl(self.monitor, self.backend, pause_timeout, on_result=on_action)
        self.on_event = on_event
        self._seq_length = seq_length or self.monitor.config.training.seq_length
        self._batch: int | None = None
        self._tokens_per_sample: int | None = None
        self._last_step = 0
        if self.monitor.config.training.grad_accumulation_steps > 1:
            log.info("msmon: MonitorCallback reports the steps MindSpore counts; training.grad_accumulation_steps "
                     "treats them as micro-steps, which is right only if your train cell returns one loss per "
                     "micro-batch")

    # -- hooks ---------------------------------------------------------------------------------

    def on_train_begin(self, run_context: Any) -> None:
        cb = run_context.original_args()
        self.backend.bind(cb.train_network, find_optimizer(cb))
        self.control.listen()  # chat commands, applied at step boundaries
        self._last_step = int(getattr(cb, "initial_step", 0) or 0)
        self._batch = None  # read from the first batch's shape (a dataset's get_batch_size() may say 1)
        if getattr(cb, "dataset_sink_mode", False):
            log.info("msmon: dataset sink mode: MindSpore calls back once per sink of %s steps, so per-step values "
                     "are seen once per sink (throughput is computed over the whole sink)", cb.batch_num)

    def on_train_step_end(self, run_context: Any) -> None:
        cb = run_context.original_args()
        step = int(cb.cur_step_num)
        steps = max(step - self._last_step, 1)
        self._last_step = step
        mon = self.monitor
        if self._batch is None:
            self._size_batch(cb)
        n = self._batch * steps if self._batch else None
        tokens = None if n is None or self._tokens_per_sample is None else n * self._tokens_per_sample
        if not mon.samples(step):
            mon.step(step, samples=n, tokens=tokens)
        else:
            loss, lr, grad_norm = parse_outputs(cb.net_outputs)
            if lr is None:
                lr = self.backend.read_lr()
            events = mon.step(step, loss=loss, lr=lr, grad_norm=grad_norm, samples=n, tokens=tokens)
            for ev in events:
                self._dispatch(ev)
        if self.control.has_pending:
            self.control.apply(step, run_context)

    def on_train_end(self, run_context: Any) -> None:
        self.monitor.close()

    # -- helpers -------------------------------------------------------------------------------

    def _size_batch(self, cb: Any) -> None:
        element = getattr(cb, "train_dataset_element", None)
        first = element[0] if isinstance(element, (tuple, list)) and element else element
        shape = getattr(first, "shape", None)
        if shape:
            self._batch = int(shape[0])
            dtype = str(getattr(first, "dtype", ""))
            if self._seq_length is None and len(shape) == 2 and "Int" in dtype:
                self._seq_length = int(shape[1])  # token ids: (batch, sequence)
        else:
            try:
                self._batch = int(cb.train_dataset.get_batch_size())
            except Exception:  # noqa: BLE001 - no way to know: throughput in steps/s
                self._batch = 0
        if self._seq_length is not None:
            self._tokens_per_sample = int(self._seq_length)

    def _dispatch(self, ev: Event) -> None:
        self.control.take_event(ev)
        if self.on_event is not None:
            try:
                self.on_event(ev)
            except Exception:  # noqa: BLE001
                log.exception("msmon: on_event hook failed")

    # -- the actions, callable from code --------------------------------------------------------

    def save_checkpoint(self) -> None:
        self.control.request("save_checkpoint")

    def pause(self, timeout: float | None = None) -> None:
        self.control.request("pause", timeout=timeout)

    def resume(self) -> None:
        self.control.request("resume")

    def scale_lr(self, factor: float) -> None:
        if not (factor > 0 and math.isfinite(factor)):
            raise ValueError(f"scale_lr needs a positive factor, got {factor!r}")
        self.control.request("scale_lr", factor=factor)

    def set_threshold(self, rule: str, value: float, level: str = "warning") -> None:
        self.control.request("set_threshold", rule=rule, value=value, level=level)

    def stop(self) -> None:
        self.control.request("stop")
