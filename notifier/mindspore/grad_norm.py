"""Global grad norm inside the compiled step: a train-cell wrapper and a helper for custom loops.

MindSpore has no public op that returns the global norm, so it is computed in the graph
(`sqrt(sum of squared gradients)`, a few small kernels) and returned with the loss. The train
cells return MindFormers' layout, `(loss, overflow, scaling_sens, lr, global_norm)`, followed by
`metrics`: loss, LR and norm packed into one float32 tensor of shape (3,) (`METRICS`), so that
`MonitorCallback` copies one tensor to the host per sampled step instead of three. `packed=False`
gives the bare 5-tuple (what MindFormers' own MFLossMonitor reads LR and norm from). The LR comes
from inside the graph too, where reading it is free.

In a data-parallel run (the cell's gradient reducer on) the norm returned is that of the reduced
gradient, the same on every rank, and `metrics` has a fourth value (shape (4,), `LOCAL_METRICS`):
this rank's own norm, of its gradients before the all-reduce. It is computed from what the rank
already holds, a few kernels more and no collective: what tells a rank with a bad shard or a failing
card apart from the others, which the reduced norm cannot.
"""

from __future__ import annotations

from typing import Any

import mindspore as ms
from mindspore import nn, ops


def global_norm(grads: Any) -> Any:
    """The L2 norm over all gradients in `grads` (a tuple of tensors); usable inside `ms.jit`."""
    squares = [ops.reduce_sum(ops.square(g.astype(ms.float32))) for g in grads]
    return ops.sqrt(ops.addn(squares))


METRICS = ("loss", "lr", "grad_norm")  # the order of the packed `metrics` tensor
LOCAL_METRICS = (*METRICS, "local_grad_norm")  # ... in a data-parallel run: this rank's norm before the all-reduce
SCALING = ("overflow", "loss_scale")  # the loss-scaling cell packs these after them: (5,) or, data parallel, (6,)


def pack_metrics(loss: Any, lr: Any, norm: Any, local_norm: Any = None, overflow: Any = None,
                 scale: Any = None) -> Any:
    """`METRICS` as one float32 tensor of shape (3,), or `LOCAL_METRICS` (4,) with a `local_norm`, then `SCALING`
    (the overflow flag as 1/0 and the loss scale) when `overflow` is given: one device-to-host copy reads them
    all. Each is taken as its first element (a loss of shape (1,), a per-group LR's first group). Usable inside
    `ms.jit`."""
    values = (loss, lr, norm) if local_norm is None else (loss, lr, norm, local_norm)
    if overflow is not None:
        values = (*values, overflow, scale)
    return ops.stack([ops.cast(ops.reshape(x, (-1,))[0], ms.float32) for x in values])


def _outputs(cell: Any, loss: Any, overflow: Any, scaling_sens: Any, lr: Any, norm: Any, local: Any = None,
             scaling: bool = False) -> Any:
    """The train cells' outputs: MindFormers' 5-tuple, then the packed metrics unless `cell.packed` is off
    (with an LR per parameter group, the first group's is packed; `local`: the rank's own norm, if any;
    `scaling`: the overflow flag and the loss scale packed too)."""
    if cell.packed:
        first_lr = lr[0] if cell.optimizer.is_group_lr else lr
        extra = (overflow, scaling_sens) if scaling else (None, None)
        return loss, overflow, scaling_sens, lr, norm, pack_metrics(loss, first_lr, norm, local, *extra)
    return loss, overflow, scaling_sens, lr, norm


def _clip(grads: Any, norm: Any, clip_norm: float) -> Any:
    factor = clip_norm / ops.maximum(norm, clip_norm)
    return tuple(g * factor.astype(g.dtype) for g in grads)


def clip_live(grads: Any, norm: Any, clip: Any) -> Any:
    """Gradients scaled down to the global norm `clip` (a Parameter that `clip-grad` changes while training runs;
    0: no clipping, the factor is 1). Usable inside `ms.jit`: a custom loop passes `GradClip().value`."""
    factor = ops.where(clip > 0, clip / ops.maximum(norm, clip), ops.ones_like(norm))
    return tuple(g * factor.astype(g.dtype) for g in grads)


def _clip_param(clip_norm: float | None) -> Any:
    return ms.Parameter(ms.Tensor(float(clip_norm or 0.0), ms.float32), name="msmon_clip_norm", requires_grad=False)


class GradClip:
    """The clip norm of a custom loop, changeable while it trains (`clip-grad <run> <max_norm>`): pass `value` to
    `clip_live` inside the compiled step, and the holder to your backend's `clip_grad` (examples/custom_loop.py)."""

    def __init__(self, max_norm: float | None = None) -> None:
        self.value = _clip_param(max_norm)

    def set(self, max_norm: float) -> str:
        before = float(self.value.asnumpy())
        ops.assign(self.value, ms.Tensor(float(max_norm), ms.float32))  # set_data would not reach a compiled step
        was = f"global norm {before:g}" if before > 0 else "off"
        now = f"global norm {max_norm:g}" if max_norm > 0 else "off"
        return f"grad clipping {was} -> {now} from the next step"


class TrainStepWithGradNorm(nn.TrainOneStepCell):  # type: ignore[misc]
    """`nn.TrainOneStepCell` that also returns the global grad norm (before clipping) and the LR.

    `clip_norm`: if set, gradients are scaled down to that global norm before the update. `runtime_clip` (the
    default): the clip norm is the Parameter `msmon_clip_norm` (0: off), which `clip-grad` changes while training
    runs, at the cost of one multiply per gradient each step; False: `clip_norm` is compiled in as a constant.
    Outputs `(loss, overflow=False, scaling_sens=1.0, lr, global_norm, metrics)`; without `metrics`
    when `packed=False`.
    """

    def __init__(self, network: Any, optimizer: Any, clip_norm: float | None = None, packed: bool = True,
                 runtime_clip: bool = True) -> None:
        super().__init__(network, optimizer)
        self.clip_norm = clip_norm
        self.packed = packed
        self.runtime_clip = runtime_clip
        if runtime_clip:
            self.msmon_clip_norm = _clip_param(clip_norm)
        self.one = ms.Tensor(1.0, ms.float32)
        self.no_overflow = ms.Tensor(False, ms.bool_)

    def construct(self, *inputs: Any) -> Any:
        loss = self.network(*inputs)
        grads = self.grad_no_sens(self.network, self.weights)(*inputs)
        local = global_norm(grads) if self.reducer_flag else None  # data parallel: this rank's own, no collective
        grads = self.grad_reducer(grads)
        norm = global_norm(grads)
        if self.runtime_clip:
            grads = clip_live(grads, norm, self.msmon_clip_norm)
        elif self.clip_norm is not None:
            grads = _clip(grads, norm, self.clip_norm)
        lr = self.optimizer.get_lr()
        loss = ops.depend(loss, self.optimizer(grads))
        return _outputs(self, loss, self.no_overflow, self.one, lr, norm, local)


class TrainStepWithGradNormLossScale(nn.TrainOneStepWithLossScaleCell):  # type: ignore[misc]
    """`nn.TrainOneStepWithLossScaleCell` (fp16 loss scaling, fixed or dynamic) that also returns
    the LR and the global norm of the unscaled gradients. On overflow the step is skipped, as in
    MindSpore's cell. Outputs `(loss, overflow, scaling_sens, lr, global_norm, metrics)`, `metrics` with the
    overflow flag and the scale the step ran with packed after the norms (`SCALING`); without `metrics` when
    `packed=False`."""

    def __init__(self, network: Any, optimizer: Any, scale_sense: Any, clip_norm: float | None = None,
                 packed: bool = True, runtime_clip: bool = True) -> None:
        super().__init__(network, optimizer, scale_sense)
        self.clip_norm = clip_norm
        self.packed = packed
        self.runtime_clip = runtime_clip
        if runtime_clip:
            self.msmon_clip_norm = _clip_param(clip_norm)
        # MindSpore's overflow status ops exist on Ascend and GPU only; on the CPU a non-finite
        # global norm is the overflow signal (the reduced gradients are the same on every rank).
        self.norm_overflow = ms.get_context("device_target") == "CPU"

    def construct(self, *inputs: Any) -> Any:
        weights = self.weights
        loss = self.network(*inputs)
        scaling_sens = self.scale_sense
        status = ms.Tensor([0] * 8, ms.int32)
        scaling_sens_filled = ops.ones_like(loss) * ops.cast(scaling_sens, ops.dtype(loss))
        grads = self.grad(self.network, weights)(*inputs, scaling_sens_filled)
        grads = tuple(g / ops.cast(scaling_sens, g.dtype) for g in grads)
        local = global_norm(grads) if self.reducer_flag else None  # data parallel: this rank's own, no collective
        grads = self.grad_reducer(grads)
        norm = global_norm(grads)
        if self.norm_overflow:  # noqa: SIM108 - graph-mode code: a plain branch on a constant
            cond = ops.logical_not(ops.isfinite(norm))
        else:
            cond = self.get_overflow_status(status, grads)
        overflow = self.process_loss_scale(cond)
        if self.runtime_clip:
            grads = clip_live(grads, norm, self.msmon_clip_norm)
        elif self.clip_norm is not None:
            grads = _clip(grads, norm, self.clip_norm)
        lr = self.optimizer.get_lr()
        if not overflow:
            loss = ops.depend(loss, self.optimizer(grads))
        return _outputs(self, loss, cond, scaling_sens, lr, norm, local, scaling=True)
