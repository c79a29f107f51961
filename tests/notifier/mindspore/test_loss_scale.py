"""Dynamic loss scaling on real MindSpore training (CPU): msmon's TrainStepWithGradNormLossScale with MindSpore's
DynamicLossScaleUpdateCell, through MonitorCallback (issue 24).

In float32 the scaled gradients would overflow only near 2^127, where the scale itself becomes Inf; the backward of
`_GradTimes` goes through HEADROOM x the gradient (then divides it back), so they overflow at about 2^104 instead:
the scale comes down from SCALE0 in the first steps, then doubles every SCALE_WINDOW good steps, overflows and
halves, every ~SCALE_WINDOW steps, as an fp16 run's scale does against 65504. A skipped step is counted, never an
alert; every step skipped is; a NaN loss is an ERROR at once."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytest.importorskip("mindspore", reason="MindSpore is not installed (pip install msmon[mindspore])")

import mindspore as ms  # noqa: E402
import mindspore.dataset as ds  # noqa: E402
from mindspore import nn, ops  # noqa: E402

from notifier import Monitor, Severity, Status  # noqa: E402
from notifier.mindspore import MonitorCallback, TrainStepWithGradNormLossScale  # noqa: E402
from tests.fakes.helpers import ListSink  # noqa: E402
from tests.fakes.ms_helpers import MLP, regression_data  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.mindspore]

SCALE0, SCALE_WINDOW = 2.0 ** 110, 50
HEADROOM = 2.0 ** 24


class _GradTimes(nn.Cell):  # type: ignore[misc]
    """The identity forward; backward, the gradient x `k` (Inf: every step overflows, the loss stays finite), through
    HEADROOM x it."""

    def construct(self, x: Any, k: Any) -> Any:
        return x

    def bprop(self, x: Any, k: Any, out: Any, dout: Any) -> Any:
        return dout * k * HEADROOM / HEADROOM, ops.zeros_like(k)


class _Loss(nn.Cell):  # type: ignore[misc]
    """MSE of the MLP, x the batch's `mult` (NaN poisons the loss), its gradient x the batch's `k`."""

    def __init__(self) -> None:
        super().__init__()
        self.net, self.times, self.mse = MLP(), _GradTimes(), nn.MSELoss()

    def construct(self, x: Any, y: Any, k: Any, mult: Any) -> Any:
        return self.mse(self.times(self.net(x), k), y) * mult


def train(steps: int, inf_from: int | None = None, nan_at: int | None = None, interval: int = 10):
    """Train; (events, samples)."""
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    x, y = regression_data(n=4096, seed=7)
    nb = len(x) // 256

    def gen():
        for i in range(steps):
            step, b = i + 1, i % nb
            k = np.inf if inf_from is not None and step >= inf_from else 1.0
            mult = np.nan if step == nan_at else 1.0
            yield (x[b * 256:(b + 1) * 256], y[b * 256:(b + 1) * 256], np.array(k, np.float32),
                   np.array(mult, np.float32))

    ms.set_seed(2)
    loss = _Loss()
    opt = nn.SGD(loss.trainable_params(), learning_rate=0.02)
    cell = TrainStepWithGradNormLossScale(loss, opt, nn.DynamicLossScaleUpdateCell(SCALE0, 2, SCALE_WINDOW))
    sink = ListSink()
    conf = {"monitor_config": {"monitor_on": True, "step_interval": interval, "log_interval": 0}}
    events: list = []
    cb = MonitorCallback(None, monitor=Monitor(conf, "ls", sinks=[sink]), on_event=events.append)
    data = ds.GeneratorDataset(gen, column_names=["x", "y", "k", "mult"], shuffle=False)
    ms.Model(cell).train(1, data, callbacks=[cb], dataset_sink_mode=False)
    return [e for e in events if e.status is Status.FIRING], sink.samples


@pytest.mark.parametrize("interval", [1, 10])
def test_periodic_overflow_is_counted_not_alerted(interval):
    events, samples = train(1500, interval=interval)
    skipped = [s for s in samples if s.overflow]
    # it did overflow, every ~SCALE_WINDOW steps: each skip counted when every step is read, those sampled otherwise
    assert samples[-1].skipped_steps is not None and samples[-1].skipped_steps >= (20 if interval == 1 else 2)
    if interval == 1:
        assert len(skipped) == samples[-1].skipped_steps  # every step read: each skip seen
        assert all(s.grad_norm is None for s in skipped)  # a skipped step's norm measured nothing
    later = [s.loss_scale for s in samples if s.step > 300]
    assert max(later) < 2 ** 120 and max(later) / min(later) <= 4  # up and down under its ceiling, never Inf
    assert [e for e in events if e.severity is Severity.ERROR] == []
    assert events == []


def test_every_step_overflowing_is_an_alert_within_50_steps():
    events, _ = train(700, inf_from=500)
    mine = [e for e in events if e.rule == "loss_scale"]
    assert mine and 500 <= mine[0].step <= 550
    assert any(e.severity is Severity.ERROR for e in mine)
    assert all(e.rule not in ("nonfinite", "grad_norm_spike", "vanished_grad") for e in events)
    w = mine[0].window  # the alert's chart marks the skipped steps of its window: each sampled step from 500 on,
    assert w is not None
    stalled = [s for s in w.steps if s >= 500]
    assert stalled and w.overflow_steps[-len(stalled):] == stalled  # after the periodic ones before 500
    assert set(w.overflow_steps) <= set(w.steps) and len(w.overflow_steps) < len(w.steps) / 5


def test_a_nan_loss_with_the_loss_scaling_cell_is_an_error_at_once():
    events, samples = train(900, nan_at=800)
    nan = [e for e in events if e.rule == "nonfinite"]
    assert [(e.step, e.severity) for e in nan] == [(800, Severity.ERROR)]
    assert next(s for s in samples if s.step == 800).overflow is True  # the cell skipped it too
