"""Toy MindSpore jobs: a noisy regression and an MLP, a few ms a step on a CPU (the demo, the
command-latency benchmark, the backtest trace generator and the tests train it for real), and a small
Transformer language model on random tokens (the callback benchmarks)."""

from __future__ import annotations

from typing import Any

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
from mindspore import nn

from .grad_norm import TrainStepWithGradNorm


def regression_data(n: int = 2048, dim: int = 32, seed: int = 0) -> tuple[Any, Any]:
    """A noisy regression problem (the recipe in shared/notes: x ~ N(0, 1), y = x.w + noise)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, dim)).astype(np.float32)
    w = (rng.standard_normal((dim, 1)) / np.sqrt(dim)).astype(np.float32)
    y = (x @ w + 0.5 * rng.standard_normal((n, 1))).astype(np.float32)
    return x, y


def dataset(x: Any, y: Any, batch: int, steps: int, nan_steps: tuple[int, ...] = ()) -> Any:
    """`steps` batches cycling through (x, y) in order; the 1-based steps in `nan_steps` get a NaN label
    (so the loss itself is NaN)."""
    nb = len(x) // batch

    def gen() -> Any:
        for i in range(steps):
            b = i % nb
            yb = y[b * batch:(b + 1) * batch]
            if i + 1 in nan_steps:
                yb = yb.copy()
                yb[0, 0] = np.nan
            yield x[b * batch:(b + 1) * batch], yb

    return ds.GeneratorDataset(gen, column_names=["x", "y"], shuffle=False)


class MLP(nn.Cell):  # type: ignore[misc]
    def __init__(self, dim: int = 32, hidden: int = 64) -> None:
        super().__init__()
        self.l1 = nn.Dense(dim, hidden)
        self.act = nn.ReLU()
        self.l2 = nn.Dense(hidden, 1)

    def construct(self, x: Any) -> Any:
        return self.l2(self.act(self.l1(x)))


def model(lr: Any = 0.05, grad_norm: bool = True, seed: int = 1) -> tuple[Any, Any, Any]:
    """(ms.Model, network, optimizer): SGD on an MLP with MSE, the train cell returning the grad norm;
    evaluation (for model.fit) reports the MSE."""
    ms.set_seed(seed)
    net = MLP()
    opt = nn.SGD(net.trainable_params(), learning_rate=lr)
    loss_net = nn.WithLossCell(net, nn.MSELoss())
    train = TrainStepWithGradNorm(loss_net, opt) if grad_norm else nn.TrainOneStepCell(loss_net, opt)
    evaluate = nn.WithEvalCell(net, nn.MSELoss())
    return ms.Model(train, eval_network=evaluate, metrics={"mse": nn.Loss()}, eval_indexes=[0, 1, 2]), net, opt


class TinyLM(nn.Cell):  # type: ignore[misc]
    """A small Transformer LM with its loss: embedding, `layers` encoder layers, a vocabulary head,
    cross-entropy on the next token. `construct(tokens, labels)` returns the loss."""

    def __init__(self, vocab: int, d: int, heads: int, layers: int) -> None:
        super().__init__()
        self.vocab = vocab
        self.embed = nn.Embedding(vocab, d)
        layer = nn.TransformerEncoderLayer(d, heads, dim_feedforward=4 * d, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers)
        self.head = nn.Dense(d, vocab)
        self.loss = nn.CrossEntropyLoss()

    def construct(self, tokens: Any, labels: Any) -> Any:
        logits = self.head(self.encoder(self.embed(tokens))).reshape(-1, self.vocab)
        return self.loss(logits, labels.reshape(-1))


def token_data(steps: int, batch: int, seq: int, vocab: int, seed: int = 0) -> Any:
    """`steps` batches of random token ids (batch, seq) and their next tokens as labels."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, vocab, (steps * batch, seq + 1)).astype(np.int32)
    return ds.NumpySlicesDataset({"tokens": tokens[:, :-1], "labels": tokens[:, 1:]}, shuffle=False).batch(batch)
