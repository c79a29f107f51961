"""msmon inside MindFormers' own Trainer (a tiny LLaMA on the CPU), attached by one entry of the training YAML's
callbacks list, on every MindFormers release `make test` builds a venv for (tests/mindformers/harness.py): what msmon
records (loss, LR, grad norm, overflow, loss scale) equals MindFormers' own log line at every step; `scale-lr 0.5`
halves the LR in MindFormers' log line and in msmon's CSV from the next step (MindFormers' train cell reports the LR
of a deep copy of the schedule: msmon gives it the optimizer's own); save-checkpoint writes a checkpoint with msmon's
state next to it; a pause holds the run at its step until its timeout; stop ends the run at that step."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.mindformers.harness import assert_same_as_mindformers, run_job, yaml_with

pytestmark = [pytest.mark.mindspore]


def test_records_equal_mindformers_log_and_scale_lr_save_and_stop_act_on_its_trainer(mf_python, tmp_path):
    script = [[10, "pause", 1.0], [20, "scale_lr", 0.5], [30, "save_checkpoint"], [40, "stop"]]
    config = yaml_with(tmp_path, callbacks=[{"type": "Operator", "script": script}])
    job = run_job(mf_python, config, tmp_path / "job", steps=60)
    assert_same_as_mindformers(job, range(1, 41))  # stop at step 40's boundary: the run ends there
    lr = {s: float(job.log[s]["lr"]) for s in job.log}
    ratios = {s: lr[s] / lr[s - 1] for s in range(7, 41)}  # after the warmup (5 steps)
    assert 0.45 < ratios[21] < 0.55, f"scale-lr 0.5 at step 20 not in MindFormers' LR: {lr[20]} -> {lr[21]}"
    assert all(r > 0.8 for s, r in ratios.items() if s != 21), ratios  # a cosine decay: no other jump
    folder = tmp_path / "job" / "output" / "msmon_checkpoint" / "rank_0"
    ckpts = sorted(folder.glob("*.ckpt"))
    assert len(ckpts) >= 2, list(folder.iterdir())  # save-checkpoint at 30, and stop saves one
    assert all(Path(f"{c}.msmon.json").exists() for c in ckpts)
    assert "MFTrainOneStepCell reports the optimizer's LR instead of its own copy" in job.text
    assert "step 10 device 0] action pause" in job.text and "its 1 s timeout" in job.text  # paused, then went on
