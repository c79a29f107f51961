"""One device-to-host read per sampled step, read at once or a step later (`deferred_read`), on real
MindSpore training (CPU): the counts, the step numbers, the values and the last step."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("mindspore", reason="MindSpore is not installed (pip install msmon[mindspore])")

import mindspore as ms  # noqa: E402
from mindspore import nn  # noqa: E402
from mindspore.train.callback._callback import InternalCallbackParam, RunContext  # noqa: E402

from notifier import Monitor  # noqa: E402
from notifier.mindspore import (  # noqa: E402
    MonitorCallback,
    TrainStepWithGradNorm,
    TrainStepWithGradNormLossScale,
    parse_outputs,
)
from tests.fakes.helpers import ListSink  # noqa: E402
from tests.fakes.ms_helpers import MLP, dataset, regression_data  # noqa: E402

pytestmark = pytest.mark.mindspore  # each test trains a few seconds at most

CELLS = {
    "packed": lambda net, opt: TrainStepWithGradNorm(net, opt),
    "loss_scale": lambda net, opt: TrainStepWithGradNormLossScale(net, opt, ms.Tensor(1024.0, ms.float32)),
    "five_tuple": lambda net, opt: TrainStepWithGradNorm(net, opt, packed=False),
    "loss_only": lambda net, opt: nn.TrainOneStepCell(net, opt),
}


def conf(deferred: bool, interval: int = 1) -> dict:
    return {"monitor_config": {"monitor_on": True, "step_interval": interval, "log_interval": 0,
                               "deferred_read": deferred, "alert": {"baseline_steps": 1000}}}


def train(deferred, cell="packed", steps=30, interval=1, lr=0.05, before=()):
    """A real training of the toy MLP (same seed and data every time); returns (callback, samples)."""
    x, y = regression_data(seed=5)
    ms.set_seed(3)
    net = MLP()
    opt = nn.SGD(net.trainable_params(), learning_rate=lr)
    sink = ListSink()
    cb = MonitorCallback(None, monitor=Monitor(conf(deferred, interval), "reads", sinks=[sink]))
    model = ms.Model(CELLS[cell](nn.WithLossCell(net, nn.MSELoss()), opt))
    model.train(1, dataset(x, y, 256, steps), callbacks=[*before, cb], dataset_sink_mode=False)
    return cb, sink.samples


def rows(samples):
    return [(s.step, s.loss, s.learning_rate, s.grad_norm) for s in samples]


@pytest.mark.parametrize("deferred", [False, True], ids=["immediate", "deferred"])
@pytest.mark.parametrize("cell", ["packed", "loss_scale"])
def test_msmon_train_cells_cost_one_host_read_per_sampled_step(deferred, cell):
    cb, samples = train(deferred, cell, steps=30, interval=3)
    assert [s.step for s in samples] == list(range(3, 31, 3))
    assert cb.reads.count == len(samples) == 10
    assert all(s.loss is not None and s.grad_norm is not None and s.learning_rate == pytest.approx(0.05)
               for s in samples)


def test_deferred_read_reports_the_same_steps_and_values_as_reading_at_once_and_flushes_the_last_step():
    _, at_once = train(False, steps=40)
    cb, later = train(True, steps=40)
    assert [s.step for s in later] == list(range(1, 41))  # step 40's outputs are read at train end
    assert cb.reads.count == 40
    assert rows(later) == rows(at_once)  # the same training, read later: the same floats


@pytest.mark.parametrize("cell, reads_per_step", [("five_tuple", 5), ("loss_only", 2)])
def test_train_cells_without_the_packed_metrics_still_work_in_both_modes(cell, reads_per_step):
    """A user's 5-tuple (loss, overflow, scale, LR, norm read one by one) and a loss alone (the LR of a list from
    the optimizer at the step it belongs to, also when read a step later)."""
    lr = [0.05 - 0.001 * i for i in range(20)]
    _, at_once = train(False, cell, steps=20, lr=lr)
    cb, later = train(True, cell, steps=20, lr=lr)
    assert [s.learning_rate for s in later] == pytest.approx(lr, rel=1e-6)
    assert cb.reads.count == reads_per_step * 20 + (1 if cell == "loss_only" else 0)  # + the list, copied once
    assert rows(later) == rows(at_once)


def test_an_action_at_a_boundary_reads_the_kept_step_first():
    """A pause at step 10 (deferred): step 10 is reported before the pause, so no step time includes it."""
    class PauseAt(ms.train.Callback):
        def on_train_step_end(self, run_context):
            if run_context.original_args().cur_step_num == 10:
                holder[0].pause(timeout=0.5)

    holder: list[MonitorCallback] = []
    x, y = regression_data(seed=5)
    ms.set_seed(3)
    net = MLP()
    opt = nn.SGD(net.trainable_params(), learning_rate=0.05)
    sink = ListSink()
    cb = MonitorCallback(None, monitor=Monitor(conf(True), "pause", sinks=[sink]))
    holder.append(cb)
    ms.Model(TrainStepWithGradNorm(nn.WithLossCell(net, nn.MSELoss()), opt)).train(
        1, dataset(x, y, 256, 20), callbacks=[PauseAt(), cb], dataset_sink_mode=False)
    assert [s.step for s in sink.samples] == list(range(1, 21))
    assert max(s.step_time or 0.0 for s in sink.samples) < 0.4
    assert any(r.action == "resume" for r in cb.control.results)


def test_a_deferred_sample_carries_its_own_step_number_and_end_time():
    """Driven through MindSpore's own RunContext with a fake clock: step k ends at 1000 + k/10 s."""
    sink = ListSink()
    clock = [1000.0]
    cb = MonitorCallback(None, monitor=Monitor(conf(True), "time", sinks=[sink], clock=lambda: clock[0]))
    params = InternalCallbackParam()
    params.update(cur_step_num=0, batch_num=1, dataset_sink_mode=False, optimizer=None, train_network=None,
                  train_dataset=None, train_dataset_element=[ms.Tensor(np.zeros((4, 2), np.float32))],
                  initial_step=0)
    ctx = RunContext(params)
    cb.on_train_begin(ctx)
    for k in range(1, 6):
        clock[0] = 1000.0 + k / 10
        params["cur_step_num"] = k
        metrics = ms.Tensor(np.array([k, 0.01, 10 * k], np.float32))
        params["net_outputs"] = (ms.Tensor(float(k)), ms.Tensor(False), ms.Tensor(1.0), ms.Tensor(0.01),
                                 ms.Tensor(10.0 * k), metrics)
        cb.on_train_step_end(ctx)
    clock[0] = 2000.0  # train end comes much later: the last sample keeps its own end time
    cb.on_train_end(ctx)
    assert [(s.step, s.loss, s.grad_norm) for s in sink.samples] == [(k, k, 10.0 * k) for k in range(1, 6)]
    assert [s.time for s in sink.samples] == pytest.approx([1000.0 + k / 10 for k in range(1, 6)])
    assert [s.step_time for s in sink.samples[1:]] == pytest.approx([0.1] * 4)
    assert cb.reads.count == 5


def test_parse_outputs_reads_the_packed_metrics_of_the_train_cells():
    x, y = regression_data()
    ms.set_seed(11)
    net = MLP()
    opt = nn.SGD(net.trainable_params(), learning_rate=0.01)
    out = TrainStepWithGradNorm(nn.WithLossCell(net, nn.MSELoss()), opt)(ms.Tensor(x[:256]), ms.Tensor(y[:256]))
    assert len(out) == 6 and out[5].shape == (3,) and out[5].dtype == ms.float32
    loss, lr, norm = parse_outputs(out)
    assert (loss, lr, norm) == pytest.approx((float(out[0].asnumpy()), 0.01, float(out[4].asnumpy())), rel=1e-6)
