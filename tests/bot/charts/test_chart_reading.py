"""Charts read right (issue 29): `grad_norm_creep` draws the trend it fitted and the level its threshold sets, a
constant LR is one line mid-panel with one tick (not ticks 1.90e-5 ... 2.10e-5 around nothing), and the x label
says when the alert happened. The creep alert is the real detector's, on a real MindSpore CPU trace
(data/backtest/mindspore-cpu/grad-creep.csv)."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("matplotlib")

from bot.charts.draw import chart_figure, render_chart  # noqa: E402
from msmon.offline.readers import read_csv  # noqa: E402
from msmon.offline.replay import replay, replay_monitor  # noqa: E402
from notifier.config import load_config  # noqa: E402
from tests.conftest import ROOT  # noqa: E402


def _first(trace: str, rule: str):
    cfg = load_config(str(ROOT / "config" / "monitor.yaml"))
    events = replay(read_csv(str(ROOT / "data" / "backtest" / "mindspore-cpu" / trace)), replay_monitor(cfg, "r"))
    return next(e for e in events if e.rule == rule and e.status.value == "firing")


def _creep():
    return _first("grad-creep.csv", "grad_norm_creep")


def _axes(fig):
    return {ax.get_ylabel().removesuffix(" (log)"): ax for ax in fig.axes}


def test_a_creep_chart_draws_the_fitted_trend_and_its_threshold() -> None:
    ev = _creep()
    m = re.search(r"over the last (\d+) steps \(trend ([0-9.e+-]+) -> ([0-9.e+-]+); threshold ([0-9.]+)x\)",
                  ev.message)
    assert m, ev.message
    span, start, end, thr = int(m.group(1)), float(m.group(2)), float(m.group(3)), float(m.group(4))
    lines = {line.get_label(): line for line in _axes(chart_figure(ev))["grad norm"].get_lines()}
    trend = next(line for label, line in lines.items() if label.startswith("fitted trend"))
    xs, ys = trend.get_xdata(), trend.get_ydata()
    assert xs[0] == ev.step - span and xs[-1] == ev.step
    assert ys[0] == pytest.approx(start, rel=0.01) and ys[-1] == pytest.approx(end, rel=0.01)
    level = next(line for label, line in lines.items() if label.startswith("threshold"))
    assert level.get_ydata()[0] == pytest.approx(start * thr, rel=0.01)
    assert len(render_chart(ev)) > 10_000


def test_a_constant_lr_is_one_line_mid_panel_and_the_time_is_said() -> None:
    ev = _first("nan.csv", "nonfinite")  # the trace's LR is flat at 0.05 after its warmup, long before the NaN
    assert len({v for v in ev.window.learning_rate if v is not None}) == 1, ev.window.learning_rate
    fig = chart_figure(ev)
    ax = _axes(fig)["learning rate"]
    lo, hi = ax.get_ylim()
    (v,) = {x for x in ev.window.learning_rate if x is not None}
    assert lo < v < hi and (hi - lo) == pytest.approx(v, rel=1e-6)  # v +- 50 %: the line in the middle
    assert [t for t in ax.get_yticks() if lo <= t <= hi] == [v]
    assert "UTC" in fig.axes[-1].get_xlabel() and f"step {ev.step}" in fig.axes[-1].get_xlabel()


def test_a_replay_plot_draws_each_alerts_threshold_and_says_what_its_throughput_is() -> None:
    from msmon.offline.plot import replay_figure, throughput_label
    from msmon.offline.replay import run_replay

    cfg = load_config(str(ROOT / "config" / "monitor.yaml"))
    result = run_replay(str(ROOT / "data" / "backtest" / "mindspore-cpu" / "grad-creep.csv"), cfg)
    fig = replay_figure(result, title="grad-creep")
    grad = next(ax for ax in fig.axes if ax.get_ylabel().startswith("grad norm"))
    creep = next(e for e in result.firing() if e.rule == "grad_norm_creep")
    trend = [ln for ln in grad.get_lines() if ln.get_linestyle() == ":"]
    assert any(list(ln.get_xdata()) == [creep.step - 490, creep.step] for ln in trend), \
        [list(ln.get_xdata()) for ln in trend]
    threshold = next(e for e in result.firing() if e.rule == "grad_norm")
    bars = [ln for ln in grad.get_lines() if len(ln.get_xdata()) == 2 and ln.get_linestyle() == "-"
            and list(ln.get_ydata()) == [threshold.threshold] * 2]
    assert bars, "no threshold bar at the grad_norm alert"
    assert fig.axes[-1].get_ylabel() == "throughput (as logged)"
    assert throughput_label("mindformers") == "samples/s per device"  # MindFormers' unit, not tokens/s


def test_a_status_chart_marks_where_the_firing_alerts_began_even_before_its_window() -> None:
    from bot.charts.draw import alert_starts
    from bot.commands.service import _status_event
    from msmon.contract.wire import Sample

    hist = [Sample(run_id="r", device="0", step=s, time=1.79e9 + s, loss=0.25, learning_rate=0.05, grad_norm=0.3)
            for s in range(2500, 3001, 10)]  # the bot's window: the last samples only
    firing = [{"first_step": 2010, "rule": "lr_schedule", "severity": "ERROR"},
              {"first_step": 2900, "rule": "grad_norm_spike", "severity": "WARNING"}]
    fig = chart_figure(_status_event({"run_id": "r"}, hist, firing), starts=alert_starts(firing))
    lo, hi = fig.axes[0].get_xlim()
    assert lo <= 2010 and hi >= 3000  # the axis reaches back to where the first alert began
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert " lr_schedule since 2010" in texts and "grad_norm_spike since 2900 " in texts, texts
    marks = [ln for ln in fig.axes[1].get_lines() if list(ln.get_xdata()) in ([2010, 2010], [2900, 2900])]
    assert len(marks) == 2


def test_a_chart_marks_the_steps_loss_scaling_skipped_and_an_older_jobs_window_has_none() -> None:
    """fp16 dynamic loss scaling: the window carries the steps whose update was skipped (overflow), on the wire
    and from the bot's own samples alike, and the chart marks them at the foot of the grad norm panel."""
    from bot.commands.service import _status_event
    from msmon.contract.wire import Sample, Window, decode, encode

    hist = [Sample(run_id="r", device="0", step=s, time=1.79e9 + s, loss=2.0, learning_rate=1e-4,
                    grad_norm=None if s in (1040, 1170) else 0.5, overflow=s in (1040, 1170), loss_scale=1024.0)
            for s in range(1000, 1201, 10)]
    ev = _status_event({"run_id": "r"}, hist, [])
    assert ev.window is not None and ev.window.overflow_steps == [1040, 1170]
    assert decode(encode(ev.window), Window).overflow_steps == [1040, 1170]
    marks = [ln for ln in _axes(chart_figure(ev))["grad norm"].get_lines()
             if ln.get_label() == "skipped step (overflow)"]
    assert len(marks) == 1 and list(marks[0].get_xdata()) == [1040, 1170]
    old = decode(b'{"steps":[1],"loss":[2.0],"learning_rate":[null],"grad_norm":[1.0],"tokens_per_s":[null]}', Window)
    assert old.overflow_steps == []
    plain = _status_event({"run_id": "r"}, [Sample(run_id="r", device="0", step=s, time=1.79e9 + s, loss=2.0)
                                            for s in range(10)], [])
    assert not any(ln.get_label() == "skipped step (overflow)" for ax in chart_figure(plain).axes
                   for ln in ax.get_lines())
