"""An LR x30 fault inside MindFormers' Trainer (a runtime change of the optimizer's schedule, announced to nobody) is
alerted before the loss diverges, on 3 seeds, and the same runs without the fault raise no ERROR. Before msmon gave
MindFormers' train cell the optimizer's own schedule, the cell's deep copy hid the jump from msmon's lr_schedule
rule (and from MindFormers' own log line)."""

from __future__ import annotations

import pytest

from tests.mindformers.harness import Job, assert_same_as_mindformers, run_job, yaml_with

pytestmark = [pytest.mark.mindspore, pytest.mark.slow]

FAULT_STEP, FAULT_STEPS = 30, 60


def _diverged(job: Job) -> int | None:
    """The first step from the fault on whose loss is above every loss of the 10 steps before it."""
    before = max(float(job.log[s]["loss"]) for s in range(FAULT_STEP - 10, FAULT_STEP))
    return next((s for s in range(FAULT_STEP, FAULT_STEPS + 1) if float(job.log[s]["loss"]) > before), None)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_an_lr_x30_fault_is_alerted_before_the_loss_diverges(mf21_python, tmp_path, seed):
    fault = yaml_with(tmp_path, callbacks=[{"type": "LrFault", "at_step": FAULT_STEP, "factor": 30.0},
                                           {"type": "Operator", "script": []}])
    job = run_job(mf21_python, fault, tmp_path / "fault", steps=FAULT_STEPS, seed=seed)
    assert_same_as_mindformers(job, range(1, FAULT_STEPS + 1))  # the LR x30 is in MindFormers' line and msmon's
    diverged = _diverged(job)
    assert diverged is not None, "the fault did not make the loss diverge: the test would prove nothing"
    alerts = [e for e in job.events if e["status"] == "FIRING" and e["step"] >= FAULT_STEP]
    assert alerts, f"no alert after the LR x30 at step {FAULT_STEP} (loss diverged at {diverged})"
    assert alerts[0]["step"] < diverged, (alerts[0], diverged)
    assert alerts[0]["rule"] == "lr_schedule", alerts[0]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_same_run_without_the_fault_raises_no_error(mf21_python, tmp_path, seed):
    clean = yaml_with(tmp_path, callbacks=[{"type": "Operator", "script": []}])
    job = run_job(mf21_python, clean, tmp_path / "clean", steps=FAULT_STEPS, seed=seed)
    errors = [e for e in job.events if e["severity"] == "ERROR" and e["status"] == "FIRING"]
    assert not errors, errors
