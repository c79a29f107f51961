"""A real MindSpore CPU training resumed from a checkpoint carries the monitor's state saved next to it: no new
blind period (a wrong LR after the resume is caught at once) and an alert firing at the checkpoint is not
raised again as new."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytest.importorskip("mindspore", reason="MindSpore is not installed (pip install msmon[mindspore])")

import mindspore as ms  # noqa: E402

from notifier import Monitor, Status  # noqa: E402
from notifier.mindspore import MonitorCallback  # noqa: E402
from tests.fakes.ms_helpers import dataset, model, regression_data  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.mindspore]

PER_EPOCH = 10
CONF = {"monitor_config": {"monitor_on": True, "step_interval": 1, "log_interval": 0,
                           "alert": {"baseline_steps": 100}}}


class StopAt(ms.train.Callback):
    def __init__(self, cb: MonitorCallback, step: int) -> None:
        super().__init__()
        self.cb, self.step = cb, step

    def on_train_step_end(self, run_context):
        if run_context.original_args().cur_step_num == self.step:
            self.cb.stop()  # writes a checkpoint (and the monitor's state next to it), then ends training


def train(lr, first: int, last: int, *, checkpoint=None, resume=True, stop=None, tmp_path):
    """Steps first..last (whole epochs of PER_EPOCH) at `lr`, from `checkpoint`'s weights when given; the
    events and the checkpoint written at `stop`."""
    x, y = regression_data()
    m, net, _ = model(lr=lr)
    if checkpoint is not None:
        ms.load_param_into_net(net, ms.load_checkpoint(checkpoint))
    events = []
    cb = MonitorCallback(None, monitor=Monitor(CONF, "resumed", sinks=[]), on_event=events.append,
                         checkpoint_dir=str(tmp_path), resume_from=checkpoint if resume else None)
    callbacks = [cb] if stop is None else [StopAt(cb, stop), cb]
    m.train(last // PER_EPOCH, dataset(x, y, 256, PER_EPOCH), callbacks=callbacks, dataset_sink_mode=False,
            initial_epoch=(first - 1) // PER_EPOCH)
    saved = [r.path for r in cb.control.results if r.action == "stop"]
    return events, saved[0] if saved else None


def new_alerts(events, rule="grad_norm_spike"):
    return [e.step for e in events if e.rule == rule and e.status is Status.FIRING and not e.repeat]


def test_a_resume_with_the_state_is_not_blind_and_does_not_raise_a_firing_alert_again(tmp_path):
    events, ckpt = train(0.05, 1, 400, stop=300, tmp_path=tmp_path)
    assert new_alerts(events) == [] and ckpt is not None
    state = json.loads(Path(ckpt + ".msmon.json").read_text(encoding="utf-8"))
    assert state["format"] == "msmon.monitor.state" and not os.path.exists(ckpt + ".msmon.json.tmp")

    # the resume comes back with 4x the LR: with the state the grad norm's climb is caught as it starts...
    events, ckpt2 = train(0.2, 301, 400, checkpoint=ckpt, stop=330, tmp_path=tmp_path)
    caught = new_alerts(events)
    assert caught and 301 <= caught[0] <= 325
    # ...without it the monitor starts from an empty window, numbers the steps from 1, and is no sooner
    fresh, _ = train(0.2, 301, 330, checkpoint=ckpt, resume=False, tmp_path=tmp_path)
    assert not new_alerts(fresh) or new_alerts(fresh)[0] >= caught[0] - 300

    # resumed again while the alert fires: it goes on firing, and is not raised again as new
    events, _ = train(0.2, 331, 360, checkpoint=ckpt2, tmp_path=tmp_path)
    assert new_alerts(events) == []


def test_a_missing_or_damaged_state_is_logged_and_training_goes_on(tmp_path, caplog):
    events, ckpt = train(0.05, 1, 60, stop=50, tmp_path=tmp_path)
    with open(ckpt + ".msmon.json", "w", encoding="utf-8") as f:
        f.write('{"format": "msmon.monitor.state", "version": 0}')
    events, _ = train(0.05, 51, 60, checkpoint=ckpt, tmp_path=tmp_path)
    assert "resumes without the monitor's saved state" in caplog.text and "version 0" in caplog.text
    os.remove(ckpt + ".msmon.json")
    train(0.05, 51, 60, checkpoint=ckpt, tmp_path=tmp_path)
    assert "No such file" in caplog.text
