"""Issue 13's last false alarms: an absolute grad-norm level out of the model's scale, a gross jump seen from the
second sample, and throughput noise at step_interval 10 on a shared machine (a dip of one step is not a span)."""

from __future__ import annotations

import logging
import random

import pytest

from msmon.contract.wire import Severity, Status
from msmon.core.detectors.base import DetectorContext
from msmon.core.detectors.grad_norm import GradNormParams, GradNormSpike, GradNormSpikeParams, GradNormThreshold
from msmon.offline.readers import Row
from msmon.offline.replay import replay, replay_monitor
from notifier import Monitor
from tests.fakes.helpers import FakeClock, config
from tests.msmon.core.test_detectors import mk


def firing(events, rule):
    return [(e.step, e.severity) for e in events if e.rule == rule and e.status is Status.FIRING and not e.repeat]


def grad_run(norms, **alert):
    mon = Monitor(config(alert={"baseline_steps": 0, "grad_norm_threshold": 10.0, **alert}), "r", sinks=[],
                  clock=FakeClock())
    events = []
    for step, g in enumerate(norms, 1):
        events += mon.step(step, loss=2.0, grad_norm=g)
    return mon, events


def test_a_level_the_first_grad_norm_is_100x_over_stands_down_and_says_so_once(caplog):
    """BLOOM-104B's fp16 norms (10^4-10^6 on healthy steps) against the example's 10: no page on every line;
    the job's log says why, once; grad_norm_spike still judges against the run's own median."""
    rng = random.Random(1)
    norms = [9.0e4 * (1 + rng.gauss(0, 0.1)) for _ in range(300)] + [2.0e6] * 3
    with caplog.at_level(logging.WARNING, logger="msmon"):
        _, events = grad_run(norms)
    assert firing(events, "grad_norm") == []
    assert firing(events, "grad_norm_spike")[:1] == [(302, Severity.ERROR)]  # 22x its median, 2 in a row
    notes = [r.getMessage() for r in caplog.records if "stands down" in r.getMessage()]
    assert len(notes) == 1
    assert "its first grad norm" in notes[0] and "x the ERROR level 10" in notes[0] and "run r" in notes[0]


def test_a_level_under_100x_applies_unless_the_run_is_leaving_its_initialisation():
    """llm.c GPT-2 starts at 15 against 10 and falls under it by step 5: its initialisation, no page (issue 24;
    issue 13 paged it). A run that stays over the level pages after 10 samples; one that doubles, as the level
    says (2 samples in a row)."""
    _, events = grad_run([15.0, 14.0, 13.0, 11.0, 3.0, 2.0])
    assert firing(events, "grad_norm") == []
    _, events = grad_run([15.0] * 12)
    assert firing(events, "grad_norm") == [(12, Severity.ERROR)]  # 10 over it, then the level: 2 in a row
    _, events = grad_run([15.0, 31.0, 32.0, 3.0])
    assert firing(events, "grad_norm") == [(3, Severity.ERROR)]


def test_out_of_scale_null_keeps_the_level_whatever_the_scale():
    _, events = grad_run([9.0e4, 9.1e4, 9.2e4] * 4, rules={"grad_norm": {"out_of_scale": None}})
    assert firing(events, "grad_norm") == [(12, Severity.ERROR)]  # 10 over it, then the level: 2 in a row


def test_a_new_level_set_live_is_judged_as_given():
    p = GradNormParams(error=10.0)
    det = GradNormThreshold(p, DetectorContext())
    assert det.update(mk(1, grad_norm=5e4), p) is None  # stood down
    assert det.update(mk(2, grad_norm=5e4), p) is None
    p.error = 1e5  # set_threshold to the model's scale
    f = det.update(mk(3, grad_norm=2e5), p)
    assert f is not None and f.level is Severity.ERROR and f.threshold == 1e5


def test_a_gross_jump_is_judged_from_the_second_sample():
    """BLOOM exp11: grad norm 13k, then 263k (20x) and 255k: a gross jump with one sample of history."""
    p = GradNormSpikeParams()
    det = GradNormSpike(p, DetectorContext())
    assert det.update(mk(1, grad_norm=12952.0), p) is None
    f = det.update(mk(2, grad_norm=262623.0), p)
    assert f is not None and f.level is Severity.ERROR and "gross jump" in f.message
    assert f.value == pytest.approx(262623.0 / 12952.0)


def test_mindformers_threshold_keeps_its_level_whatever_the_scale():
    """MindFormers stops at its global-norm threshold whatever the run's scale: msmon's level must page too."""
    from notifier.config import load_config

    cfg = load_config({"monitor_config": {"monitor_on": True, "check_for_global_norm": True,
                                          "global_norm_spike_threshold": 2.0}})
    assert cfg.alert.rules.grad_norm.error == 2.0 and cfg.alert.rules.grad_norm.out_of_scale is None


def rates(n, every, dips=(), drop=None, seed=4):
    """Samples/s with 10% noise, one row every `every` steps, no time column; one-sample dips to half at the
    sample indices in `dips`; from `drop` = (index, factor) on, a sustained loss."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        f = 0.5 if i in dips else drop[1] if drop and i >= drop[0] else 1.0
        rows.append(Row((i + 1) * every, loss=1.0, throughput=1.4e5 * f * (1 + rng.gauss(0, 0.1))))
    return rows


def tp_cfg():
    off = {name: {"enable": False} for name in ("step_stall", "loss_spike", "convergence")}
    return config(step_interval=10, metrics=["loss", "throughput"], alert={"baseline_steps": 0, "rules": off})


def test_one_step_dips_at_step_interval_10_are_noise_not_drops():
    """clean-throughput.csv's case: each sample is one step's rate standing for 10 steps; a 50% dip of one
    step, every 15 samples, made 'repeated short dips' when a span was one sample. A span now pools 3 rates."""
    rows = rates(600, 10, dips=set(range(120, 600, 15)))
    assert firing(replay(rows, replay_monitor(tp_cfg(), "r")), "throughput_drop") == []
    one = config(step_interval=10, metrics=["loss", "throughput"],
                 alert={"baseline_steps": 0, "rules": {"throughput_drop": {"min_rates": 1, "noise_sigma": 0},
                                                       "loss_spike": {"enable": False}}})
    assert firing(replay(rows, replay_monitor(one, "r")), "throughput_drop")  # the old spans: the false WARNING


def test_a_sustained_drop_at_step_interval_10_is_still_caught():
    rows = rates(600, 10, drop=(400, 0.3))
    got = firing(replay(rows, replay_monitor(tp_cfg(), "r")), "throughput_drop")
    assert got and got[-1][1] is Severity.ERROR
    assert 4010 + 4 * 30 <= got[0][0] <= 4010 + 6 * 30  # 5 spans of 3 samples (30 steps), the first one partial


def test_a_drop_within_the_rates_own_noise_is_not_a_drop():
    """A rate that swings by 30% sample to sample: a 35% lower span is within 3 robust sigmas; on a steady
    rate the same loss is a drop."""
    def run(noise):
        rng = random.Random(7)
        rows = [Row(i + 1, loss=1.0, throughput=1000.0 * (0.65 if 400 <= i < 460 else 1.0)
                    * max(0.05, 1 + rng.gauss(0, noise))) for i in range(600)]
        conf = config(metrics=["loss", "throughput"],
                      alert={"baseline_steps": 0, "rules": {"throughput_drop": {"min_steps": 1, "min_rates": 1},
                                                            "loss_spike": {"enable": False}}})
        return firing(replay(rows, replay_monitor(conf, "r")), "throughput_drop")
    assert run(0.02)
    assert run(0.3) == []
