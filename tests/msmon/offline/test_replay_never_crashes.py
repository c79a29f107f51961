"""`msmon replay` and `msmon convert` never end in a traceback, whatever the trace (issue 37): empty, one row, NaN and
Inf anywhere, constant, a burst at the end, steps out of order or repeated. Each answers with its report (rc 0) or
a clear one-line refusal (rc 2), and the replay's trend summary, which died on a loss that jumped and came back
(`_median([])` in `level_shift`), says something about every one of them."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from msmon.cli.main import main
from msmon.core.trend import level_shift, summarize

CONFIG = "monitor_config:\n  monitor_on: true\n  step_interval: {si}\n"

_value = st.one_of(
    st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False),
    st.sampled_from([math.nan, math.inf, -math.inf, 0.0, 2.0, 1e-300, 1e300]),
    st.none(),
)


def _row(step: int, loss: float | None, lr: float | None, grad: float | None) -> str:
    return ",".join("" if v is None else repr(v) for v in (step, loss, lr, grad))


@st.composite
def traces(draw: st.DrawFn) -> list[str]:
    """Rows of a CSV log: a base run (constant, noisy or empty), then a burst at the end, odd values anywhere and
    steps that may go back or repeat."""
    n = draw(st.integers(min_value=0, max_value=300))
    base = draw(st.sampled_from(["constant", "noisy"]))
    loss0 = draw(st.floats(min_value=1e-3, max_value=100.0))
    rows: list[tuple[int, float | None, float | None, float | None]] = []
    for i in range(n):
        loss = loss0 if base == "constant" else loss0 * (1.0 + 0.05 * math.sin(i * 1.7))
        rows.append((i + 1, loss, 1e-3, 1.0 + 0.1 * math.cos(i)))
    burst = draw(st.integers(min_value=0, max_value=20))
    level = draw(_value)
    back = draw(st.integers(min_value=0, max_value=5))
    for j in range(burst + back):
        rows.append((n + j + 1, level if j < burst else loss0, 1e-3, level if j < burst else 1.0))
    for _ in range(draw(st.integers(min_value=0, max_value=5))):  # odd values anywhere
        if rows:
            k = draw(st.integers(min_value=0, max_value=len(rows) - 1))
            step, *vals = rows[k]
            col = draw(st.integers(min_value=0, max_value=2))
            vals[col] = draw(_value)
            rows[k] = (step, vals[0], vals[1], vals[2])
    if rows and draw(st.booleans()):  # steps out of order / repeated
        k = draw(st.integers(min_value=0, max_value=len(rows) - 1))
        rows[k] = (draw(st.integers(min_value=0, max_value=n + 30)), *rows[k][1:])
    return ["step,loss,lr,grad_norm"] + [_row(*r) for r in rows]


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    rc = main(argv)
    captured = capsys.readouterr()
    return rc, captured.out + captured.err


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=traces(), si=st.sampled_from([1, 10]))
def test_replay_and_convert_answer_any_trace(lines: list[str], si: int, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "run.csv"
    log.write_text("\n".join(lines) + "\n")
    cfg = tmp_path / "m.yaml"
    cfg.write_text(CONFIG.format(si=si))
    rc, out = _run(["replay", str(log), "--config", str(cfg)], capsys)
    assert rc in (0, 2) and "Traceback" not in out, out
    if rc == 0:
        assert "trend:" in out and "alert(s):" in out, out
    rc, out = _run(["convert", str(log), "-o", str(tmp_path / "out.csv")], capsys)
    assert rc in (0, 2) and "Traceback" not in out, out


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(allow_nan=False, allow_infinity=False, min_value=-1e9, max_value=1e9), max_size=400),
       st.integers(min_value=1, max_value=5))
def test_level_shift_and_summary_take_any_finite_losses(losses: list[float], gap: int) -> None:
    points = [(i * gap, x) for i, x in enumerate(losses)]
    shift = level_shift(points)
    if shift is not None:
        assert points[0][0] <= shift.since_step <= points[-1][0]
    summarize([p for p, _ in points], [x for _, x in points])


def test_a_loss_that_jumped_and_came_back_is_summarised() -> None:
    """The trace that crashed `msmon replay`: 1,200 steps at 2.0, 9 at 9.0, 3 back at 2.0. The shift starts at the
    first high point; the low ones after it are the loss on its way back, not where it started."""
    points = [(i, 2.0) for i in range(1200)] + [(1200 + i, 9.0) for i in range(9)] + [(1209 + i, 2.0) for i in range(3)]
    shift = level_shift(points)
    assert shift is not None and shift.since_step == 1200 and shift.before == 2.0


def test_replay_of_that_trace_prints_its_trend(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "jumped.csv"
    losses = [2.0] * 1200 + [9.0] * 9 + [2.0] * 3
    log.write_text("step,loss\n" + "".join(f"{i + 1},{x}\n" for i, x in enumerate(losses)))
    cfg = tmp_path / "m.yaml"
    cfg.write_text(CONFIG.format(si=1))
    rc, out = _run(["replay", str(log), "--config", str(cfg)], capsys)
    assert rc == 0 and "trend:" in out, out
