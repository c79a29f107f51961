"""notifier.mindspore.lr's two helpers for train cells that are not msmon's (MindFormers' MFTrainOneStepCell):
`live_settings` finds ScalableLR's scale whatever the network named it, so a rewind keeps the operator's LR scale;
`share_lr` gives a train cell that keeps a deep copy of the optimizer's schedule the optimizer's own."""

from __future__ import annotations

import copy

import numpy as np
import pytest

pytest.importorskip("mindspore", reason="MindSpore is not installed (pip install msmon[mindspore])")

import mindspore as ms  # noqa: E402
from mindspore import nn, ops  # noqa: E402

from notifier.mindspore import MindSporeBackend, ScalableLR  # noqa: E402
from notifier.mindspore.lr import share_lr  # noqa: E402

pytestmark = [pytest.mark.mindspore]


class CopyingCell(nn.TrainOneStepCell):  # type: ignore[misc]
    """A train cell that reports the LR from its own deep copy of the schedule, as MFTrainOneStepCell does."""

    def __init__(self, network, optimizer):  # type: ignore[no-untyped-def]
        super().__init__(network, optimizer)
        self.learning_rate = copy.deepcopy(optimizer.learning_rate)

    def construct(self, *inputs):  # type: ignore[no-untyped-def]
        loss = super().construct(*inputs)
        return loss, self.learning_rate(self.optimizer.global_step).reshape(())


def _cell(schedule):  # type: ignore[no-untyped-def]
    net = nn.Dense(3, 1)
    opt = nn.Momentum(net.trainable_params(), learning_rate=schedule, momentum=0.9)
    return CopyingCell(nn.WithLossCell(net, nn.MSELoss()), opt)


def _step(cell) -> float:  # type: ignore[no-untyped-def]
    x, y = ms.Tensor(np.ones((4, 3), np.float32)), ms.Tensor(np.ones((4, 1), np.float32))
    return float(cell(x, y)[1].asnumpy())


def test_a_rewind_keeps_the_lr_scale_under_the_name_mindformers_gives_it(tmp_path):
    cell = _cell(ScalableLR(nn.CosineDecayLR(0.0, 0.1, 100)))
    scale = cell.optimizer.learning_rate.scale
    scale.name = "optimizer.learning_rate.scale"  # the name it had inside MindFormers' optimizer (issue 38)
    backend = MindSporeBackend(str(tmp_path))
    backend.bind(cell, cell.optimizer)
    path = backend.save_checkpoint(0, "ck")
    ops.assign(scale, ms.Tensor(0.5, ms.float32))  # the operator's scale-lr after the checkpoint
    loaded = backend.read_checkpoint(path)
    assert "optimizer.learning_rate.scale" not in loaded  # left as it is: the rewind keeps 0.5
    backend.restore(loaded)
    assert float(scale.asnumpy()) == 0.5


def test_share_lr_makes_the_reported_lr_the_scaled_one():
    cell = _cell(nn.CosineDecayLR(0.0, 0.1, 100))
    assert "wrapped as ScalableLR" in (share_lr(cell, cell.optimizer, scalable=True) or "")
    assert cell.learning_rate is cell.optimizer.learning_rate
    before = _step(cell)
    backend = MindSporeBackend()
    backend.bind(cell, cell.optimizer)
    backend.scale_lr(0.5)
    after = _step(cell)
    assert after == pytest.approx(before * 0.5, rel=0.01)  # the cosine moved one step: well within 1%


def test_without_share_lr_the_copy_hides_the_scale():
    """What MindFormers' log showed before (issue 38): the optimizer's LR halves, the reported one does not."""
    cell = _cell(ScalableLR(nn.CosineDecayLR(0.0, 0.1, 100)))
    before = _step(cell)
    ops.assign(cell.optimizer.learning_rate.scale, ms.Tensor(0.5, ms.float32))
    assert _step(cell) == pytest.approx(before, rel=0.01)


def test_a_train_cell_with_its_own_copy_gets_a_scalable_schedule_without_asking():
    """MonitorCallback handed to MindFormers' Trainer (callbacks=[...]): its schedule came from the YAML too."""
    cell = _cell(nn.CosineDecayLR(0.0, 0.1, 100))
    share_lr(cell, cell.optimizer)
    assert isinstance(cell.optimizer.learning_rate, ScalableLR) and cell.learning_rate is cell.optimizer.learning_rate
