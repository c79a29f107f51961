"""Tiny real MindSpore trainings for the integration tests (CPU, GRAPH mode, a few seconds each)."""

from __future__ import annotations

from typing import Any

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
from mindspore import nn

from notifier.mindspore import TrainStepWithGradNorm

ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")


def regression_data(n: int = 2048, dim: int = 32, seed: int = 0, nan_at: int | None = None) -> tuple[Any, Any]:
    """A noisy regression problem (the recipe in shared/notes: x ~ N(0, 1), y = x.w + noise)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, dim)).astype(np.float32)
    w = rng.standard_normal((dim, 1)).astype(np.float32)
    y = (x @ w + 0.5 * rng.standard_normal((n, 1))).astype(np.float32)
    return x, y


def dataset(x: Any, y: Any, batch: int, repeat: int = 1, nan_batches: tuple[int, ...] = ()) -> Any:
    """Batches in order; the batches listed in `nan_batches` (0-based, over the repeats) carry a NaN."""
    xs, ys = [], []
    nb = len(x) // batch
    for r in range(repeat):
        for b in range(nb):
            xb = x[b * batch:(b + 1) * batch].copy()
            if r * nb + b in nan_batches:
                xb[0, 0] = np.nan
            xs.append(xb)
            ys.append(y[b * batch:(b + 1) * batch])
    data = ds.NumpySlicesDataset({"x": np.concatenate(xs), "y": np.concatenate(ys)}, shuffle=False)
    return data.batch(batch, drop_remainder=True)


class MLP(nn.Cell):  # type: ignore[misc]
    def __init__(self, dim: int = 32, hidden: int = 64) -> None:
        super().__init__()
        self.l1 = nn.Dense(dim, hidden)
        self.act = nn.ReLU()
        self.l2 = nn.Dense(hidden, 1)

    def construct(self, x: Any) -> Any:
        return self.l2(self.act(self.l1(x)))


def model(lr: Any = 0.05, grad_norm: bool = True, seed: int = 1) -> tuple[Any, Any, Any]:
    """(ms.Model, network, optimizer): SGD on an MLP with MSE, the train cell returning the grad norm."""
    ms.set_seed(seed)
    net = MLP()
    opt = nn.SGD(net.trainable_params(), learning_rate=lr)
    loss_net = nn.WithLossCell(net, nn.MSELoss())
    train = TrainStepWithGradNorm(loss_net, opt) if grad_norm else nn.TrainOneStepCell(loss_net, opt)
    return ms.Model(train), net, opt
