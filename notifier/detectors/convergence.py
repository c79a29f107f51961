"""Slowing convergence and the loss forecast, both from line fits of the loss over windows."""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

from ..config.validate import spec
from ..wire import Sample
from .base import DetectorContext, Finding, RuleParams, classify
from .rolling import SlidingFit


@dataclasses.dataclass
class ConvergenceParams(RuleParams):
    """Each window of `window` samples, the loss is fitted against log(step); its slope is the loss
    change per doubling of the step count, which a healthy power-law loss curve keeps roughly
    steady (a slope per step would fall naturally and alarm on every run). The value is the
    fraction of the previous window's descent that was lost: 0.9 means the loss now falls ten
    times slower; above 1 it is rising. Compared only when the previous window fell clearly
    (t-statistic <= -min_t)."""

    warning: float | None = dataclasses.field(default=0.9, metadata=spec(gt=0, doc="fraction of descent lost"))
    error: float | None = dataclasses.field(default=None, metadata=spec(gt=0, doc="fraction of descent lost"))
    window: int = dataclasses.field(default=100, metadata=spec(ge=10, doc="samples per window"))
    min_t: float = dataclasses.field(default=4.0, metadata=spec(gt=0, doc="how clearly the previous window fell"))


class Trend:
    """Window-by-window fits of the loss against log(step): slope, its change, forecast and ETA.

    Pure; used by the convergence and forecast rules, and by replays and the bot's status.
    """

    __slots__ = ("fit", "count", "step", "current", "previous")

    def __init__(self, window: int) -> None:
        self.fit = SlidingFit(window)
        self.count = 0
        self.step = 0
        self.current: tuple[float, float, float, int] | None = None  # (log-slope, loss at end, t, step)
        self.previous: tuple[float, float, float, int] | None = None

    def add(self, step: int, loss: float) -> bool:
        """Add a point; True when it completed a window (current/previous were updated)."""
        if step < 1 or not math.isfinite(loss):
            return False
        self.fit.add(math.log(step), loss)
        self.count += 1
        self.step = step
        if self.count % self.fit.size:
            return False
        res = self.fit.fit()
        if res is None:
            return False
        self.previous, self.current = self.current, (res[0], res[1], res[2], step)
        return True

    @staticmethod
    def per_doubling(log_slope: float) -> float:
        return log_slope * math.log(2.0)

    @staticmethod
    def per_1000_steps(log_slope: float, step: int) -> float:
        return 1000.0 * log_slope / max(step, 1)

    def forecast(self, at_step: int) -> float | None:
        """The loss the current trend reaches at `at_step`."""
        if self.current is None:
            return None
        slope, at_end, _, step = self.current
        return at_end + slope * (math.log(at_step) - math.log(step))

    def eta(self, target: float) -> float | None:
        """The step at which the current trend reaches `target`; None if it never does."""
        if self.current is None:
            return None
        slope, at_end, _, step = self.current
        if at_end <= target:
            return float(step)
        if slope >= 0.0:
            return None
        return step * math.exp((target - at_end) / slope)


class Convergence:
    rule: ClassVar[str] = "convergence"
    metric: ClassVar[str] = "loss"
    requires: ClassVar[frozenset[str]] = frozenset({"loss"})
    hint: ClassVar[str] = ("Progress has stalled: check the LR (decayed too early? stuck at its minimum?), "
                           "data repetition, and whether the planned steps still make sense.")

    def __init__(self, p: ConvergenceParams, ctx: DetectorContext) -> None:
        self.trend = Trend(p.window)
        self.min_t = p.min_t
        self.last: Finding | None = None

    def update(self, s: Sample, p: RuleParams) -> Finding | None:
        x = s.loss
        tr = self.trend
        if x is None or not tr.add(s.step, x):
            return self.last  # a window's verdict holds until the next window ends
        cur, prev = tr.current, tr.previous
        self.last = None
        if cur is None or prev is None or prev[2] > -self.min_t or prev[0] >= 0.0:
            return None
        lost = 1.0 - cur[0] / prev[0]
        level, thr = classify(lost, p)
        if level is not None:
            what = "the loss is now rising" if cur[0] > 0 else "convergence slowed"
            self.last = Finding(
                level, lost, thr,
                f"{what}: the loss changed {tr.per_doubling(prev[0]):+.3g} per doubling of steps up to step "
                f"{prev[3]}, {tr.per_doubling(cur[0]):+.3g} up to step {cur[3]} "
                f"({tr.per_1000_steps(prev[0], prev[3]):+.2g} -> {tr.per_1000_steps(cur[0], cur[3]):+.2g} per "
                f"1000 steps; {lost:.0%} of the descent lost, threshold {thr:.0%})",
                tr.per_doubling(prev[0]))
        return self.last


@dataclasses.dataclass
class LossForecastParams(RuleParams):
    """Needs `training.target_loss` and `training.total_steps`. Each window, the loss is fitted
    against log(step) and extrapolated to total_steps; the value is forecast minus target."""

    warning: float | None = dataclasses.field(default=0.0, metadata=spec(ge=0, doc="forecast above target by"))
    error: float | None = dataclasses.field(default=None, metadata=spec(ge=0, doc="forecast above target by"))
    window: int = dataclasses.field(default=100, metadata=spec(ge=10, doc="samples per window"))


class LossForecast:
    rule: ClassVar[str] = "loss_forecast"
    metric: ClassVar[str] = "loss"
    requires: ClassVar[frozenset[str]] = frozenset({"loss"})
    hint: ClassVar[str] = ("At this rate the run ends above its target loss: decide now whether to extend the "
                           "run, change the schedule or stop early, rather than at the last step.")

    def __init__(self, p: LossForecastParams, ctx: DetectorContext) -> None:
        self.trend = Trend(p.window)
        self.target = ctx.target_loss
        self.total = ctx.total_steps
        self.last: Finding | None = None

    def update(self, s: Sample, p: RuleParams) -> Finding | None:
        x = s.loss
        target, total, tr = self.target, self.total, self.trend
        if target is None or total is None or x is None or s.step >= total or not tr.add(s.step, x):
            return self.last
        final = tr.forecast(total)
        self.last = None
        if final is None:
            return None
        level, thr = classify(final - target, p)
        if level is not None:
            eta = tr.eta(target)
            when = f"the trend reaches it at step ~{eta:,.0f}" if eta is not None else "the trend never reaches it"
            self.last = Finding(level, final - target, thr,
                                f"at the current rate the loss reaches {final:.4g} by step {total:,}, above the "
                                f"target {target:g} ({when})", target)
        return self.last
