"""Issue 13 part 5: a resumed run finds the monitor's state saved next to its checkpoint by itself: MindFormers'
`load_checkpoint` + `resume_training`, or the newest `*.msmon.json` in the checkpoint folder (`resume_from=True`)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
import yaml

pytest.importorskip("mindspore", reason="MindSpore is not installed (pip install msmon[mindspore])")

from notifier import Monitor  # noqa: E402
from notifier.mindspore.callback import MonitorCallback, mindformers_resume, newest_state, state_path  # noqa: E402

SECTION = {"monitor_on": True, "step_interval": 1, "log_interval": 0, "alert": {"baseline_steps": 0}}


def saved_state(ckpt: Path, steps: int, mtime: float | None = None) -> str:
    """The state a run of `steps` steps saved next to `ckpt` (device 0, as the callback's rank here)."""
    mon = Monitor({"monitor_config": SECTION}, "r", sinks=[], device="0")
    for step in range(1, steps + 1):
        mon.step(step, loss=2.0 - step * 1e-3, grad_norm=1.0)
    ckpt.parent.mkdir(parents=True, exist_ok=True)
    path = state_path(ckpt)
    Path(path).write_text(json.dumps(mon.state_dict()))
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def callback(config, **kw) -> MonitorCallback:
    return MonitorCallback(config, "r", device="0", **kw)


def test_resume_from_true_takes_the_newest_state_in_the_checkpoint_dir(tmp_path):
    saved_state(tmp_path / "net-1_100.ckpt", 100, mtime=1_000.0)
    newest = saved_state(tmp_path / "net-1_300.ckpt", 300, mtime=2_000.0)
    assert newest_state(tmp_path) == newest
    cb = callback({"monitor_config": SECTION}, checkpoint_dir=str(tmp_path), resume_from=True)
    assert cb.monitor.last_step == 300


def test_resume_from_true_with_no_state_starts_afresh_and_says_so(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="msmon"):
        cb = callback({"monitor_config": SECTION}, checkpoint_dir=str(tmp_path), resume_from=True)
    assert not cb.monitor.last_step
    assert any("holds no saved monitor state" in r.getMessage() for r in caplog.records)


def test_mindformers_resume_training_from_a_folder_with_rank_subfolders(tmp_path):
    """MindFormers: `load_checkpoint: ./output/checkpoint` + `resume_training: True`: this rank's folder, newest."""
    root = tmp_path / "checkpoint"
    saved_state(root / "rank_0" / "llama_rank_0-2_10.ckpt", 200, mtime=1_000.0)
    saved_state(root / "rank_0" / "llama_rank_0-4_10.ckpt", 400, mtime=2_000.0)
    saved_state(root / "rank_1" / "llama_rank_1-5_10.ckpt", 500, mtime=3_000.0)  # another rank's
    conf = {"monitor_config": SECTION, "load_checkpoint": str(root), "resume_training": True}
    assert callback(conf, checkpoint_dir=str(tmp_path / "new")).monitor.last_step == 400
    # resume_training naming the checkpoint: that one
    conf["resume_training"] = "llama_rank_0-2_10.ckpt"
    assert callback(conf, checkpoint_dir=str(tmp_path / "new")).monitor.last_step == 200


def test_mindformers_yaml_file_with_a_checkpoint_file(tmp_path):
    ckpt = tmp_path / "ckpt" / "model-3_100.ckpt"
    saved_state(ckpt, 150)
    train = tmp_path / "train.yaml"
    train.write_text(yaml.safe_dump({"load_checkpoint": str(ckpt), "resume_training": True,
                                     "monitor_config": SECTION}))
    assert mindformers_resume(str(train), "0") == state_path(ckpt)
    assert callback(str(train), checkpoint_dir=str(tmp_path / "new")).monitor.last_step == 150


def test_no_resume_without_resume_training(tmp_path):
    ckpt = tmp_path / "model.ckpt"
    saved_state(ckpt, 150)
    conf = {"monitor_config": SECTION, "load_checkpoint": str(ckpt)}  # weights only: a fine-tune, not a resume
    assert mindformers_resume(conf, "0") is None
    assert not callback(conf, checkpoint_dir=str(tmp_path)).monitor.last_step
