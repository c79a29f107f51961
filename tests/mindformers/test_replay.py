"""A MindFormers job's own records replayed offline raise what msmon raised live in the job: its log
(log/rank_0/info.log, MFLossMonitor's lines) and its TensorBoard folder (tensorboard_dir/rank_0: MindFormers'
tags, with the `..._vs_samples` twins on a samples axis and the config's text summaries beside them), each read
by `msmon replay` with the job's own msmon settings, on a run with an LR x30 fault (the lr_schedule rule fires);
MindFormers 2.1.0 on MindSpore 2.10.0 and 1.9.0 on 2.9.0."""

from __future__ import annotations

import pytest
import yaml

from msmon.contract.wire import Status
from msmon.offline.readers import read_log
from msmon.offline.replay import run_replay
from tests.mindformers.harness import run_job, yaml_with

pytestmark = [pytest.mark.mindspore, pytest.mark.slow]  # one MindFormers job, about 30 s
FAULT_STEP, STEPS = 30, 60


def test_the_log_and_the_tensorboard_folder_replay_to_the_live_runs_alerts(mf_python, tmp_path):
    config = yaml_with(tmp_path, callbacks=[{"type": "LrFault", "at_step": FAULT_STEP, "factor": 30.0},
                                            {"type": "Operator", "script": []}])
    data = yaml.safe_load(config.read_text())
    data["tensorboard"] = {"tensorboard_dir": str(tmp_path / "tb"), "log_loss_scale_to_tensorboard": True,
                           "log_timers_to_tensorboard": True}
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    job = run_job(mf_python, config, tmp_path / "job", steps=STEPS)
    live = [(e["step"], e["rule"], e["severity"]) for e in job.events if e["status"] == "FIRING"]
    assert live and live[0][:2] == (FAULT_STEP, "lr_schedule"), live  # the fault was seen live

    entry = next(c for c in data["callbacks"] if c.get("type") == "MsmonCallback")  # the job's msmon settings
    settings = {k: v for k, v in entry.items() if k not in ("type", "auto_register", "run_id", "csv")}
    monitor = tmp_path / "monitor.yaml"
    monitor.write_text(yaml.safe_dump({"monitor_config": {"monitor_on": True, **settings}}))
    log = job.out / "output" / "log" / "rank_0" / "info.log"
    tb = tmp_path / "tb" / "rank_0"
    for path, fmt in ((log, "mindformers"), (tb, "tensorboard")):
        result = run_replay(str(path), str(monitor))
        assert result.format == fmt
        assert [(e.step, e.rule, e.severity.value) for e in result.events
                if e.status is Status.FIRING and not e.repeat] == live, path
    assert [r.step for r in read_log(str(tb))] == list(range(1, STEPS + 1))  # not the samples axis
    by_step = {r.step: r for r in read_log(str(log))}
    assert sorted(by_step) == list(range(1, STEPS + 1)) and all(r.loss is not None for r in by_step.values())
