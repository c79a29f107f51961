"""MindFormers' per-rank values (TrainingStateMonitor's device_accum_local_loss and device_local_norm, in each
rank's log and TensorBoard folder) read as the ranks of one run: `msmon replay` makes each rank a device of the
Monitor (per_device_metrics) with its own loss and its own grad norm beside the reduced one. Hostile layouts
too: a folder named rank_.., a missing rank, a truncated file."""

from __future__ import annotations

import logging
import math
import random

import pytest

from msmon.contract.wire import Status
from msmon.offline.readers import ReplayError, read_log
from msmon.offline.replay import run_replay
from tests.fakes import analysis_data as data
from tests.fakes import mindformers_logs as mfl

RANKS = 4
BAD = 2  # the rank with a bad shard: its own loss and norm jump, the printed (reduced) values barely move


def ranks(bad_from: int = 651, bad_for: int = 12) -> list[list[dict]]:
    """Four ranks of one data-parallel run: the printed loss and global norm the same on every rank, each rank's
    own loss and norm near them, rank BAD's 6x its loss and 10x its norm for `bad_for` steps from `bad_from`."""
    base = mfl.steps_from(data.run(800, seed=11))
    out = []
    for rank in range(RANKS):
        rng = random.Random(rank)
        rows = []
        for s in base:
            bad = rank == BAD and bad_from <= s["step"] < bad_from + bad_for
            own = s["loss"] * (1.0 + rng.gauss(0.0, 0.01))
            norm = s["grad_norm"] * math.sqrt(RANKS) * math.exp(rng.gauss(0.0, 0.05))
            rows.append({**s, "local_loss": own * (6.0 if bad else 1.0),
                         "local_grad_norm": norm * (10.0 if bad else 1.0)})
        out.append(rows)
    return out


@pytest.fixture
def cfg(tmp_path):
    return data.monitor_yaml(tmp_path / "monitor.yaml")  # per_device_metrics not set: the ranks make it so


def firing(events):
    return sorted({(e.rule, e.device) for e in events if e.status is Status.FIRING and not e.repeat})


def write_logs(root, per_rank, skip=(), fmt=mfl.STDOUT_FORMAT):
    for rank, steps in enumerate(per_rank):
        if rank not in skip:
            mfl.write(root / "msrun_log" / f"worker_{rank}.log",
                      mfl.current_lines(steps, steps_per_epoch=400, epochs=2, fmt=fmt, state=True))


def test_each_ranks_own_loss_and_norm_are_read_from_its_log(tmp_path):
    per_rank = ranks()
    write_logs(tmp_path / "out", per_rank)
    rows = list(read_log(str(tmp_path / "out")))
    assert len(rows) == RANKS * 800  # TrainingStateMonitor's lines join MFLossMonitor's record of the step
    by = {(r.device, r.step): r for r in rows}
    for rank in range(RANKS):
        for s in per_rank[rank][::50]:
            r = by[(str(rank), s["step"])]
            assert r.loss == pytest.approx(s["loss"], abs=5e-4) and r.grad_norm == pytest.approx(s["grad_norm"])
            assert r.local_loss == pytest.approx(s["local_loss"], abs=5e-5)  # %.4f
            assert r.local_grad_norm == pytest.approx(s["local_grad_norm"], abs=5e-5)
            assert r.throughput == pytest.approx(s["throughput"], abs=1e-5)  # the progress line still found


def test_replay_makes_each_rank_a_device_and_names_the_bad_shard(tmp_path, cfg):
    write_logs(tmp_path / "out", ranks())
    result = run_replay(str(tmp_path / "out"), cfg)
    assert set(result.curves) == {"0", "1", "2", "3"} and result.monitor.config.per_device_metrics
    fired = firing(result.events)
    assert ("loss_spike", str(BAD)) in fired
    assert {dev for rule, dev in fired if rule == "loss_spike"} == {str(BAD)}  # the others' own losses are calm
    recent = result.monitor._devices[str(BAD)].recent
    assert recent and all(s.local_grad_norm is not None for s in recent)  # beside the reduced norm
    assert all(s.grad_norm is not None for s in recent)


@pytest.mark.slow  # about 17 s on two cores
def test_the_same_ranks_from_tensorboard_folders(tmp_path, cfg):
    per_rank = ranks()
    for rank, steps in enumerate(per_rank):
        mfl.write_tensorboard(tmp_path / "tb", steps, rank)
    rows = list(read_log(str(tmp_path / "tb")))
    assert {r.device for r in rows} == {"0", "1", "2", "3"}
    one = {r.step: r for r in rows if r.device == str(BAD)}
    assert one[655].local_grad_norm == pytest.approx(per_rank[BAD][654]["local_grad_norm"], rel=1e-6)
    assert one[655].local_loss == pytest.approx(per_rank[BAD][654]["local_loss"], rel=1e-6)
    result = run_replay(str(tmp_path / "tb"), cfg)
    assert {dev for rule, dev in firing(result.events) if rule == "loss_spike"} == {str(BAD)}


def test_state_lines_without_a_printed_step_are_records_of_their_own(tmp_path):
    """TrainingStateMonitor at every step, MFLossMonitor every 10th: the other steps still carry the rank's values;
    and its line before MFLossMonitor's of the same step is one record."""
    steps = ranks()[0][:40]
    lines = []
    for s in steps:
        epoch, step = (s["step"] - 1) // 400 + 1, (s["step"] - 1) % 400 + 1
        state = [mfl.prefixed(mfl.STATE % (epoch, 2, step, 400, tag, s[key]), s["time"], func="_to_log")
                 for key, tag in mfl.STATE_TAGS]
        printed = mfl.current_lines([s], steps_per_epoch=400, epochs=2) if s["step"] % 10 == 0 else []
        lines += state + printed  # the state lines first
    rows = list(read_log(mfl.write(tmp_path / "worker_0.log", lines)))
    assert [r.step for r in rows] == [s["step"] for s in steps]
    for r, s in zip(rows, steps, strict=True):
        assert r.local_grad_norm == pytest.approx(s["local_grad_norm"], abs=5e-5)
        assert (r.loss is not None) is (s["step"] % 10 == 0)


def test_a_folder_named_rank_dotdot_is_not_a_rank(tmp_path, cfg, caplog):
    per_rank = ranks()[:2]
    for rank, steps in enumerate(per_rank):
        mfl.write(tmp_path / "out" / "log" / f"rank_{rank}" / "info.log",
                  mfl.current_lines(steps[:30], steps_per_epoch=400, epochs=2, fmt=mfl.FILE_FORMAT, state=True))
    mfl.write(tmp_path / "out" / "log" / "rank_.." / "info.log",  # job data, not a rank number
              mfl.current_lines(per_rank[0][:30], steps_per_epoch=400, epochs=2, fmt=mfl.FILE_FORMAT))
    mfl.write(tmp_path / "out" / "log" / "rank_..x" / "x" / "info.log", [])
    rows = list(read_log(str(tmp_path / "out")))
    assert {r.device for r in rows} == {"0", "1"}
    for rank, steps in enumerate(per_rank):
        mfl.write_tensorboard(tmp_path / "tb", steps[:30], rank)
    mfl.write_tensorboard(tmp_path / "tb" / "rank_..", per_rank[0][:30], 0)  # tb/rank_../rank_0
    with pytest.raises(ReplayError, match="not one run's device_N folders"):
        list(read_log(str(tmp_path / "tb")))


def test_a_missing_rank_is_said_and_the_others_replay(tmp_path, cfg, caplog):
    write_logs(tmp_path / "out", ranks(), skip=(1,))
    with caplog.at_level(logging.WARNING, logger="msmon.offline.readers"):
        result = run_replay(str(tmp_path / "out"), cfg)
    assert set(result.curves) == {"0", "2", "3"}
    notes = [r.getMessage() for r in caplog.records if r.name == "msmon.offline.readers"]
    assert any("logs of 3 ranks, none of rank(s) 1: those are not replayed" in n for n in notes), notes
    assert ("loss_spike", str(BAD)) in firing(result.events)


def test_a_truncated_log_keeps_what_it_holds_and_says_what_is_cut(tmp_path, caplog):
    per_rank = ranks()
    write_logs(tmp_path / "out", per_rank[:2])
    path = tmp_path / "out" / "msrun_log" / "worker_1.log"
    text = path.read_text(encoding="utf-8")
    cut = text.rindex("device_local_norm: ") + len("device_local_norm: ") + 2  # mid-number, no newline: killed rank
    path.write_text(text[:cut], encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="msmon.offline.readers"):
        rows = list(read_log(str(tmp_path / "out")))
    last = [r for r in rows if r.device == "1"][-1]
    assert last.step == 800 and last.local_loss is not None and last.local_grad_norm is None
    assert len([r for r in rows if r.device == "0"]) == 800
    notes = " ".join(r.getMessage() for r in caplog.records)
    assert "worker_1.log" in notes and "device_local_norm" in notes and "read as missing" in notes


def test_backtest_scores_a_multi_rank_trace_with_each_rank_a_device(tmp_path, cfg):
    from msmon.offline.backtest.engine import Label, replay_config, run_trace

    write_logs(tmp_path / "out", ranks())
    rows = list(read_log(str(tmp_path / "out")))
    result = run_trace(Label(trace="four-ranks", kind="training", fault_step=651, format="mindformers"), rows,
                       replay_config(cfg))
    assert result.detection is not None and result.detection.device == str(BAD)
    assert {a.device for a in result.alerts if a.rule == "loss_spike"} == {str(BAD)}
