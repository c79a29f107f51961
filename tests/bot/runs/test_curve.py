"""A run's whole curve in bounded memory (bot/runs/curve.py): whatever the run's length and values, at most POINTS
points, spread over the whole run, its first and last samples in, and each field's last finite value right."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from bot.runs.curve import POINTS, Curve
from msmon.contract.wire import Sample

values = st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True, width=32))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(values, values), max_size=3000), st.integers(1, 7))
def test_the_curve_is_bounded_covers_the_run_and_keeps_the_last_finite_values(rows, stride):
    curve = Curve("0")
    for i, (loss, norm) in enumerate(rows):
        curve.add(Sample(run_id="r", device="0", step=i * stride, time=0.0, loss=loss, grad_norm=norm))
        curve.add(Sample(run_id="r", device="1", step=i * stride, time=0.0, loss=1e9))  # not the lead: ignored
    cols = curve.columns()
    assert len(cols["steps"]) <= POINTS + 1 and all(len(c) == len(cols["steps"]) for c in cols.values())
    if rows:
        assert cols["steps"][0] == 0 and cols["steps"][-1] == (len(rows) - 1) * stride
        assert cols["steps"] == sorted(set(cols["steps"]))
        if len(rows) > POINTS:
            assert len(cols["steps"]) >= POINTS // 2  # spread, not a prefix
    for name, col in (("loss", 0), ("grad_norm", 1)):
        finite = [(i * stride, r[col]) for i, r in enumerate(rows) if r[col] is not None and math.isfinite(r[col])]
        got = curve.last_finite().get(name)
        assert (got["step"], got["value"]) == finite[-1] if finite else got is None


def test_a_run_nan_for_its_last_thousand_steps_still_says_its_last_finite_loss():
    curve = Curve("0")
    for step in range(5000):
        curve.add(Sample(run_id="r", device="0", step=step, time=0.0, loss=2.5 if step < 4000 else math.nan))
    assert curve.said() == "last finite loss 2.5 at step 3,999"
    cols = curve.columns()
    assert any(v == 2.5 for v in cols["loss"]) and math.isnan(cols["loss"][-1])
    assert Curve("0").said() == "no finite loss was reported"
