"""`MindSporeBackend`: what JobControl's checkpoint, scale_lr, rewind, clip_grad and stop do in a MindSpore training.

    backend = MindSporeBackend("./checkpoints")
    backend.bind(net, optimizer)  # MonitorCallback does this at on_train_begin (with the dataset)
    control = JobControl(monitor, backend)

A rewind (docs/rewind.md) reads the checkpoint and checks it against the train network before anything changes
(`read_checkpoint`), moves the data (`seek_data`: MindSpore's own in-process dataset reset, the one its training
recovery uses, so the batches already prefetched are dropped and the next one read is the one asked for), then
assigns every parameter of the train network: the weights, the optimizer's moments and step counter (the LR
schedule's position), the loss-scale cell's scale and counters. msmon's own live settings (the LR scale of
ScalableLR, the clip norm) are kept as they are now: a setting an operator chose as a remedy survives the rewind.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import mindspore as ms
import numpy as np
from mindspore import ops

from msmon.common.safenames import inside

from ..control import ActionError
from .lr import LrHandle, global_step, live_settings, lr_handles, scale_problem, share_lr
from .reads import uncounted


class MindSporeBackend:
    """Checkpoints of the bound network, the bound optimizer's LR, `run_context.request_stop()`."""

    def __init__(self, checkpoint_dir: str = "./checkpoints", read: Any = uncounted) -> None:
        self.checkpoint_dir = checkpoint_dir
        self.read = read  # makes read_lr's device-to-host copies (MonitorCallback passes its HostReads)
        self.train_network: Any = None
        self.optimizer: Any = None
        self._handles: list[LrHandle] | None = None  # the optimizer's LRs, made once (a list LR is kept on the host)
        self.on_saved: Callable[[str], object] | None = None  # told each checkpoint written (MonitorCallback saves
        # the monitor's state next to it)
        self.dataset: Any = None  # the training dataset, whose iterator seek_data resets
        self._shift = 0  # data position - MindSpore's step counter (moved by each seek)
        self.wrap_lr = False  # bind wraps a bare LR schedule as ScalableLR (MindFormers: schedules come from YAML)
        self.lr_note: str | None = None  # what bind did to the LR (lr.share_lr), for the start-up log

    def bind(self, train_network: Any, optimizer: Any, dataset: Any = None) -> None:
        """What save_checkpoint saves, whose LR scale_lr scales, and (optional) whose data a rewind moves."""
        self.train_network, self.optimizer = train_network, optimizer
        self.dataset = dataset
        self.lr_note = share_lr(train_network, optimizer, self.wrap_lr)  # the LR reported is the LR used
        self._handles = None
        self._shift = 0

    def _lr_handles(self) -> list[LrHandle]:
        if self._handles is None:
            self._handles = lr_handles(self.optimizer)
        return self._handles

    def save_checkpoint(self, step: int, name: str, directory: str | None = None) -> str:
        if self.train_network is None:
            raise ActionError("no network to save yet (training has not started)")
        folder = self.checkpoint_dir if directory is None else directory
        os.makedirs(folder, exist_ok=True)
        path = inside(folder, f"{name}.ckpt")  # whatever `name` holds, the file stays in the folder
        ms.save_checkpoint(self.train_network, path, crc_check=True)  # a flipped byte is refused at load
        if self.on_saved is not None:
            self.on_saved(path)
        return path

    # -- rewind ---------------------------------------------------------------------------------

    def read_checkpoint(self, path: str) -> dict[str, Any]:
        """The checkpoint's values by parameter name, checked against the train network: every parameter there,
        with its shape and type. Changes nothing; ActionError says what does not match."""
        net = self.train_network
        if net is None:
            raise ActionError("no network to load into yet (training has not started)")
        try:
            saved = ms.load_checkpoint(path, crc_check=True)
        except Exception as exc:  # noqa: BLE001 - a damaged or missing file: refused, nothing changed
            raise ActionError(f"the checkpoint {path} does not load ({type(exc).__name__}: {exc}); nothing was "
                              "changed") from exc
        out: dict[str, Any] = {}
        live = live_settings(net)
        for p in net.get_parameters():
            if p.name.startswith("msmon_") or id(p) in live:
                continue  # msmon's live settings stay as they are (ScalableLR's scale under whatever name)
            v = saved.get(p.name)
            if v is None:
                raise ActionError(f"the checkpoint {path} has no {p.name}: it is not this network's; nothing was "
                                  "changed")
            if tuple(v.shape) != tuple(p.shape) or v.dtype != p.dtype:
                raise ActionError(f"the checkpoint's {p.name} is {v.dtype}{tuple(v.shape)}, the network's "
                                  f"{p.dtype}{tuple(p.shape)}; nothing was changed")
            out[p.name] = v
        return out

    def restore(self, loaded: dict[str, Any]) -> str:
        """Assign every checked value (ops.assign: what a compiled step sees; set_data would not reach it)."""
        net = self.train_network
        n = 0
        for p in net.get_parameters():
            v = loaded.get(p.name)
            if v is not None:
                ops.assign(p, ms.Tensor(v.asnumpy()))
                n += 1
        self._handles = None
        return f"{n} parameters restored (weights, optimizer state and step, loss scale)"

    def data_position(self, run_context: Any) -> int | None:
        if run_context is None:
            return None
        return int(run_context.original_args().cur_step_num) + self._shift

    def _iterator(self) -> Any:
        from mindspore.dataset.engine import iterators

        ds = self.dataset
        for ref in reversed(iterators.ITERATORS_LIST):
            it = ref()
            if it is not None and ds is not None and getattr(it, "_Iterator__ori_dataset", None) is ds:
                return it
        return None

    def data_total(self, run_context: Any) -> int | None:
        """The data positions this training reads: the dataset's batches per epoch times the epochs of the
        `Model.train` call (MindSpore refuses a reset at or past it: "reset step must be less than dataset_size *
        num_epochs", and the next batch then raises out of Model.train). None: not known."""
        if run_context is None or self.dataset is None:
            return None
        try:
            size, epochs = int(self.dataset.get_dataset_size()), int(run_context.original_args().epoch_num)
        except Exception:  # noqa: BLE001 - not known
            return None
        return size * epochs if size > 0 and epochs > 0 else None

    def check_seek(self, position: int, run_context: Any) -> None:
        """Whether `seek_data(position)` can be honoured, changing nothing: the dataset's iterator is there, the
        training is not in dataset sink mode, and `position` is before the last batch's end. ActionError says why
        not (every rank checks before any rank moves: docs/rewind.md)."""
        if run_context is not None and getattr(run_context.original_args(), "dataset_sink_mode", False):
            raise ActionError("cannot move the data position in dataset sink mode, so a skip cannot be honoured "
                              "(a rewind without skip can); nothing was changed")
        it = self._iterator()
        if it is None or not hasattr(it, "_reset"):
            raise ActionError("the training dataset's iterator was not found, so its position cannot move (dataset "
                              "sink mode, or a loop that is not Model.train); nothing was changed")
        total = self.data_total(run_context)
        if total is None:
            raise ActionError("the training dataset's size is not known, so a skip cannot be checked against the "
                              "batches left; nothing was changed")
        if not 0 <= position < total:
            raise ActionError(f"the data cannot move to batch {position:,}: this training reads batches 0-"
                              f"{total - 1:,} (dataset size x epochs), so that skip would run past the last batch of "
                              "the last epoch; nothing was changed")

    def seek_data(self, position: int, run_context: Any) -> str:
        self.check_seek(position, run_context)
        it = self._iterator()
        size = int(self.dataset.get_dataset_size())
        it._reset(position, size)  # MindSpore's in-process recovery reset: the prefetched batches are dropped
        self._shift = position - int(run_context.original_args().cur_step_num)
        return f"data moved to batch {position:,}"

    def delete_checkpoint(self, path: str) -> None:
        if os.path.exists(path):
            os.remove(path)

    def clip_grad(self, max_norm: float) -> str:
        net = self.train_network
        param = getattr(net, "msmon_clip_norm", None)
        if param is None:
            raise ActionError("clip-grad needs msmon's train cells (notifier.mindspore.TrainStepWithGradNorm or "
                              "TrainStepWithGradNormLossScale), which clip inside the compiled step")
        value = np.asarray(max_norm, dtype=param.asnumpy().dtype)
        if not np.isfinite(value) or value < 0 or (max_norm > 0 and not value >= np.finfo(value.dtype).tiny):
            raise ActionError(f"max_norm {max_norm!r} is not a positive normal {value.dtype} (the clip norm's type: "
                              f"it would hold {float(value):g}); nothing was changed")
        before = float(param.asnumpy())
        ops.assign(param, ms.Tensor(value))
        held = float(param.asnumpy())
        if held != float(value):  # what the compiled step reads is what was asked, or the answer says so
            ops.assign(param, ms.Tensor(np.asarray(before, dtype=value.dtype)))
            raise ActionError(f"the clip norm held {held:g} after assigning {float(value):g}; put back to {before:g}")
        was = f"global norm {before:g}" if before > 0 else "off"
        now = f"global norm {held:g}" if held > 0 else "off"
        return f"grad clipping {was} -> {now} from the next step"

    def agree(self, value: int, refused: bool = False) -> tuple[bool, list[int]]:
        """Whether every rank holds the same `value` (a step, or a negative verdict), and which ranks `refused`:
        one all-reduce, the same answer on every rank. The CPU's AllReduce only sums float32, so the value goes as
        8 nibbles with their squares and a count: a rank sees every nibble's sum equal to the count times its own
        and the same for the squares only when the nibbles' variance over the ranks is zero, that is when every
        rank's value is its own (exact in float32 up to 65,535 ranks); then one flag per rank, 1 where it refused."""
        from mindspore.communication import get_group_size, get_rank

        size, rank = int(get_group_size()), int(get_rank())
        v = value & 0xFFFFFFFF
        nib = np.array([(v >> (4 * k)) & 0xF for k in range(8)], np.float32)
        flags = np.zeros(size, np.float32)
        flags[rank] = 1.0 if refused else 0.0
        sums = ops.AllReduce(ops.ReduceOp.SUM)(
            ms.Tensor(np.concatenate([nib, nib * nib, np.ones(1, np.float32), flags]).astype(np.float32)))
        got = sums.asnumpy()
        n = got[16]
        same = bool((got[:8] == n * nib).all() and (got[8:16] == n * nib * nib).all())
        return same, [int(r) for r in np.flatnonzero(got[17:] > 0.5)]

    def scale_lr(self, factor: float) -> str:
        opt = self.optimizer
        if opt is None:
            raise ActionError("no optimizer known yet (training has not started)")
        handles = self._lr_handles()
        idx = max(global_step(opt) - 1, 0)
        before = [h.read(idx) for h in handles]
        problem = scale_problem(before, factor)  # the LR in use (a ScalableLR's schedule x its scale)
        if problem is not None:
            raise ActionError(problem)
        values = [h.scaled(factor) for h in handles]  # every group checked before any is changed: all or none
        for h, value in zip(handles, values, strict=True):
            h.assign(value)
        after = [h.read(idx) for h in handles]
        return "lr " + ", ".join(f"{a:.3g} -> {b:.3g}" for a, b in zip(before, after, strict=True))

    def read_lr(self, steps_ago: int = 0) -> float | None:
        """The LR of the last optimizer step, or of the one `steps_ago` steps before it (of the first
        parameter group); None when unknown. Host reads: one for a fixed LR or a list (copied to the host
        once), two and an evaluation for a schedule."""
        opt = self.optimizer
        if opt is None:
            return None
        try:
            handle = self._lr_handles()[0]
            index = 0 if handle.fixed else global_step(opt, self.read) - 1 - steps_ago
            return handle.read(index, self.read)
        except Exception:  # noqa: BLE001 - an exotic optimizer: no LR, but never a crash
            return None

    def stop(self, run_context: Any) -> None:
        if run_context is not None:
            run_context.request_stop()
