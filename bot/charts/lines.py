"""The lines a rule's alert has in its metric's own units (`threshold_lines`: a threshold, a rolling baseline and
the level it implies, a creep's fitted trend), computed from the event alone; bot/charts/draw.py draws them on the
chart and `msmon replay --plot` on its own."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence

from matplotlib.ticker import EngFormatter

from msmon.contract.wire import Event


def _finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


def _human(v: float, metric: str) -> str:
    """A value for a legend label: "125k" tokens/s, "2.6" loss."""
    return EngFormatter(sep="", places=None)(v) if metric == "throughput" else f"{v:.4g}"


def _at_step(event: Event, values: Sequence[float | None]) -> float | None:
    """The metric's value at the alert's step in its window (the newest at or before it)."""
    if event.window is None:
        return None
    best = None
    for s, v in zip(event.window.steps, values, strict=False):
        if s <= event.step and _finite(v):
            best = v
    return best


def _spike_level(event: Event, base: float, thr: float) -> tuple[float, str] | None:
    """(level, how) that `loss_spike` or `grad_norm_spike` alerted above, in the metric's units."""
    if event.rule == "grad_norm_spike" or "gross jump" in event.message:
        return base * thr, f"{thr:.3g}x baseline"
    if event.rule != "loss_spike" or "long horizon" in event.message or not _finite(event.value) or event.value <= 0:
        return None
    x = _at_step(event, event.window.loss) if event.window is not None else None
    if x is None or x <= base:
        return None
    sigma = (x - base) / event.value  # the value is (loss - baseline) / sigma: the alert's own sigma
    return base + thr * sigma, f"{thr:.3g} sigma above baseline"


@dataclasses.dataclass(frozen=True)
class RuleLine:
    """A line a rule's alert puts on its metric's panel, in the metric's own units: a level (`y`), or the fitted
    trend from (`x0`, `y0`) to (`x1`, `y`) (`grad_norm_creep`). `kind`: "threshold", "baseline" or "trend"."""

    kind: str
    y: float
    label: str
    x0: float | None = None
    y0: float | None = None
    x1: float | None = None


def threshold_lines(event: Event) -> list[RuleLine]:
    """The lines `event`'s rule has in its metric's units (the chart and `msmon replay --plot` draw them):
    `grad_norm`'s absolute threshold; the rolling median of `loss_spike`, `grad_norm_spike` and
    `throughput_drop` and the level it implies; `grad_norm_creep`'s fitted trend and its threshold's level.
    The other rules' thresholds are in units of their own and have none."""
    rule, thr, base = event.rule, event.threshold, event.baseline
    if rule == "grad_norm" and _finite(thr):
        return [RuleLine("threshold", thr, f"threshold {thr:.4g}")]
    if rule == "grad_norm_creep":
        return _creep_lines(event)
    if rule not in ("loss_spike", "grad_norm_spike", "throughput_drop") or base is None or not _finite(base):
        return []
    out = [RuleLine("baseline", base, f"baseline (rolling median) {_human(base, event.metric)}")]
    if not _finite(thr):
        return out
    if rule in ("grad_norm_spike", "loss_spike"):
        found = _spike_level(event, base, thr)
        if found is not None:
            level, how = found
            out.append(RuleLine("threshold", level, f"threshold {how} = {_human(level, event.metric)}"))
    elif rule == "throughput_drop":
        level = base * (1.0 - thr)
        out.append(RuleLine("threshold", level, f"threshold {thr:.0%} below baseline = {_human(level, event.metric)}"))
    return out


_CREEP = re.compile(r"crept up [0-9.e+-]+x over the last ([0-9]+) steps")


def _creep_lines(event: Event) -> list[RuleLine]:
    """`grad_norm_creep`'s fitted trend (log-linear: from its start `baseline` to `baseline x value` over the
    fit's span of steps, ending at the alert) and the level its threshold puts at the trend's end. The long
    horizon's alert (a median against a reference) says no span: nothing is drawn for it."""
    m = _CREEP.search(event.message)
    start, rise, thr = event.baseline, event.value, event.threshold
    if m is None or start is None or not (_finite(start) and _finite(rise) and start > 0 and rise > 0):
        return []
    span = float(m.group(1))
    out = [RuleLine("trend", start * rise, f"fitted trend {start:.3g} -> {start * rise:.3g} over {span:.0f} steps",
                    x0=event.step - span, y0=start, x1=float(event.step))]
    if _finite(thr) and thr > 0:
        out.append(RuleLine("threshold", start * thr, f"threshold {thr:.3g}x the trend's start = {start * thr:.3g}"))
    return out


__all__ = ["RuleLine", "threshold_lines"]
