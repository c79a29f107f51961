"""The detection corpus of issue 37 (bench/corpus/): its generator trains real MindSpore runs and labels them where
the trace shows the fault, in the log's own step numbers (micro-steps, sink rows); its scorer replays them through
the backtest's engine and agrees with `msmon replay`."""

from __future__ import annotations

import csv
import dataclasses
import math
from pathlib import Path

import pytest

from msmon.offline.backtest.engine import alerts_of
from msmon.offline.readers import read_csv


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four short runs, trained for real: an unannounced LR x10 under accumulation 4 logged per micro-step, a NaN
    under sink-mode logging (every 2nd step, with gaps), a clean warmup + cosine run under accumulation 2, and a
    loader that serves the same 4 optimizer steps' batches from step 640 on (accumulation 2, per micro-step)."""
    pytest.importorskip("mindspore", reason="MindSpore is not installed (pip install msmon[mindspore])")
    from bench.corpus import gen

    out = tmp_path_factory.mktemp("corpus")
    base = gen.spec_for(0)
    common = {"extra": "none", "loss_scale": False, "optimizer": "adam", "peak_lr": 5e-3, "width": 16}
    specs = [
        dataclasses.replace(base, index=1, fault="lr_jump", schedule="constant", accum=4, logging="micro",
                            log_every=1, opt_steps=160, warmup=0, fault_opt=120, fault_param=10.0, **common),
        dataclasses.replace(base, index=2, fault="nan", schedule="constant", accum=1, logging="sink", log_every=2,
                            opt_steps=150, warmup=0, fault_opt=101, fault_param=0.0, **common),
        dataclasses.replace(base, index=3, fault="clean", schedule="warmup_cosine", accum=2, logging="opt",
                            log_every=1, opt_steps=150, warmup=20, fault_opt=None, fault_param=0.0, **common),
        dataclasses.replace(base, index=4, fault="data_repeat", schedule="constant", accum=2, logging="micro",
                            log_every=1, opt_steps=900, warmup=0, fault_opt=640, fault_param=0.0,
                            **{**common, "optimizer": "sgd_momentum", "peak_lr": 0.6, "width": 32}),
    ]
    for spec in specs:
        gen.generate_one(spec, out)
    gen.write_index(out, gen.read_records(out))
    return out


def manifest(corpus: Path) -> dict[str, dict[str, str]]:
    with open(corpus / "manifest.csv", newline="", encoding="utf-8") as f:
        return {r["fault"]: r for r in csv.DictReader(f)}


@pytest.mark.mindspore
def test_an_lr_jump_logged_per_micro_step_is_labelled_at_its_optimizer_steps_first_row(corpus: Path) -> None:
    run = manifest(corpus)["lr_jump"]
    rows = list(read_csv(str(corpus / "runs" / f"{run['run']}.csv")))
    assert [r.step for r in rows] == list(range(1, 160 * 4 + 1))  # one row per micro-step
    fault = int(run["fault_step"])
    assert fault == (120 - 1) * 4 + 1 and run["fault_opt_step"] == "120"
    by_step = {r.step: r for r in rows}
    assert by_step[fault].lr == pytest.approx(10 * by_step[fault - 1].lr, rel=1e-5)  # the jump is at that row
    assert all(by_step[s].lr == by_step[fault - 1].lr for s in range(1, fault))
    group = [by_step[s] for s in range(fault, fault + 4)]  # one optimizer step: LR and grad norm repeat,
    assert len({r.grad_norm for r in group}) == 1 and len({r.loss for r in group}) == 4  # each micro-batch's loss
    assert run["decl_grad_accumulation_steps"] == "4" and run["kind"] == "training"
    assert rows[-1].loss < rows[0].loss  # it learned before the jump


@pytest.mark.mindspore
def test_a_nan_under_sink_logging_is_labelled_at_the_first_logged_row_from_its_step(corpus: Path) -> None:
    run = manifest(corpus)["nan"]
    rows = list(read_csv(str(corpus / "runs" / f"{run['run']}.csv")))
    steps = [r.step for r in rows]
    assert all(s % 2 == 0 for s in steps) and len(steps) < 75  # every 2nd step, some missing
    fault = int(run["fault_step"])
    assert fault == min(s for s in steps if s >= 101)
    assert all(math.isfinite(r.loss) for r in rows if r.step < 101)
    assert math.isnan(next(r.loss for r in rows if r.step == fault))
    assert run["diverge_step"] == str(fault)  # the divergence rule: a NaN at once
    assert steps[-1] <= 101 + 6  # the run stopped a few steps after


@pytest.mark.mindspore
def test_a_loader_repeating_its_batches_is_a_loss_collapse_after_it_starts_and_nothing_before(corpus: Path) -> None:
    """The model memorizes the 4 repeated steps' batches: the loss falls far below the level it had settled at,
    which learning never does that fast. `loss_collapse` says so as a WARNING, at step interval 1 and 10 (the
    Monitor reads the micro-step log as accumulation 2 and judges optimizer steps); nothing fires before."""
    from bench.corpus import score

    run = manifest(corpus)["data_repeat"]
    rows = list(read_csv(str(corpus / "runs" / f"{run['run']}.csv")))
    before = [r.loss for r in rows if 2 * 560 <= r.step < 2 * 639]
    after = [r.loss for r in rows if r.step > rows[-1].step - 40]
    assert sorted(after)[len(after) // 2] < sorted(before)[len(before) // 2] / 3  # memorized: a third, or less
    for si in (1, 10):
        cfg = score.config_file(score.DEFAULT_CONFIG, si, None, corpus)
        sc, _ = score.score_run(run, rows, cfg, si)
        assert sc.false_episodes == [], (si, sc.false_episodes)
        d = sc.result.detection
        assert d is not None and d.rule == "loss_collapse" and d.severity.value == "WARNING", (si, d)
        assert 640 <= d.step <= 640 + 20 * si + 40, (si, d)  # judged a block of 10 samples at a time


@pytest.mark.mindspore
def test_the_scorer_agrees_with_msmon_replay_and_counts_in_optimizer_steps(corpus: Path) -> None:
    from bench.corpus import score

    runs = {r["fault"]: r for r in score.read_manifest(corpus)}
    cfg = score.config_file(score.DEFAULT_CONFIG, 1, None, corpus)
    clean = runs["clean"]
    assert clean["kind"] == "clean" and clean["fault_step"] == "" and clean["split"] in ("tune", "heldout")
    for run in runs.values():
        trace = corpus / "runs" / f"{run['run']}.csv"
        sc, events = score.score_run(run, list(read_csv(str(trace))), cfg, 1)
        assert score.cli_alerts(trace, cfg) == alerts_of(events)  # `msmon replay` raises what the engine scored
        if run["fault"] == "clean":
            assert sc.clean_opt_steps == 150 and sc.lag is None
        else:
            assert sc.clean_opt_steps == int(run["fault_opt_step"]) - 1
        if run["fault"] == "nan":  # nonfinite speaks at the first NaN row: 0 or 1 optimizer step after the fault
            assert sc.result.detection is not None and 0 <= (sc.lag or 0) <= 1
        if run["fault"] == "lr_jump" and sc.result.detection is not None:
            assert sc.lag is not None and sc.lag >= 0
            assert sc.result.detection.step == 120 + sc.lag  # micro-steps counted as optimizer steps
    assert score.main([str(corpus), "--step-interval", "1", "10", "--format", "markdown"]) == 0
