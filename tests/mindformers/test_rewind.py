"""A rewind inside MindFormers' Trainer loads msmon's health checkpoint into MindFormers' train cell and keeps the
operator's LR scale (MindFormers names the scale parameter by its path, not msmon's name)."""

from __future__ import annotations

import pytest

from tests.mindformers.harness import run_job, yaml_with

pytestmark = [pytest.mark.mindspore]


def test_a_rewind_loads_the_health_checkpoint_and_keeps_the_operator_lr_scale(mf21_python, tmp_path):
    script = [[22, "scale_lr", 0.5], [25, "rewind", 20]]
    config = yaml_with(tmp_path, callbacks=[{"type": "Operator", "script": script}],
                       checkpoint_ring={"enable": True, "every_steps": 10, "keep": 3, "confirm_steps": 2})
    job = run_job(mf21_python, config, tmp_path / "job", steps=40)
    assert "rewind" in job.text and "rewound" in job.text.lower(), job.text[-3000:]
    # the LR MindFormers reports after the rewind (the schedule back at step 20's position) is half the LR it
    # reported at step 21 the first time round: the operator's scale survived the rewind
    lines = [ln for ln in (tmp_path / "job" / "output" / "log" / "rank_0" / "info.log").read_text().splitlines()
             if "step:[" in ln]
    first21 = next(ln for ln in lines if "step:[   21/" in ln)
    after = lines[lines.index(first21) + 5]  # step 26 of MindSpore's count: the first step after the rewind
    lr_first, lr_after = (float(ln.split("lr: ")[1].split(",")[0]) for ln in (first21, after))
    assert 0.45 < lr_after / lr_first < 0.55, (first21, after)
