"""What the charts say to someone reading them for the first time (issue 19): the status chart's title is the
highest severity firing, the throughput panel draws samples/s when that is what the job reports, one line per
rank from the bot's per-device rings, the spike rules' threshold lines, a log scale announced in its label,
and replay plots whose alert labels do not pile up."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("matplotlib")

from bot.charts.draw import chart_figure, rank_throughput, render_chart  # noqa: E402
from bot.commands.service import _status_event  # noqa: E402
from bot.store.windows import Windows  # noqa: E402
from msmon.contract.wire import Event, Sample, Severity, Status, Window  # noqa: E402

STEPS = list(range(100, 700, 5))


def _samples(device: str = "0", tokens: bool = True, slow_after: int | None = None) -> list[Sample]:
    out = []
    for i, step in enumerate(STEPS):
        rate = 1000.0 + 10 * math.sin(i)
        if slow_after is not None and step >= slow_after:
            rate *= 0.4
        out.append(Sample(run_id="r", device=device, step=step, time=1e9 + i, loss=2.0 - i / 500,
                          learning_rate=1e-3, grad_norm=1.0 + 0.01 * i,
                          tokens_per_s=rate * 16 if tokens else None, samples_per_s=rate))
    return out


def _texts(fig) -> list[str]:
    return [t.get_text() for t in fig.texts]


def _labels(ax) -> list[str]:
    return [line.get_label() for line in ax.get_lines()]


def _axes(fig) -> dict[str, object]:
    return {ax.get_ylabel().removesuffix(" (log)"): ax for ax in fig.axes}


def test_a_status_chart_is_titled_with_the_highest_severity_firing() -> None:
    hist = _samples()
    run = {"run_id": "r"}
    firing = [{"severity": "WARNING", "rule": "grad_norm_creep"}, {"severity": "ERROR", "rule": "loss_spike"}]
    fig = chart_figure(_status_event(run, hist, firing))
    title = _texts(fig)[0]
    assert "ERROR firing" in title and "resolved" not in title and "WARNING" not in title, title
    assert "no alert firing" in _texts(chart_figure(_status_event(run, hist, [])))[0]


def test_samples_per_s_is_drawn_when_the_job_reports_no_tokens() -> None:
    ev = _status_event({"run_id": "r"}, _samples(tokens=False), [])
    assert all(v is None for v in ev.window.tokens_per_s) and ev.window.samples_per_s
    axes = _axes(chart_figure(ev))
    assert "samples/s" in axes and "tokens/s" not in axes
    ax = axes["samples/s"]
    assert any(len(line.get_xdata()) == len(STEPS) for line in ax.get_lines())
    assert not [t for t in ax.texts if t.get_text() == "not reported"]
    assert "tokens/s" in _axes(chart_figure(_status_event({"run_id": "r"}, _samples(), [])))  # tokens first


def test_per_rank_throughput_from_the_bots_per_device_rings() -> None:
    windows = Windows(per_device=600, max_runs=10)
    for dev in ("0", "1", "2"):
        for s in _samples(dev, slow_after=400 if dev == "2" else None):
            windows.add(s)
    ranks = rank_throughput(windows, "r")
    assert sorted(ranks) == ["0", "1", "2"] and len(ranks["2"][0]) == len(STEPS)
    hist = windows.history("r", "0")
    fig = chart_figure(_status_event({"run_id": "r"}, hist, []), ranks=ranks)
    labels = _labels(_axes(fig)["tokens/s"])
    assert {"rank 0 tokens/s", "rank 1 tokens/s", "rank 2 tokens/s"} <= set(labels), labels
    assert rank_throughput(Windows(10, 10), "r") == {}  # one device or none: the window's own line is enough
    assert render_chart(_status_event({"run_id": "r"}, hist, []), ranks=ranks).startswith(b"\x89PNG")


def _spike(rule: str, metric: str, value: float, threshold: float, message: str, baseline: float,
           series: list[float]) -> Event:
    n = len(STEPS)
    w = Window(steps=STEPS, loss=series if metric == "loss" else [2.0] * n, learning_rate=[1e-3] * n,
               grad_norm=series if metric == "grad_norm" else [1.0] * n, tokens_per_s=[1e4] * n)
    return Event(run_id="r", device="0", step=STEPS[-1], time=1e9, rule=rule, severity=Severity.ERROR,
                 status=Status.FIRING, value=value, threshold=threshold, message=message, metric=metric,
                 baseline=baseline, window=w)


def test_a_loss_spike_chart_draws_its_threshold_in_the_losses_units() -> None:
    loss = [2.0] * (len(STEPS) - 1) + [2.5]
    # 2.5 is 10 sigma above 2.0: sigma 0.05, so the 6-sigma level is 2.3
    ev = _spike("loss_spike", "loss", 10.0, 6.0, "loss 2.5 is 10.0 sigma above its recent median 2 (normal "
                "fluctuation 0.05; threshold 6 sigma)", 2.0, loss)
    labels = _labels(_axes(chart_figure(ev))["loss"])
    assert any(lab.startswith("threshold 6 sigma above baseline = 2.3") for lab in labels), labels
    gross = _spike("loss_spike", "loss", 3.5, 3.0, "loss 7 jumped to 3.5x its recent median 2 (gross jump; "
                   "threshold 3x)", 2.0, [2.0] * (len(STEPS) - 1) + [7.0])
    assert any(lab.startswith("threshold 3x baseline = 6") for lab in _labels(_axes(chart_figure(gross))["loss"]))


def test_a_log_scale_says_so_in_its_label() -> None:
    norms = [1.0] * (len(STEPS) - 5) + [10.0, 50.0, 100.0, 300.0, 500.0]
    ev = _spike("grad_norm_spike", "grad_norm", 500.0, 10.0, "grad norm 500 is 500x its recent median 1 (gross "
                "jump; threshold 10x)", 1.0, norms)
    ax = _axes(chart_figure(ev))["grad norm"]
    assert ax.get_yscale() == "log" and ax.get_ylabel() == "grad norm (log)"
    flat = _axes(chart_figure(_status_event({"run_id": "r"}, _samples(), [])))["grad norm"]
    assert flat.get_yscale() == "linear" and "log" not in flat.get_ylabel()


def test_replay_plot_labels_of_close_alerts_are_staggered_not_piled_up(tmp_path) -> None:
    from msmon.offline.plot import LABEL_ROWS, label_rows, plot_replay
    from msmon.offline.replay import Curves, Replayed

    # four alerts within 1% of the range: three rows, the fourth left out; a far one goes back to the top
    assert label_rows([100, 101, 102, 103, 900], span=1000) == [0, 1, 2, None, 0]
    curves = Curves()
    for step in range(1000):
        curves.steps.append(step)
        curves.loss.append(2.0)
        curves.lr.append(1e-3)
        curves.grad_norm.append(1.0 if step < 500 else 1000.0)
        curves.throughput.append(None)
    events = [Event(run_id="r", device="0", step=s, time=0.0, rule=f"rule_{i}", severity=Severity.ERROR,
                    status=Status.FIRING, value=1.0, threshold=1.0, message="m", metric="grad_norm")
              for i, s in enumerate((500, 501, 502, 503))]
    replayed = Replayed(events, {"0": curves}, 1000, "csv", monitor=None)  # type: ignore[arg-type]
    out = tmp_path / "plot.png"
    plot_replay(replayed, str(out), title="t")
    assert out.read_bytes().startswith(b"\x89PNG")
    assert LABEL_ROWS == 3


def test_a_status_chart_marks_now_not_an_alert() -> None:
    fig = chart_figure(_status_event({"run_id": "r"}, _samples(), []))
    labels = {lab for ax in fig.axes for lab in _labels(ax)}
    assert f"now: step {STEPS[-1]}" in labels and not any(lab.startswith("alert at") for lab in labels)
