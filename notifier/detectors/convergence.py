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
    """Each window of `window_steps` steps, the loss is fitted against log(step); its slope is the loss
    change per doubling of the step count, which a healthy power-law loss curve keeps roughly
    steady (a slope per step would fall naturally and alarm on every run). The value is the
    fraction of the previous window's descent that was lost: 0.9 means the loss now falls ten
    times slower; above 1 it is rising. Compared only when the previous window fell clearly
    (t-statistic <= -min_t) and the change of slope is itself clear (min_t standard errors)."""

    warning: float | None = dataclasses.field(default=0.9, metadata=spec(gt=0, doc="fraction of descent lost"))
    error: float | None = dataclasses.field(default=None, metadata=spec(gt=0, doc="fraction of descent lost"))
    window_steps: int = dataclasses.field(default=1000, metadata=spec(ge=10, doc="steps per window"))
    min_t: float = dataclasses.field(default=4.0, metadata=spec(gt=0, doc="how clearly the previous window fell"))


class Trend:
    """Window-by-window fits of the loss against log(step): slope, its change, forecast and ETA.

    A window is `window_steps` steps cut into `BLOCKS` blocks; the fit goes through the blocks'
    median losses, so a one-batch data spike (common and harmless) cannot tilt the slope, and the
    result does not depend on how often the loss is sampled. Memory: one block of samples.
    Pure; used by the convergence and forecast rules, and by replays and the bot's status.
    """

    BLOCKS = 10
    __slots__ = ("fit", "block", "block_steps", "block_id", "count", "current", "previous")

    def __init__(self, window_steps: int) -> None:
        self.block_steps = max(1, window_steps // self.BLOCKS)
        self.fit = SlidingFit(self.BLOCKS)
        self.block: list[tuple[float, float]] = []
        self.block_id = -1
        self.count = 0  # blocks completed
        self.current: tuple[float, float, float, int] | None = None  # (log-slope, loss at end, t, step)
        self.previous: tuple[float, float, float, int] | None = None

    def add(self, step: int, loss: float) -> bool:
        """Add a point; True when it completed a window (current/previous were updated)."""
        if step < 1 or not math.isfinite(loss):
            return False
        bid = step // self.block_steps
        done = False
        if bid != self.block_id and self.block:
            done = self._close_block(step)
        self.block_id = bid
        self.block.append((loss, math.log(step)))
        return done

    def _close_block(self, step: int) -> bool:
        block = self.block
        block.sort()
        n = len(block)
        med = block[n // 2][0] if n & 1 else 0.5 * (block[n // 2 - 1][0] + block[n // 2][0])
        x = sum(p[1] for p in block) / n
        block.clear()
        self.fit.add(x, med)
        self.count += 1
        if self.count % self.BLOCKS:
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

    def forecast(self, at_step: int) -> tuple[float, float] | None:
        """The loss the current trend reaches at `at_step`, and the standard error of that forecast."""
        if self.current is None:
            return None
        return self.fit.predict(math.log(at_step))

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


def _se(fit: tuple[float, float, float, int]) -> float:
    """Standard error of a window's slope, from its slope and t-statistic."""
    slope, _, t, _ = fit
    return abs(slope / t) if t else 0.0


class Convergence:
    rule: ClassVar[str] = "convergence"
    metric: ClassVar[str] = "loss"
    requires: ClassVar[frozenset[str]] = frozenset({"loss"})
    hint: ClassVar[str] = ("Progress has stalled: check the LR (decayed too early? stuck at its minimum?), "
                           "data repetition, and whether the planned steps still make sense.")

    def __init__(self, p: ConvergenceParams, ctx: DetectorContext) -> None:
        self.trend = Trend(p.window_steps)
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
        # The change itself must be clear, not the previous window's luck regressing to the mean.
        se_prev, se_cur = _se(prev), _se(cur)
        if (cur[0] - prev[0]) < self.min_t * math.hypot(se_prev, se_cur):
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
    against log(step) and extrapolated to total_steps. The value is how far above the target the
    forecast lands, counting only what is certain: forecast - 2 x its standard error - target."""

    warning: float | None = dataclasses.field(default=0.0, metadata=spec(ge=0, doc="forecast above target by"))
    error: float | None = dataclasses.field(default=None, metadata=spec(ge=0, doc="forecast above target by"))
    window_steps: int = dataclasses.field(default=2000, metadata=spec(ge=10, doc="steps per window"))


class LossForecast:
    rule: ClassVar[str] = "loss_forecast"
    metric: ClassVar[str] = "loss"
    requires: ClassVar[frozenset[str]] = frozenset({"loss"})
    hint: ClassVar[str] = ("At this rate the run ends above its target loss: decide now whether to extend the "
                           "run, change the schedule or stop early, rather than at the last step.")

    def __init__(self, p: LossForecastParams, ctx: DetectorContext) -> None:
        self.trend = Trend(p.window_steps)
        self.target = ctx.target_loss
        self.total = ctx.total_steps
        self.last: Finding | None = None

    def update(self, s: Sample, p: RuleParams) -> Finding | None:
        x = s.loss
        target, total, tr = self.target, self.total, self.trend
        if target is None or total is None or x is None or s.step >= total or not tr.add(s.step, x):
            return self.last
        fc = tr.forecast(total)
        self.last = None
        if fc is None:
            return None
        final, se = fc
        margin = final - 2.0 * se - target
        level, thr = classify(margin, p)
        if level is not None:
            eta = tr.eta(target)
            when = f"the trend reaches it at step ~{eta:,.0f}" if eta is not None else "the trend never reaches it"
            self.last = Finding(level, margin, thr,
                                f"at the current rate the loss reaches {final:.4g} +- {2 * se:.2g} by step "
                                f"{total:,}, above the target {target:g} ({when})", target)
        return self.last
