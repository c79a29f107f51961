"""The alert snapshot chart: real PNGs, decoded back with matplotlib's own reader."""

from __future__ import annotations

import io
import math

import pytest

pytest.importorskip("matplotlib")

from matplotlib.image import imread  # noqa: E402

from bot.charts.draw import chart_size, render_chart  # noqa: E402
from msmon.contract.wire import Event, Severity, Status, Window  # noqa: E402

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
STEPS = list(range(38_000, 40_400, 20))  # 120 samples, the notifier's window


def _window(**series: list[float | None]) -> Window:
    n = len(STEPS)
    smooth = [3.2 - 0.4 * i / n + 0.02 * math.sin(i) for i in range(n)]
    base: dict[str, list[float | None]] = {
        "loss": smooth,
        "learning_rate": [3e-4 * (1 - 0.2 * i / n) for i in range(n)],
        "grad_norm": [1.0 + 0.1 * math.cos(i) for i in range(n)],
        "tokens_per_s": [125_000.0 + 800 * math.sin(i / 3) for i in range(n)],
    }
    base.update(series)
    return Window(steps=list(STEPS), **base)


def _event(rule: str, metric: str, severity: Severity, value: float, threshold: float, message: str,
           window: Window | None, baseline: float | None = None) -> Event:
    return Event(run_id="llama-7b-pretrain-0412", device="npu:3", step=STEPS[-1], time=1_700_000_000.0,
                 rule=rule, severity=severity, status=Status.FIRING, value=value, threshold=threshold,
                 message=message, metric=metric, baseline=baseline, window=window)


def grad_norm_event() -> Event:
    n = len(STEPS)
    climbing = [1.0 + 0.1 * math.cos(i) if i < 80 else 1.2 * 1.13 ** (i - 80) for i in range(n)]
    return _event("grad_norm", "grad_norm", Severity.ERROR, climbing[-1], 100.0,
                  f"grad norm {climbing[-1]:.4g} is over the ERROR threshold 100 for 2 sampled steps in a row; "
                  "the optimizer is about to take a very large step, which usually ends in a loss spike or NaN",
                  _window(grad_norm=climbing))


def loss_spike_event() -> Event:
    n = len(STEPS)
    loss: list[float | None] = [2.6 + 0.03 * math.sin(i) for i in range(n)]
    for i in range(100, 112):
        loss[i] = 2.6 + 0.09 * (i - 99)
    loss[112] = math.nan
    loss[115] = math.inf
    loss[118] = math.nan
    return _event("loss_spike", "loss", Severity.WARNING, 4.8, 3.0,
                  "loss 3.68 is 4.8 sigma above its rolling median 2.6 (sigma 0.035) for 3 sampled steps",
                  _window(loss=loss, learning_rate=[None] * n), baseline=2.6)


def throughput_event() -> Event:
    n = len(STEPS)
    tps = [125_000.0 + 800 * math.sin(i / 3) if i < 95 else 48_000.0 + 500 * math.sin(i) for i in range(n)]
    return _event("throughput_drop", "throughput", Severity.ERROR, 0.62, 0.6,
                  "throughput 4.75e+04 tokens/s is 62% below its usual 1.25e+05 tokens/s (threshold 60%)",
                  _window(tokens_per_s=tps), baseline=125_000.0)


def no_window_event() -> Event:
    return _event("step_stall", "step_time", Severity.WARNING, 14.0, 10.0,
                  "slowest step 42 s is 14x the median step time 3 s", None)


def _decode(png: bytes, event: Event, width_px: int = 1200):
    assert png[:8] == PNG_SIGNATURE
    img = imread(io.BytesIO(png))
    w, h = chart_size(event, width_px)
    assert img.shape[1] == w and img.shape[0] == h
    assert img[..., :3].var() > 1e-3, "the chart is blank"
    return img


def test_grad_norm_error_with_threshold_line():
    ev = grad_norm_event()
    img = _decode(render_chart(ev), ev)
    assert img.shape[:2] == (900, 1200)


def test_loss_spike_with_nan_losses_and_no_learning_rate():
    ev = loss_spike_event()
    _decode(render_chart(ev), ev)


def test_throughput_drop_with_baseline_and_implied_threshold():
    ev = throughput_event()
    _decode(render_chart(ev), ev)


def test_event_without_a_window_is_a_small_image():
    ev = no_window_event()
    img = _decode(render_chart(ev), ev)
    assert img.shape[0] < 900
    empty = _event("step_stall", "step_time", Severity.WARNING, 14.0, 10.0, "stalled",
                   Window(steps=[], loss=[], learning_rate=[], grad_norm=[], tokens_per_s=[]))
    _decode(render_chart(empty), empty)


@pytest.mark.parametrize("width", [800, 1001, 1600])
def test_other_widths_give_the_size_asked_for(width):
    ev = loss_spike_event()
    _decode(render_chart(ev, width_px=width), ev, width)


def test_odd_windows_still_render():
    """One sample; every value missing or non-finite; zeros in the grad norm; a resolved event."""
    one = Window(steps=[10], loss=[2.0], learning_rate=[None], grad_norm=[math.inf], tokens_per_s=[None])
    ev = _event("nonfinite", "loss", Severity.ERROR, math.inf, math.nan, "grad norm is Inf", one)
    _decode(render_chart(ev), ev)

    n = len(STEPS)
    vanished = _window(grad_norm=[1.0 if i < 60 else 0.0 for i in range(n)], loss=[None] * n)
    ev = _event("vanished_grad", "grad_norm", Severity.ERROR, 60.0, 10.0, "grad norm is 0", vanished)
    _decode(render_chart(ev), ev)

    short = Window(steps=[1, 2, 3], loss=[1.0], learning_rate=[], grad_norm=[1.0, 2.0, 3.0, 4.0],
                   tokens_per_s=[None, None, None])
    resolved = _event("grad_norm", "grad_norm", Severity.ERROR, math.nan, math.nan, "grad_norm is back to normal",
                      short)
    resolved.status = Status.RESOLVED
    _decode(render_chart(resolved), resolved)
