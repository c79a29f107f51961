"""loss_collapse (issue 37's data_repeat): a loss that falls to a fraction of its settled level, faster than learning
lowers it, is a model memorizing repeated batches. The logic on shaped series here, with randomized noise, levels
and timing; the rule on real MindSpore training, with the loader really repeating, is in tests/msmon/offline/
test_corpus.py."""

from __future__ import annotations

import json
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from msmon.config.errors import ConfigError
from msmon.contract.wire import Sample, Severity
from msmon.core.detectors.base import SKIP, DetectorContext
from msmon.core.detectors.loss_collapse import LossCollapse, LossCollapseParams
from msmon.core.state import dump_attrs, load_attrs
from notifier.config import load_config


def _feed(losses, p=None, d=None):
    p = p or LossCollapseParams()
    d = d or LossCollapse(p, DetectorContext())
    out = []
    for i, x in enumerate(losses, start=1):
        out.append(d.update(Sample(run_id="r", device="0", step=i, time=float(i), loss=x), p))
    return d, out


def _first(findings):
    return next((i for i, f in enumerate(findings, start=1) if f is not None and f.level is not None), None)


def _noisy(rng, level, n, rel):
    return [level * (1.0 + rel * rng.uniform(-1.0, 1.0)) for _ in range(n)]


@given(seed=st.integers(0, 2**32 - 1), level=st.floats(0.05, 20.0), rel=st.floats(0.0, 0.15),
       start=st.integers(60, 400), speed=st.floats(0.02, 0.3))
@settings(max_examples=60)
def test_a_loss_memorized_towards_0_warns_soon_after_it_falls_and_never_before(seed, level, rel, start, speed):
    rng = random.Random(seed)
    losses = _noisy(rng, level, start, rel)
    losses += [level * math.exp(-speed * k) * (1.0 + rel * rng.uniform(-1, 1)) for k in range(1, 400)]
    _, f = _feed(losses)
    first = _first(f)
    assert first is not None and first > start
    # a block's median 2.5 times below the level (which may have followed the first samples of the fall down by a
    # tenth): ln 2.75 / speed samples in, then the rest of that block and the block's middle
    assert first - start <= math.log(2.75 * (1 + rel) / (1 - rel)) / speed + 16
    assert f[first - 1].level is Severity.WARNING and "collapsed" in f[first - 1].message
    # held while it stays down: every verdict after it (one a block; SKIP between) is the WARNING
    assert all(x is SKIP or (x is not None and x.level is Severity.WARNING) for x in f[first:])


@given(seed=st.integers(0, 2**32 - 1), rel=st.floats(0.0, 0.3), top=st.floats(2.0, 12.0),
       fall=st.floats(0.3, 0.95), plateau=st.integers(0, 300), phase=st.floats(0.3, 0.7))
@settings(max_examples=80)
def test_learning_is_never_a_collapse(seed, rel, top, fall, plateau, phase):
    """A first descent from ln(vocab), however fast and deep; a plateau, then its exit by 30 % or less; a slow
    decay to a fraction of the start: learning lowers the loss, but never to half its settled level in a few dozen
    samples."""
    rng = random.Random(seed)
    losses = [top * (fall + (1 - fall) * math.exp(-k / 30.0)) for k in range(300)]  # initial descent
    base = losses[-1]
    losses += [base] * plateau
    losses += [base * (1.0 - phase * 0.3 * (1 - math.exp(-k / 40.0))) for k in range(300)]  # leaving a plateau
    end = losses[-1]
    losses += [end * (1.0 - 0.5 * k / 5000) for k in range(2000)]  # slow decay over thousands of samples
    noisy = [x * (1.0 + rel * rng.uniform(-1, 1)) for x in losses]
    _, f = _feed(noisy)
    assert _first(f) is None


@given(seed=st.integers(0, 2**32 - 1), level=st.floats(0.5, 10.0), up=st.floats(1.5, 20.0),
       held=st.integers(20, 500), rel=st.floats(0.0, 0.1))
@settings(max_examples=60)
def test_a_loss_coming_back_down_from_a_rise_is_no_collapse(seed, level, up, held, rel):
    """A jump held for a while (a bad shard, an SGDR restart, a resume with the moments reset), then back: the loss
    returns to the level it had settled at, it does not fall below it."""
    rng = random.Random(seed)
    losses = _noisy(rng, level, 200, rel) + _noisy(rng, level * up, held, rel) + _noisy(rng, level, 300, rel)
    _, f = _feed(losses)
    assert _first(f) is None


def test_a_loss_that_comes_back_resolves_and_an_acknowledged_level_is_the_new_normal():
    rng = random.Random(7)
    d, f = _feed(_noisy(rng, 3.0, 100, 0.05) + _noisy(rng, 0.5, 30, 0.05))
    assert f[-1].level is Severity.WARNING and f[-1].baseline == pytest.approx(3.0, rel=0.1)
    _, g = _feed(_noisy(rng, 3.0, 30, 0.05), d=d)  # back
    assert g[-1] is None
    d, f = _feed(_noisy(rng, 3.0, 100, 0.05) + _noisy(rng, 0.5, 30, 0.05))
    assert d.acknowledge() and not d.acknowledge()
    _, g = _feed(_noisy(rng, 0.5, 200, 0.05), d=d)
    assert _first(g) is None  # 0.5 is the normal now


def test_nan_inf_and_missing_losses_are_not_judged_and_a_loss_at_0_is_a_collapse():
    d, f = _feed([2.0] * 60 + [math.nan, math.inf, None])
    assert all(x is not None and x.level is None and math.isnan(x.value) for x in f[-3:])  # SKIP
    _, g = _feed([0.0] * 10, d=d)
    assert g[-1].level is Severity.WARNING and math.isinf(g[-1].value)


def test_its_memory_is_saved_and_loaded_with_the_monitor_state():
    rng = random.Random(3)
    series = _noisy(rng, 3.0, 80, 0.05) + [3.0 * math.exp(-0.1 * k) for k in range(1, 40)]
    d, _ = _feed(series[:70])
    saved = json.loads(json.dumps(dump_attrs(d)))
    fresh = LossCollapse(LossCollapseParams(), DetectorContext())
    load_attrs(fresh, saved)
    _, a = _feed(series[70:], d=d)
    _, b = _feed(series[70:], d=fresh)
    assert [None if x is None else (x.level, x.value) for x in a] == [None if x is None else (x.level, x.value)
                                                                     for x in b]
    assert _first(a) is not None


def test_its_keys_are_checked_by_the_config():
    with pytest.raises(ConfigError, match="loss_collapse"):
        load_config({"monitor_on": True, "alert": {"rules": {"loss_collapse": {"warning": 0.5}}}})
    cfg = load_config({"monitor_on": True, "alert": {"rules": {"loss_collapse": {"warning": 3.0, "window": 20}}}})
    assert cfg is not None
