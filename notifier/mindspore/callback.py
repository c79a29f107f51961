"""`MonitorCallback`: msmon inside `Model.train` / `model.fit`.

    from notifier.mindspore import MonitorCallback
    model.train(epochs, dataset, callbacks=[MonitorCallback("train.yaml", run_id="run-42")])

On a step that is not sampled the callback only times the step (a few microseconds). On a sampled
step it reads the loss (and, when the train cell returns them, the LR and grad norm) from
`net_outputs`, hands everything to `Monitor.step`, and queues the `actions:` of the events raised;
queued actions run before the next step starts. msmon's train cells pack the three into one tensor,
so that is one device-to-host read (`reads.count` counts them). With `deferred_read: true` step N's
outputs are kept and read at the end of step N+1 (or at train end, or before an action runs), when
the device has moved on: the Sample still says step N and carries step N's end time.

Every checkpoint the callback writes (a `save_checkpoint` or `stop` action) gets the monitor's state next to
it, `<ckpt>.msmon.json` (written atomically). A run resumed from a checkpoint carries on from that state: the
detectors, the warmup they inferred and the alerts' state (no new baseline period; an alert firing at the
checkpoint is not raised again as new). The state is found by itself: MindFormers' `load_checkpoint` with
`resume_training` in the training YAML (a checkpoint file, or a folder: its `rank_N/` when there is one, then the
checkpoint `resume_training` names, else the newest state in it); plain MindSpore: `resume_from=` the checkpoint
that was loaded, or `resume_from=True` for the newest `*.msmon.json` in `checkpoint_dir`.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable, Mapping
from typing import Any

from mindspore import nn
from mindspore.train import Callback

from msmon.config.yamlio import load_yaml
from msmon.contract.wire import ActionResult, Event

from ..config import MonitorConfig
from ..control import JobControl
from ..monitor import Monitor
from ..world import detect
from .backend import MindSporeBackend
from .grad_norm import LOCAL_METRICS, METRICS, SCALING
from .reads import HostReads, uncounted

log = logging.getLogger("msmon")

Metrics = tuple[float | None, float | None, float | None]  # (loss, lr, grad_norm)
_NONE: Metrics = (None, None, None)
# (4,): a data-parallel rank's own norm too; (5,) / (6,): the loss-scaling cell's overflow flag and scale after them
_PACKED_SHAPES = tuple((n,) for n in (len(METRICS), len(LOCAL_METRICS), len(METRICS) + len(SCALING),
                                      len(LOCAL_METRICS) + len(SCALING)))
STATE_SUFFIX = ".msmon.json"


def _scalar(x: Any, read: Callable[[Any], Any]) -> float | None:
    if x is None:
        return None
    try:
        return float(read(x).reshape(-1)[0]) if hasattr(x, "asnumpy") else float(x)
    except (TypeError, ValueError, IndexError):
        return None


class Outputs:
    """What one step's outputs say: (loss, lr, grad_norm), the rank's own grad norm before the all-reduce, and
    dynamic loss scaling's overflow flag (the step was skipped) and scale; None where the train cell has none."""

    __slots__ = ("metrics", "local", "overflow", "loss_scale")

    def __init__(self, metrics: Metrics, local: float | None = None, overflow: bool | None = None,
                 loss_scale: float | None = None) -> None:
        self.metrics, self.local, self.overflow, self.loss_scale = metrics, local, overflow, loss_scale


def _unpack(packed: Any, read: Callable[[Any], Any]) -> Outputs:
    values = [float(v) for v in read(packed).tolist()]
    n = len(values)
    local = values[3] if n in (len(LOCAL_METRICS), len(LOCAL_METRICS) + len(SCALING)) else None
    scaled = n >= len(METRICS) + len(SCALING)
    return Outputs((values[0], values[1], values[2]), local,
                   bool(values[-2]) if scaled else None, values[-1] if scaled else None)


def _flag(x: Any, read: Callable[[Any], Any]) -> bool | None:
    v = _scalar(x, read)
    return None if v is None or v != v else bool(v)


def parse_all(out: Any, read: Callable[[Any], Any] = uncounted) -> Outputs:
    """Everything a train cell's outputs say (`Outputs`): msmon's cells pack it in one tensor (one read; the
    loss-scaling cell's with the overflow flag and the scale); MindFormers' 5-tuple `(loss, overflow,
    scaling_sens, lr, global_norm)` is read item by item (five reads); a loss tensor; any other tuple whose first
    item is the loss."""
    if isinstance(out, (tuple, list)):
        if not out:
            return Outputs(_NONE)
        if len(out) == 6 and getattr(out[5], "shape", None) in _PACKED_SHAPES:
            return _unpack(out[5], read)
        if len(out) == 5:
            return Outputs((_scalar(out[0], read), _scalar(out[3], read), _scalar(out[4], read)), None,
                           _flag(out[1], read), _scalar(out[2], read))
        return Outputs((_scalar(out[0], read), None, None))
    return Outputs((_scalar(out, read), None, None))


def parse_outputs(out: Any, read: Callable[[Any], Any] = uncounted) -> Metrics:
    """(loss, lr, grad_norm) from a train cell's outputs: msmon's `(loss, overflow, scaling_sens, lr,
    global_norm, metrics)` (one read: the packed `metrics`); MindFormers' 5-tuple (five reads); a loss
    tensor; or any other tuple whose first item is the loss. `read` copies a tensor to the host."""
    return parse_all(out, read).metrics


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


class _Kept:
    """A sampled step's outputs, with what `Monitor.step` will be told about it: read at once, or later with
    deferred_read (`time`: the step's end, None for now)."""

    __slots__ = ("step", "time", "samples", "tokens", "outputs", "data_time")

    def __init__(self, step: int, time: float | None, samples: int | None, tokens: int | None, outputs: Any,
                 data_time: float | None = None) -> None:
        self.step, self.time, self.samples, self.tokens, self.outputs = step, time, samples, tokens, outputs
        self.data_time = data_time


def state_path(checkpoint: str | os.PathLike[str]) -> str:
    """Where the monitor's state of `checkpoint` is: `<ckpt>.msmon.json` (a path already ending so is kept)."""
    path = os.fspath(checkpoint)
    return path if path.endswith(STATE_SUFFIX) else path + STATE_SUFFIX


def newest_state(directory: str | os.PathLike[str]) -> str | None:
    """The newest `*.msmon.json` in `directory` (by modification time, then name); None when there is none."""
    try:
        with os.scandir(directory) as it:
            found = [(e.stat().st_mtime, e.name, e.path) for e in it if e.name.endswith(STATE_SUFFIX) and e.is_file()]
    except OSError:
        return None
    return max(found)[2] if found else None


def mindformers_resume(config: Any, rank: str) -> str | None:
    """The state a MindFormers run resumes from: its training YAML's `load_checkpoint` when `resume_training` is
    on (True, or the name of the checkpoint to resume); None when the config does not resume (or is no YAML)."""
    top: Any = config
    if isinstance(config, (str, os.PathLike)):
        try:
            top = load_yaml(os.fspath(config))
        except (OSError, ValueError):
            return None  # the Monitor reports a config it cannot read
    if not isinstance(top, Mapping):
        return None
    load, resume = top.get("load_checkpoint"), top.get("resume_training")
    if not resume or not isinstance(load, str) or not load:
        return None
    if not os.path.isdir(load):
        return state_path(load)
    mine = os.path.join(load, f"rank_{rank}")
    folder = mine if os.path.isdir(mine) else load
    if isinstance(resume, str):
        return state_path(os.path.join(folder, os.path.basename(resume)))
    return newest_state(folder)


def _rank() -> str:
    """This process's rank (notifier.world: MindSpore's, else the launcher's environment), "0" when unknown."""
    rank = detect().rank
    return "0" if rank is None else str(rank)


class MonitorCallback(Callback):  # type: ignore[misc]
    """msmon's monitor as a MindSpore callback.

    config: a path (training YAML or standalone), a mapping or a MonitorConfig.
    run_id: shown in every line and alert. device: defaults to the rank from RANK_ID / RANK.
    checkpoint_dir: where save_checkpoint and stop write. seq_length: tokens per sample, for
    tokens/s (else `training.seq_length`, else the second dimension of an integer input batch).
    on_event / on_action: hooks called with each Event / ActionResult (the bot transport uses them).
    deferred_read: read step N's outputs at step N+1 (None: the config's `deferred_read`).
    reads: the counter every device-to-host read of a step goes through (`reads.count`).
    resume_from: the checkpoint this run resumed from (or its `.msmon.json`), or True: the newest `.msmon.json`
    in `checkpoint_dir`; the monitor carries on from the state saved with it. None: MindFormers' `load_checkpoint`
    and `resume_training` in the training YAML say it, else the run starts afresh. A missing or unusable state is
    logged and the monitor starts afresh.
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
        deferred_read: bool | None = None,
        reads: HostReads | None = None,
        resume_from: str | os.PathLike[str] | bool | None = None,
    ) -> None:
        super().__init__()
        self.monitor = monitor if monitor is not None else Monitor(
            config, run_id, device=_rank() if device is None else device)
        self.reads = reads if reads is not None else HostReads()
        self.deferred = self.monitor.config.deferred_read if deferred_read is None else deferred_read
        self._kept: _Kept | None = None
        self.backend = MindSporeBackend(checkpoint_dir, read=self.reads)
        self.control = JobControl(self.monitor, self.backend, pause_timeout, on_result=on_action,
                                  on_rewind=self._rewound)  # a rewind renumbers the steps from the checkpoint's
        self.on_event = on_event
        self._seq_length = seq_length or self.monitor.config.training.seq_length
        self._batch: int | None = None
        self._tokens_per_sample: int | None = None
        self._last_step = 0
        # this rank's input wait: the clock at the previous step's end, the wait before this step's begin; not
        # in dataset sink mode (the input is fed on the device there, the host sees no wait)
        self._ended: float | None = None
        self._wait: float | None = None
        self._time_input = True
        self._resumed_at: int | None = None  # the step of the state loaded (resume_from)
        self._offset = 0  # added to MindSpore's step numbers when they restart from 0 on a resume
        self.backend.on_saved = self.save_state
        found = self._resume_state(resume_from, config, checkpoint_dir)
        if found is not None:
            self.load_state(found)
        if (self.monitor.config.training.grad_accumulation_steps or 1) > 1:
            log.info("msmon: MonitorCallback reports the steps MindSpore counts; training.grad_accumulation_steps "
                     "treats them as micro-steps, which is right only if your train cell returns one loss per "
                     "micro-batch")

    # -- hooks ---------------------------------------------------------------------------------

    def on_train_begin(self, run_context: Any) -> None:
        cb = run_context.original_args()
        self.backend.bind(cb.train_network, find_optimizer(cb), getattr(cb, "train_dataset", None))
        self.control.listen()  # chat commands, applied at step boundaries
        first = int(getattr(cb, "initial_step", 0) or 0)
        resumed = self._resumed_at
        if resumed is not None and first < resumed:
            # Model.train(initial_epoch=...) counts steps from 0 again: number them on from the checkpoint's
            self._offset = resumed - first
            log.info("msmon: MindSpore counts this resumed run's steps from %d; msmon numbers them on from the "
                     "checkpoint's step %d", first, resumed)
        self._last_step = first + self._offset
        self.monitor.plan(_planned_steps(cb, self._offset))
        self._batch = None  # read from the first batch's shape (a dataset's get_batch_size() may say 1)
        self._ended = self._wait = None
        self._time_input = not getattr(cb, "dataset_sink_mode", False)
        if getattr(cb, "dataset_sink_mode", False):
            log.info("msmon: dataset sink mode: MindSpore calls back once per sink of %s steps, so per-step values "
                     "are seen once per sink (throughput is computed over the whole sink)", cb.batch_num)
        if self.deferred:
            log.info("msmon: deferred_read: the metrics of step N are read at the end of step N+1, so its alerts "
                     "and their actions come one step later")

    def on_train_step_begin(self, run_context: Any) -> None:
        """The time since the previous step's end: what this step waited for its input (MindSpore fetches the
        next batch between the two callbacks). A clock reading on the host: no device sync, no collective."""
        ended = self._ended
        self._wait = None if ended is None else max(self.monitor.now() - ended, 0.0)

    def on_train_step_end(self, run_context: Any) -> None:
        cb = run_context.original_args()
        step = int(cb.cur_step_num) + self._offset
        steps = max(step - self._last_step, 1)
        self._last_step = step
        mon = self.monitor
        if self._batch is None:
            self._size_batch(cb)
        n = self._batch * steps if self._batch else None
        tokens = None if n is None or self._tokens_per_sample is None else n * self._tokens_per_sample
        self._flush(step)
        wait, self._wait = self._wait, None
        if not mon.samples(step):
            mon.step(step, samples=n, tokens=tokens, data_time=wait)
        else:
            kept = _Kept(step, mon.now() if self.deferred else None, n, tokens, cb.net_outputs, wait)
            if self.deferred:
                self._kept = kept
            else:
                self._report(kept, step)
        self.control.step_end(step, run_context)  # health checkpoints (docs/rewind.md): a few comparisons when none
        if self.control.has_pending:
            self._flush(step)  # an action syncs the device anyway, and a pause must not split a step from its report
            self.control.apply(step, run_context)
        if self._time_input:
            self._ended = mon.now()  # after a pause or an action: neither is an input wait

    def on_train_end(self, run_context: Any) -> None:
        """The last kept step is read now, and the actions its events ask for run at this last boundary."""
        if self._kept is not None:
            step = self._kept.step
            self._flush(step)
            if self.control.has_pending:
                self.control.apply(step, run_context)
        self.monitor.close()

    # -- helpers -------------------------------------------------------------------------------

    def _report(self, kept: _Kept, step: int) -> None:
        """Hand a sampled step to the monitor, at its own step number and end time; `step` is the step now. The LR
        comes from the optimizer when the train cell does not return it."""
        out = parse_all(kept.outputs, self.reads)
        loss, lr, grad_norm = out.metrics
        if lr is None:
            lr = self.backend.read_lr(step - kept.step)
        self._dispatch_all(self.monitor.step(kept.step, loss=loss, lr=lr, grad_norm=grad_norm, samples=kept.samples,
                                             tokens=kept.tokens, time=kept.time, local_grad_norm=out.local,
                                             data_time=kept.data_time, overflow=out.overflow,
                                             loss_scale=out.loss_scale))

    def _flush(self, step: int) -> None:
        """Report the step kept by deferred_read, if any (`step`: the step now)."""
        kept = self._kept
        if kept is not None:
            self._kept = None
            self._report(kept, step)

    def _dispatch_all(self, events: list[Event]) -> None:
        for ev in events:
            self._dispatch(ev)

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

    def _rewound(self, from_step: int, to_step: int, entry: Any) -> None:
        """JobControl rewound from `from_step` to the checkpoint of `to_step`: MindSpore's counter goes on, msmon
        numbers the steps on from the checkpoint's."""
        self._offset -= from_step - to_step
        self._last_step = to_step
        self._kept = None
        self._ended = None

    # -- resuming ------------------------------------------------------------------------------

    def save_state(self, checkpoint: str | os.PathLike[str]) -> str | None:
        """Write the monitor's state next to `checkpoint` (`<ckpt>.msmon.json`, atomically: a crash mid-write
        leaves the previous file whole); its path, None when it could not be written (logged, training goes
        on). Called for each checkpoint the callback writes; call it for checkpoints written otherwise."""
        path = state_path(checkpoint)
        tmp = f"{path}.tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                # one write: json.dump writes piecemeal, about 8x slower on a 60 KB state
                f.write(json.dumps(self.monitor.state_dict(), allow_nan=False, separators=(",", ":")))
            os.replace(tmp, path)
        except (OSError, TypeError, ValueError) as e:
            log.warning("msmon: run %s: the monitor's state for checkpoint %s was not written (%s: %s); a run "
                        "resumed from that checkpoint will start its rules afresh", self.monitor.run_id,
                        os.fspath(checkpoint), type(e).__name__, e)
            return None
        return path

    def _resume_state(self, resume_from: str | os.PathLike[str] | bool | None, config: Any,
                      checkpoint_dir: str) -> str | os.PathLike[str] | None:
        """The checkpoint (or state file) this run resumes from, or None: see `resume_from`."""
        if resume_from is False:
            return None
        if resume_from is True:
            found = newest_state(checkpoint_dir)
            if found is None:
                log.warning("msmon: run %s was asked to resume (resume_from=True) but %s holds no saved monitor "
                            "state (*%s); the rules learn afresh, with a new baseline period", self.monitor.run_id,
                            checkpoint_dir, STATE_SUFFIX)
            return found
        if resume_from is not None:
            return resume_from
        return mindformers_resume(config, str(self.monitor.default_device))

    def load_state(self, checkpoint: str | os.PathLike[str]) -> bool:
        """Carry on from the state saved with `checkpoint` (or a `.msmon.json` itself); whether it loaded. A
        missing or unusable state never stops training: it is logged with the reason and the monitor starts
        afresh (a new baseline period)."""
        path = state_path(checkpoint)
        try:
            with open(path, encoding="utf-8") as f:
                state = json.load(f)
            self.monitor.load_state_dict(state, continue_clock=False)
            self._resumed_at = self.monitor.last_step
        except (OSError, ValueError) as e:  # StateError and json's errors are ValueErrors
            log.warning("msmon: run %s resumes without the monitor's saved state (%s: %s); the rules learn "
                        "afresh, with a new baseline period", self.monitor.run_id, path, e)
            return False
        log.info("msmon: run %s carries on from the monitor state in %s", self.monitor.run_id, path)
        return True

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


def _planned_steps(cb: Any, offset: int) -> int | None:
    """The step training ends at, as msmon numbers steps: MindSpore's epochs x steps per epoch (a sink's steps in
    sink mode: its epochs are sinks then), moved by the resume offset; None where the job does not say."""
    try:  # MindSpore's run context answers a missing key with KeyError, not AttributeError
        epochs, per_epoch = int(getattr(cb, "epoch_num", 0) or 0), int(getattr(cb, "batch_num", 0) or 0)
    except Exception:  # noqa: BLE001 - what the job says is data: none readable, no plan
        return None
    return epochs * per_epoch + offset if epochs > 0 and per_epoch > 0 else None
