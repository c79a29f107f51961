"""`msmon.core.trend.summarize`: slope now and before, its change, forecast and ETA, from (step, loss) points."""

from __future__ import annotations

import math
import random

import pytest

from msmon.core.trend import NOT_ENOUGH, summarize


def power_law(steps, noise=0.01, seed=0, a=3.0, b=8.0, p=0.3):
    rng = random.Random(seed)
    return [a + b * s ** -p + rng.gauss(0.0, noise) for s in steps]


def log_line(steps, at_step, before, after, c=6.0, noise=0.0, seed=0):
    """Loss linear in ln(step), slope `before` per unit ln(step) until `at_step`, `after` from there; continuous."""
    rng = random.Random(seed)
    out = []
    for s in steps:
        x = math.log(s)
        x0 = math.log(at_step)
        y = c + before * min(x, x0) + after * max(0.0, x - x0)
        out.append(y + rng.gauss(0.0, noise))
    return out


def test_a_healthy_power_law_is_falling_with_both_windows():
    steps = list(range(1, 20_001, 10))
    s = summarize(steps, power_law(steps))
    assert s is not None
    assert s.verdict == "falling"
    assert s.slope_per_1000 < 0 and s.prev_slope_per_1000 is not None and s.prev_slope_per_1000 < 0
    assert s.end_step == steps[-1] and s.prev_end_step is not None and s.prev_end_step < s.end_step
    assert s.window_steps == 20_000 // 5 - 2  # a fifth of the steps run (step 19,991)
    lines = s.describe()
    assert lines[0].startswith("loss trend at step 19,991: ") and "per 1000 steps" in lines[0]
    assert lines[1].startswith("falling steadily: ")


def test_slowed_convergence_reads_as_the_issue_puts_it():
    """-0.1 per ln(step) until 13,000, then -0.01: 90% of the descent lost, said in per-1000-steps terms."""
    steps = list(range(1, 16_001, 5))
    s = summarize(steps, log_line(steps, 13_000, -0.1, -0.01, noise=0.0005), window_steps=3000)
    assert s is not None and s.verdict == "slowed"
    assert s.descent_lost == pytest.approx(0.9, abs=0.05)
    # per 1000 steps at each window's end: -0.1 * 1000 / step
    assert s.prev_slope_per_1000 == pytest.approx(-0.1 * 1000 / s.prev_end_step, rel=0.05)
    assert s.slope_per_1000 == pytest.approx(-0.01 * 1000 / s.end_step, rel=0.1)
    line = s.describe()[1]
    assert line.startswith(f"convergence slowed from {s.prev_slope_per_1000:+.2g} per 1000 steps (window to step ")
    assert f"to {s.slope_per_1000:+.2g}; 9" in line and "of the descent per doubling lost" in line


def test_rising_and_flat():
    steps = list(range(1, 8001, 4))
    rising = summarize(steps, log_line(steps, 4000, -0.1, +0.2, noise=0.002), window_steps=2000)
    assert rising is not None and rising.verdict == "rising"
    assert rising.describe()[1].startswith("the loss is rising: +")
    rng = random.Random(1)
    flat = summarize(steps, [2.0 + rng.gauss(0, 0.05) for _ in steps], window_steps=2000)
    assert flat is not None and flat.verdict == "flat" and not flat.clear
    assert flat.describe()[1].startswith("no clear trend now (")


def test_forecast_and_eta_extend_the_current_line():
    steps = list(range(1, 10_001, 10))
    s = summarize(steps, log_line(steps, 1, -0.5, -0.5, c=8.0), total_steps=50_000, target_loss=2.5)
    assert s is not None
    assert s.forecast == pytest.approx(8.0 - 0.5 * math.log(50_000), abs=0.01)
    assert s.eta_step == pytest.approx(math.exp((8.0 - 2.5) / 0.5), rel=0.05)  # ~59,900
    lines = s.describe()
    assert any(x.startswith("forecast at step 50,000 (the planned last step): 2.59") for x in lines)
    assert lines[-1].startswith("target loss 2.5: reached at step ~") and lines[-1].endswith(
        "at the current rate, after the planned 50,000 steps")


def test_eta_when_already_reached_or_never():
    steps = list(range(1, 10_001, 10))
    reached = summarize(steps, log_line(steps, 1, -0.5, -0.5, c=8.0), target_loss=5.0)
    assert reached is not None and reached.eta_step == reached.end_step
    assert reached.describe()[-1] == "target loss 5: reached (the trend line is at or below it)"
    never = summarize(steps, log_line(steps, 5000, -0.5, +0.1, c=8.0), target_loss=1.0, window_steps=2000)
    assert never is not None and never.eta_step is None
    assert never.describe()[-1] == "target loss 1: not reached at the current rate"


def test_a_few_hundred_points_from_the_bot_are_enough():
    """The bot's status passes a run's recent window: ~300 points, late in the run, not from step 0."""
    steps = list(range(30_000, 33_000, 10))
    s = summarize(steps, power_law(steps, noise=0.002), total_steps=100_000, target_loss=3.0)
    assert s is not None and s.window_steps == 1495  # half the span: two windows in the data
    assert 30_000 <= s.start_step <= 30_000 + s.window_steps // 10 and s.points >= 280
    assert s.prev_slope_per_1000 is not None
    assert s.forecast is not None and s.forecast > 3.0
    assert s.eta_step is None or s.eta_step > 100_000


def test_not_enough_data_is_none_and_bad_points_are_ignored():
    assert summarize([], []) is None
    assert summarize(list(range(1, 6)), [2.0] * 5) is None
    assert NOT_ENOUGH.startswith("trend: not enough loss data")
    # NaN, None and step 0 are dropped; the order of the points does not matter
    steps = list(range(0, 5000, 5))
    losses: list[float | None] = power_law([max(s, 1) for s in steps])
    losses[-10] = float("nan")
    losses[-20] = None
    shuffled = list(zip(steps, losses, strict=True))
    random.Random(0).shuffle(shuffled)
    a = summarize(steps, losses)
    b = summarize([p[0] for p in shuffled], [p[1] for p in shuffled])
    assert a is not None and a == b
    assert a.points == sum(1 for st in steps if st >= a.start_step) - 2


def test_only_one_window_has_no_previous_slope():
    steps = list(range(1, 151))  # 150 steps: blocks of 7 steps (window 75) fill the data once and twice
    s = summarize(steps, power_law(steps, noise=0.0), window_steps=140)
    assert s is not None and s.prev_slope_per_1000 is None and s.descent_lost is None
    assert len(s.describe()) == 1


def test_a_level_shift_at_the_end_is_the_headline_not_an_outlier() -> None:
    """Issue 24: the loss falls for 2,000 steps, then sits at 5.0 for the last 70: the summary leads with the shift
    (the robust fit of `msmon replay` sets such a jump aside, so its line alone said "falling steadily")."""
    from msmon.core.trend import level_shift, summarize

    rng = random.Random(3)
    steps = list(range(1, 2071))
    losses = [3.0 * s ** -0.1 + rng.gauss(0, 0.02) if s <= 2000 else 5.0 + rng.gauss(0, 0.05) for s in steps]
    s = summarize(steps, losses)
    assert s is not None and s.verdict == "shifted" and s.shift is not None
    assert s.shift.since_step == 2001 and abs(s.shift.level - 5.0) < 0.05
    assert s.describe()[0].startswith("level shift: the loss has sat at 4.98") and "since step 2,001" in s.describe()[0]
    clean = summarize(steps[:2000], losses[:2000])
    assert clean is not None and clean.shift is None  # a falling loss has none
    spikes = [(k, x if k % 97 else x * 3) for k, x in zip(steps[:2000], losses[:2000], strict=True)]
    assert level_shift(spikes) is None  # nor do single spikes
