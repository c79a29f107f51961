"""Reading and scaling the learning rate an optimizer really uses, whatever form it was given in."""

from __future__ import annotations

from typing import Any

import mindspore as ms
import numpy as np
from mindspore import nn, ops

from msmon.contract.actions import FLOAT32_MIN_NORMAL

from ..control import ActionError
from .reads import uncounted

FLOAT32_MAX = float(np.finfo(np.float32).max)


def scale_problem(values: Any, factor: float) -> str | None:
    """Why `values` x `factor` cannot be a learning rate in float32 (None when it can): an entry that is not 0 would
    become infinite or leave the positive normal range (below ~1.18e-38 it is a subnormal or 0, and an LR of 0 is
    one no later scale-lr can bring back)."""
    old = np.asarray(values, dtype=np.float64)
    new = np.abs(old[old != 0] * factor)
    if new.size and (not np.all(np.isfinite(new)) or new.min() < FLOAT32_MIN_NORMAL or new.max() > FLOAT32_MAX):
        return (f"an LR of {float(np.abs(old[old != 0]).min()):.3g} x {factor:g} leaves float32's range "
                f"[{FLOAT32_MIN_NORMAL:.3g}, {FLOAT32_MAX:.3g}]: the LR would be 0 or infinite for good")
    return None


class ScalableLR(nn.learning_rate_schedule.LearningRateSchedule):  # type: ignore[misc]
    """Wrap any LR schedule so that msmon (or chat) can scale it live: lr = schedule(step) x scale.

        opt = nn.AdamWeightDecay(params, learning_rate=ScalableLR(nn.CosineDecayLR(0.0, 3e-4, 10000)))
    """

    def __init__(self, schedule: Any) -> None:
        super().__init__()
        self.schedule = schedule
        self.scale = ms.Parameter(ms.Tensor(1.0, ms.float32), name="msmon_lr_scale", requires_grad=False)

    def construct(self, global_step: Any) -> Any:
        return self.schedule(global_step) * self.scale


def _assign(param: Any, value: Any) -> None:
    ops.assign(param, ms.Tensor(value))  # set_data would not reach a compiled step


class LrHandle:
    """One learning rate of an optimizer (one per parameter group): read it, scale it."""

    def __init__(self, lr: Any) -> None:
        self.lr = lr
        self._array: Any = None  # the schedule as a numpy array, for list LRs

    @property
    def fixed(self) -> bool:
        """One value for every step (a Parameter or a wrapped scalar): `read` needs no step index."""
        lr = self.lr
        if isinstance(lr, ms.Parameter):
            return True
        inner = getattr(lr, "learning_rate", None)
        return isinstance(inner, ms.Parameter) and (inner.ndim == 0 or inner.size == 1)

    def read(self, step_index: int, read: Any = uncounted) -> float:
        """The LR of the optimizer step with 0-based index `step_index` (ignored when `fixed`); `read` makes
        the device-to-host copies (a list LR is copied once and kept)."""
        lr = self.lr
        if isinstance(lr, ms.Parameter):
            return float(read(lr))
        inner = getattr(lr, "learning_rate", None)  # MindSpore's wrappers of a scalar or a list
        if isinstance(inner, ms.Parameter):
            if inner.ndim == 0 or inner.size == 1:
                return float(read(inner).reshape(()))
            if self._array is None:
                self._array = read(inner)
            arr = self._array
            return float(arr[min(max(step_index, 0), arr.shape[0] - 1)])
        # A schedule: one evaluation (a few ms); train cells that return the LR avoid it.
        return float(read(lr(ms.Tensor([max(step_index, 0)], ms.int32))).reshape(-1)[0])

    def _setting(self) -> Any:
        """The parameter a scale multiplies: the LR itself, a ScalableLR's scale, or a wrapped scalar's or list's."""
        lr = self.lr
        if isinstance(lr, ms.Parameter):
            return lr
        if isinstance(lr, ScalableLR):
            return lr.scale
        if isinstance(getattr(lr, "learning_rate", None), ms.Parameter):
            return lr.learning_rate
        raise ActionError(f"the LR schedule {type(lr).__name__} cannot be changed while training runs: "
                          "wrap it as learning_rate=ScalableLR(schedule) (from notifier.mindspore)")

    def scaled(self, factor: float) -> Any:
        """The setting's value x `factor` in float32, changing nothing; ActionError when it cannot be (see
        `scale_problem`, or a schedule that cannot be scaled). Every handle is asked before any is changed."""
        value = self._setting().asnumpy()
        problem = scale_problem(value, factor)
        if problem is not None:
            raise ActionError(problem)
        return (value.astype(np.float64) * factor).astype(np.float32)

    def assign(self, value: Any) -> None:
        """Set the value `scaled` gave."""
        _assign(self._setting(), value)
        self._array = None

    def scale(self, factor: float) -> None:
        self.assign(self.scaled(factor))


def lr_handles(optimizer: Any) -> list[LrHandle]:
    lr = optimizer.learning_rate
    if getattr(optimizer, "is_group_lr", False):
        return [LrHandle(x) for x in lr]
    return [LrHandle(lr)]


def global_step(optimizer: Any, read: Any = uncounted) -> int:
    """The optimizer's step counter: the number of updates done so far (a device-to-host read)."""
    return int(read(optimizer.global_step).reshape(-1)[0])


def live_settings(network: Any) -> set[int]:
    """The ids of the parameters in `network` that hold msmon's live LR setting: every ScalableLR's scale, whatever
    name the network gave it (a schedule wrapped before the optimizer was built has its scale named by its path, e.g.
    MindFormers' `optimizer.learning_rate.scale`). A rewind leaves them as they are (docs/rewind.md, step 4)."""
    if network is None or not hasattr(network, "cells_and_names"):
        return set()
    return {id(cell.scale) for _, cell in network.cells_and_names() if isinstance(cell, ScalableLR)}


def share_lr(train_network: Any, optimizer: Any, scalable: bool = False) -> str | None:
    """Make the LR a train cell reports the optimizer's real one; what was done, None for nothing.

    MindFormers' MFTrainOneStepCell reports the LR from `self.learning_rate = deepcopy(optimizer.learning_rate)`: a
    change to the optimizer's schedule (scale-lr, a fault) changes the real LR but not the one reported in its log
    line, its TensorBoard and the 5-tuple msmon reads. The train cell is given the optimizer's own schedule (one
    object: the LR reported is the LR used). With `scalable`, or for such a train cell, a bare schedule is first
    wrapped as ScalableLR, so scale-lr works on a schedule the user cannot wrap (one built from a YAML's
    lr_schedule). Call it before the first step compiles the graph (a callback's on_train_begin)."""
    if optimizer is None or train_network is None or getattr(train_network, "use_grouped_lr", False):
        return None
    done = []
    lr = optimizer.learning_rate
    copy = getattr(train_network, "learning_rate", None) if train_network is not optimizer else None
    scalable = scalable or (isinstance(copy, nn.Cell) and copy is not lr)
    if scalable and isinstance(lr, nn.learning_rate_schedule.LearningRateSchedule) and not isinstance(lr, ScalableLR):
        optimizer.learning_rate = lr = ScalableLR(lr)
        done.append(f"the optimizer's {type(lr.schedule).__name__} wrapped as ScalableLR (scale-lr can change it)")
    if copy is not None and copy is not lr and isinstance(copy, nn.Cell) and isinstance(lr, nn.Cell):
        train_network.learning_rate = lr
        done.append(f"{type(train_network).__name__} reports the optimizer's LR instead of its own copy")
    return "; ".join(done) or None
