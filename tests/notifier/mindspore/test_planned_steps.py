"""The run's length as the job itself knows it (MindSpore's epochs x steps per epoch), where the config declares no
`training.total_steps` (issue 37's "config facts it could know"): a warmup set to the whole run is flagged from
mid-run, an LR decayed to 0 long before the end is an ERROR at its step, and the bot hears the plan with the
heartbeats. Real MindSpore training on the CPU through MonitorCallback."""

from __future__ import annotations

import pytest

pytest.importorskip("mindspore", reason="MindSpore is not installed (pip install msmon[mindspore])")

from notifier import Monitor, Severity, Status  # noqa: E402
from notifier.mindspore import MonitorCallback  # noqa: E402
from notifier.mindspore.callback import _planned_steps  # noqa: E402
from tests.fakes.ms_helpers import dataset, model, regression_data  # noqa: E402

pytestmark = pytest.mark.mindspore

STEPS = 80  # per epoch; 3 epochs


def cfg(**training):
    return {"monitor_config": {"monitor_on": True, "step_interval": 1, "log_interval": 0, "training": training}}


def train(lrs, conf, run):
    x, y = regression_data()
    m, _, _ = model(lr=lrs)
    events = []
    mon = Monitor(conf, run, sinks=[])
    cb = MonitorCallback(None, monitor=mon, on_event=events.append)
    m.train(3, dataset(x, y, 64, STEPS), callbacks=[cb], dataset_sink_mode=False)
    return mon, [(e.step, e.rule, e.severity) for e in events if e.status is Status.FIRING and not e.repeat]


def test_a_warmup_as_long_as_the_run_is_flagged_from_mid_run_with_no_total_declared():
    total = 3 * STEPS
    lrs = [0.002 * (i + 1) for i in range(total)]  # warmup_steps = total steps: the LR rises to the last step
    mon, fired = train(lrs, cfg(), "warmup-total")
    lr = [(s, r, sev) for s, r, sev in fired if r == "lr_schedule"]
    assert lr and lr[0][2] is Severity.WARNING and total // 2 < lr[0][0] <= total // 2 + 2, fired
    assert mon._job_steps == total

    _, clean = train([0.002 * min(i + 1, 20) for i in range(total)], cfg(), "warmup-20")  # a warmup of 20 steps
    assert [f for f in clean if f[1] == "lr_schedule"] == []


def test_an_lr_at_0_long_before_the_end_is_an_error_at_its_step_and_a_declared_total_wins():
    total = 3 * STEPS
    lrs = [0.05] * 60 + [0.05 * (1 - k / 40) for k in range(40)] + [0.0] * (total - 100)  # decay ends at step 100
    _, fired = train(lrs, cfg(), "lr-zero")
    zero = [(s, sev) for s, r, sev in fired if r == "lr_schedule" and sev is Severity.ERROR]
    assert zero and 100 <= zero[0][0] <= 102, fired

    mon, _ = train(lrs, cfg(total_steps=1000), "declared")  # the config's total is the run's, whatever the job says
    assert mon._job_steps is None


@pytest.mark.parametrize(("epochs", "per_epoch", "offset", "want"), [
    (3, 80, 0, 240), (10, 4, 100, 140), (0, 80, 0, None), (3, 0, 0, None), (None, 80, 0, None), ("x", 5, 0, None),
])
def test_the_planned_steps_are_read_from_what_mindspore_says_or_not_at_all(epochs, per_epoch, offset, want):
    class Params:
        epoch_num, batch_num = epochs, per_epoch

    assert _planned_steps(Params(), offset) == want


def test_a_run_context_without_the_counts_gives_no_plan_and_training_goes_on():
    """MindSpore's InternalCallbackParam raises KeyError for a key it was not given (a hand-driven callback)."""
    from mindspore.train.callback._callback import InternalCallbackParam

    assert _planned_steps(InternalCallbackParam(), 0) is None
