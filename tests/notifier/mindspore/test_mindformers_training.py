"""A real MindSpore CPU training configured by a MindFormers training YAML: `check_for_global_norm: True` with a
threshold makes msmon's grad_norm rule page at the very step the grad norm reaches it, the step at which
MindFormers itself would stop the run."""

from __future__ import annotations

import logging

import numpy as np
import pytest

pytest.importorskip("mindspore", reason="MindSpore is not installed (pip install msmon[mindspore])")

import mindspore as ms  # noqa: E402

from notifier import Severity, Status  # noqa: E402
from notifier.mindspore import MonitorCallback, parse_outputs  # noqa: E402
from tests.fakes.ms_helpers import dataset, model, regression_data  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.mindspore]

THRESHOLD = 2.0  # above the toy job's first-step norm (~1.3): MindFormers checks from step 1

TRAIN_YAML = f"""\
seed: 0
output_dir: './output'
run_mode: 'train'
runner_config:
  epochs: 1
  batch_size: 256
  sink_mode: False
monitor_config:
  monitor_on: True
  dump_path: './dump'
  step_interval: 1
  local_loss_format: log
  check_for_global_norm: True
  global_norm_spike_threshold: {THRESHOLD}
  global_norm_spike_count_threshold: 10
callbacks:
  - type: MFLossMonitor
    per_print_times: 1
"""


class GradNorms(ms.train.Callback):
    """The grad norm of every step, read from the train cell's outputs as MindFormers' callback reads it."""

    def __init__(self) -> None:
        super().__init__()
        self.by_step: dict[int, float] = {}

    def on_train_step_end(self, run_context):
        c = run_context.original_args()
        self.by_step[int(c.cur_step_num)] = parse_outputs(c.net_outputs)[2]


def test_a_grad_norm_spike_above_mindformers_threshold_is_an_error_at_that_step(tmp_path, caplog):
    path = tmp_path / "train.yaml"
    path.write_text(TRAIN_YAML)
    x, y = regression_data()
    m, _, _ = model(lr=[0.05] * 300 + [0.2] * 120)  # the LR jumps x4 at step 300: the grad norm explodes
    events = []
    caplog.set_level(logging.INFO, logger="msmon")
    cb = MonitorCallback(str(path), run_id="mf-gnorm", on_event=events.append, checkpoint_dir=str(tmp_path))
    norms = GradNorms()
    m.train(1, dataset(x, y, 256, 420), callbacks=[norms, cb], dataset_sink_mode=False)

    over = [s for s, g in sorted(norms.by_step.items()) if g >= THRESHOLD]
    assert over and over[0] > 300, (over[:3], max(norms.by_step.values()))
    assert max(g for s, g in norms.by_step.items() if s < over[0]) < THRESHOLD
    errors = [e for e in events if e.rule == "grad_norm" and e.severity is Severity.ERROR
              and e.status is Status.FIRING and not e.repeat]
    assert errors, [(e.step, e.rule, e.severity) for e in events]
    first = errors[0]
    assert first.step == over[0]  # the step MindFormers would stop at: msmon has paged by then
    assert first.threshold == THRESHOLD and first.value == pytest.approx(norms.by_step[over[0]])
    assert "MindFormers monitor_config.global_norm_spike_threshold: 2.0 -> ERROR level of msmon's grad_norm rule" \
        in caplog.text  # the start-up summary says how the key was taken
    assert float(np.median([norms.by_step[s] for s in range(250, 300)])) < THRESHOLD / 4  # a spike, not noise
