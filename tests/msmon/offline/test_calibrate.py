"""`msmon calibrate`: thresholds from a healthy baseline, written as a monitor_config fragment that loads,
keeps the baseline quiet and catches what comes after it."""

from __future__ import annotations

import math
import re

import pytest
import yaml

from msmon.cli.main import main
from msmon.contract.wire import Status
from msmon.offline.calibrate import CalibrationError, _scalar, calibrate, find_warmup
from msmon.offline.readers import Row, read_log
from msmon.offline.replay import replay, replay_monitor
from msmon.offline.stats import detrended_sigma, sustained_max
from notifier.config import load_config
from tests.conftest import ROOT
from tests.fakes import analysis_data as data


def rows_of(records):
    return [Row(step=r["step"], loss=r["loss"], lr=r["learning_rate"], grad_norm=r["grad_norm"],
                throughput=r["tokens_per_s"], time=r["time"]) for r in records]


def alerts(cfg, rows):
    events = replay(rows, replay_monitor(cfg, "check"))
    return [(e.step, e.rule, e.severity.value) for e in events if e.status is Status.FIRING and not e.repeat]


@pytest.fixture(scope="module")
def healthy():
    return data.run(2500, seed=11)


@pytest.fixture
def thresholds(tmp_path, healthy, capsys):
    """The CLI run a user makes: msmon calibrate BASELINE --out thresholds.yaml."""
    log = data.write_csv(tmp_path / "baseline.csv", healthy)
    out = tmp_path / "thresholds.yaml"
    assert main(["calibrate", log, "--steps", "1000", "--out", str(out)]) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert printed.startswith(f"wrote {out}:\n  msmon calibrate: thresholds measured on {log}, steps 0-999 (1000 "
                              "sampled steps at step_interval 1); the LR warms up from 1.5e-06 to 0.0003 by step 199.")
    assert "Check: the baseline replayed through this fragment by msmon's Monitor raises no alert." in printed
    return out


def test_the_fragment_loads_and_has_per_phase_levels(thresholds):
    cfg = load_config(str(thresholds))
    rules = cfg.alert.rules
    assert rules.loss_spike.warning is not None and rules.loss_spike.warning >= 3.0
    assert rules.loss_spike.error == 2 * rules.loss_spike.warning
    assert 0 < rules.loss_spike.min_fluctuation < 0.016  # below the baseline's own 1.5% noise
    assert rules.grad_norm.error is not None and 1.0 < rules.grad_norm.warning < 3.0  # grad norm ~0.9, tail ~1.1
    assert rules.grad_norm_spike.warning is not None and rules.throughput_drop.warning is not None
    [warmup] = cfg.alert.phases
    assert (warmup.name, warmup.start_step, warmup.end_step) == ("warmup", 0, 199)
    assert warmup.rules["loss_spike"]["warning"] >= 2 * rules.loss_spike.warning
    assert cfg.training.warmup_steps == 199


def test_every_number_is_explained(thresholds):
    text = thresholds.read_text()
    numbers = [ln for ln in text.splitlines() if re.search(r":\s*-?[0-9.]+(e-?[0-9]+)?(\s|$)", ln)
               and not ln.lstrip().startswith("#")]
    assert len(numbers) >= 15
    unexplained = [ln for ln in numbers if "  # " not in ln and not ln.strip().startswith(("start_step", "- name"))]
    assert unexplained == []
    assert "the baseline's largest rise held 3 samples in a row was" in text
    assert "stable range 1" in text and "tokens/s (5th-95th percentile)" in text


def test_quiet_on_the_baseline_and_the_clean_run_catches_an_injected_spike(thresholds, healthy):
    cfg = load_config(str(thresholds))
    assert alerts(cfg, rows_of(healthy)) == []  # the baseline, and 1500 healthy steps after it
    # A rise of 5 normal fluctuations (0.15 on a loss of 1.85, noise 0.03) for 20 steps after the baseline:
    # the defaults (3 sigma) catch it too, the calibrated levels must not have gone blind.
    spiked = data.run(2500, seed=11, loss_jump=(1800, 20, 0.15), grad_jump=(2200, 4, 4.0))
    got = alerts(cfg, rows_of(spiked))
    assert [a for a in got if a[1] == "loss_spike"][0][0] in range(1800, 1806)
    assert any(a[1] == "grad_norm" and 2200 <= a[0] < 2204 for a in got)  # 4x the grad norm: ~3.6, over 2x p99
    assert all(a[0] >= 1800 for a in got)


def test_calibrated_levels_catch_the_demo_creep_before_the_loss_spike(tmp_path, capsys):
    """The demo's 13B incident: calibrated on its first 1000 healthy steps, the absolute grad-norm level fires
    while the grad norm creeps, well before the default 10.0 (step 2410) and the loss spike (2400)."""
    from msmon.demo.trace import SPIKE_STEP, make_trace

    trace = make_trace(str(tmp_path / "incident.csv"))
    out = tmp_path / "th.yaml"
    assert main(["calibrate", trace, "--out", str(out)]) == 0
    got = alerts(load_config(str(out)), list(read_log(trace)))
    first_grad = min(a[0] for a in got if a[1] == "grad_norm")
    assert first_grad < SPIKE_STEP - 100
    assert all(a[0] > 2100 for a in got)  # nothing before the incident starts (creep from 2160)


def test_stdout_output_and_config_sampling(tmp_path, healthy, capsys):
    log = data.write_csv(tmp_path / "baseline.csv", healthy)
    base = tmp_path / "base.yaml"
    base.write_text("monitor_config:\n  monitor_on: true\n  step_interval: 5\n  log_interval: 100\n"
                    "  alert:\n    rules:\n      loss_spike: {window: 50}\n")
    assert main(["calibrate", log, "--steps", "2000", "--config", str(base)]) == 0
    text = capsys.readouterr().out
    frag = yaml.safe_load(text)["monitor_config"]
    assert frag["step_interval"] == 5 and frag["alert"]["rules"]["loss_spike"]["window"] == 50
    assert "(400 sampled steps at step_interval 5)" in text
    load_config(yaml.safe_load(text))


# -- refusals ---------------------------------------------------------------------------------------


def test_too_short(tmp_path, healthy, capsys):
    log = data.write_csv(tmp_path / "b.csv", healthy)
    assert main(["calibrate", log, "--steps", "150"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"msmon calibrate: cannot calibrate from {log} (steps 0-149, step_interval 1): too short: "
                          "150 sampled steps with a loss; calibration needs at least 200 (twice the loss_spike window "
                          "of 100 samples). Give a longer baseline (--steps)")
    assert main(["calibrate", log, "--steps", "300"]) == 0  # 101 sampled steps after the warmup: enough
    capsys.readouterr()
    assert main(["calibrate", log, "--steps", "250"]) == 1
    assert "too short after the warmup: the LR warms up from 1.5e-06 to 0.0003 by step 199, leaving 51 sampled " \
           "steps; calibration needs at least 100 after it" in capsys.readouterr().err


def test_too_noisy(tmp_path, capsys):
    log = data.write_csv(tmp_path / "noisy.csv", data.run(1200, noise=0.4))
    assert main(["calibrate", log]) == 1
    err = capsys.readouterr().err
    assert "too noisy: the loss's normal fluctuation is 2" in err and "% of its level (more than 10%)" in err


def test_the_trend_dominates(tmp_path, capsys):
    records = data.run(1200, noise=0.003)
    for r in records:
        r["loss"] = 4.0 - 0.002 * r["step"] + (r["loss"] - 1.85 - 0.55 * math.exp(-r["step"] / 300.0))
        r["learning_rate"] = 3e-4
    log = data.write_csv(tmp_path / "falling.csv", records)
    assert main(["calibrate", log]) == 1
    err = capsys.readouterr().err
    assert "the trend dominates: the loss moves from 3.96 to 2 over the baseline, so its spread over the rule's " \
           "100-sample window is 2" in err and "x its step-to-step noise (0.003" in err
    assert "Calibrate from a flatter stretch (--start STEP" in err


def test_missing_metrics_keep_their_defaults(tmp_path, capsys):
    p = tmp_path / "loss-only.csv"
    p.write_text("step,loss\n" + "".join(f"{r['step']},{r['loss']}\n" for r in data.run(1000)))
    assert main(["calibrate", str(p)]) == 0
    text = capsys.readouterr().out
    assert "# Left at its defaults: grad_norm, grad_norm_spike: no grad norm in the log.\n" \
           "# Left at its defaults: throughput_drop: no throughput or timestamps in the log.\n" in text
    rules = yaml.safe_load(text)["monitor_config"]["alert"]["rules"]
    assert set(rules) == {"loss_spike"}


def test_too_few_throughput_spans_is_said(tmp_path, capsys):
    """Steps of 0.1 s: 1000 steps are 10 spans of 10 s, fewer than the rule learns from before judging."""
    records = data.run(1000)
    for r in records:
        r["time"] = 1000.0 + 0.1 * r["step"]
        r["tokens_per_s"] = ""
    assert main(["calibrate", data.write_csv(tmp_path / "fast.csv", records)]) == 0
    text = capsys.readouterr().out
    assert "# Left at its defaults: throughput_drop: 0 of its spans of 10 s of training judged after the warmup, 10 " \
           "needed (it learns from the first 20 before judging; the baseline holds 9): give a longer baseline " \
           "(--steps).\n" in text


def test_bad_input_is_exit_2(tmp_path, capsys):
    p = tmp_path / "x.csv"
    p.write_text("step,loss\n0,1\n0,1\n")
    assert main(["calibrate", str(p)]) == 2
    assert "x.csv:3: step 0 is repeated" in capsys.readouterr().err


# -- pieces -------------------------------------------------------------------------------------------


def test_sustained_max_is_what_consecutive_samples_reach():
    assert sustained_max([0, 5, 1, 4, 4, 4, 0], 3) == 4
    assert sustained_max([0, 5, 1, 4, 4, 4, 0], 1) == 5
    assert sustained_max([1, 2], 3) == -math.inf


def test_detrended_sigma_ignores_a_trend():
    import random

    rng = random.Random(0)
    noise = [rng.gauss(0, 0.1) for _ in range(2000)]
    trend = [x - 0.01 * i for i, x in enumerate(noise)]
    assert detrended_sigma(noise, 20) == pytest.approx(0.1, rel=0.15)
    assert detrended_sigma(trend, 20) == pytest.approx(0.1, rel=0.15)


def test_warmup_from_the_lr_else_from_the_loss():
    from msmon.offline.calibrate import _samples

    rows = rows_of(data.run(1000))
    assert find_warmup(list(_samples(rows)))[0] == 199
    no_lr = [Row(step=r.step, loss=r.loss) for r in rows]
    end, how = find_warmup(list(_samples(no_lr)))
    assert end is not None and 100 < end < 600 and how.startswith("no LR in the log; the loss falls fast until step")
    flat = [Row(step=r.step, loss=2.0 + 0.01 * ((r.step * 7) % 5), lr=1e-4) for r in rows]
    assert find_warmup(list(_samples(flat))) == (None, "the LR starts at 0.0001, near its peak 0.0001: no warmup")


def test_yaml_floats_stay_floats():
    for v in (1e-05, 0.004, 2.0, 1.5e20, 0.30000000000000004):
        assert yaml.safe_load(f"x: {_scalar(v)}")["x"] == v
    assert _scalar(True) == "true" and _scalar(None) == "null" and _scalar("warmup") == "warmup"


def test_calibrate_api_raises_calibration_error():
    with pytest.raises(CalibrationError, match="too short: 0 sampled steps with a loss"):
        calibrate([], source="nothing")


# -- real traces --------------------------------------------------------------------------------------


@pytest.mark.traces
def test_real_run_calibrated_on_its_first_1000_steps_stays_quiet(traces, tmp_path):
    """A modded-nanogpt run (no LR, step times): the warmup is found from the loss, and the whole 6000-step run
    replayed through the calibrated levels raises nothing, its recurring one-step data spikes included."""
    log = str(traces / "modded-nanogpt" / "runs" / "2024-10-09_SOAP__5bdc3988.csv")
    result = calibrate(read_log(log), source=log)
    assert "no LR in the log; the loss falls fast until step" in result.header[0]
    assert alerts(yaml.safe_load(result.to_yaml()), list(read_log(log))) == []


@pytest.mark.traces
def test_real_llmc_first_steps_are_refused_then_a_later_stretch_works(traces):
    log = str(traces / "llmc-gpt2-124m" / "main.csv")
    with pytest.raises(CalibrationError, match="the trend dominates"):
        calibrate(read_log(log), source=log)
    result = calibrate(read_log(log), start=2000, steps=2000, source=log)
    rules = result.fragment["monitor_config"]["alert"]["rules"]
    assert set(rules) == {"loss_spike", "grad_norm", "grad_norm_spike"}  # no throughput in this log
    later = [r for r in read_log(log) if r.step >= 2000]
    assert alerts(yaml.safe_load(result.to_yaml()), later) == []


def test_calibrate_is_registered_beside_replay():
    from msmon.cli.main import build_parser

    text = build_parser().format_help()
    assert "calibrate" in text and "replay" in text
    assert (ROOT / "msmon" / "cli" / "calibrate.py").is_file()
