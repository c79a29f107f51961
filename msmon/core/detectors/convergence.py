"""Slowing convergence and the loss forecast, both from line fits of the loss over windows."""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

from msmon.contract.wire import Sample
from msmon.core.detectors.base import DetectorContext, Finding, RuleParams, classify
from msmon.core.detectors.rolling import SlidingFit
from msmon.core.spec import spec


@dataclasses.dataclass
class ConvergenceParams(RuleParams):
    """Each window of `window_steps` steps, the loss is fitted against log(step); the slope is the
    loss change per doubling of the step count, which a healthy power-law loss curve keeps
    roughly steady (a slope per step falls naturally and would alarm on every run). The value is
    the fraction of the reference descent that was lost, the reference being the fit over the
    four windows before: 0.9 means the loss now falls ten times slower; above 1 it is rising.
    A finding needs a reference that fell clearly (t-statistic <= -min_t) and a change of slope
    that is itself clear (min_t standard errors); it then holds, against the same reference,
    for as long as the descent stays lost."""

    warning: float | None = dataclasses.field(default=0.9, metadata=spec(gt=0, doc="fraction of descent lost"))
    error: float | None = dataclasses.field(default=None, metadata=spec(gt=0, doc="fraction of descent lost"))
    window_steps: int | None = dataclasses.field(
        default=None, metadata=spec(ge=10, doc="steps per window; null: total_steps / 50, at least 1000"))
    min_t: float = dataclasses.field(default=4.0, metadata=spec(gt=0, doc="how clearly the previous window fell"))


class Trend:
    """Fits of the loss against log(step), window by window: slope, its change, forecast and ETA.

    A window is `window_steps` steps cut into `BLOCKS` blocks; fits go through the blocks' median
    losses, so a one-batch data spike (common and harmless) cannot tilt a slope, and the result
    does not depend on how often the loss is sampled. Three fits are kept: the current window,
    the `history` windows before it (the reference a slowdown is judged against; the caller may
    hold it still while a finding stands). Forecasts and ETAs extend the current window's line.
    Pure and bounded; used by the convergence and forecast rules, replays and the bot's status.
    """

    BLOCKS = 10
    MAX_EXP = 50.0  # an ETA beyond e^50 x the current step is "never"
    __slots__ = ("fit", "history", "block", "block_steps", "block_id", "count", "pending",
                 "_window", "current", "reference", "spreads", "slope_floor", "start")

    def __init__(self, window_steps: int, history: int = 4, burn_in: int = 0) -> None:
        self.block_steps = max(1, window_steps // self.BLOCKS)
        self.start = max(1, burn_in)  # steps before this are the initial transient, not a trend
        self.fit = SlidingFit(self.BLOCKS)
        self.history = SlidingFit(self.BLOCKS * history)
        self.block: list[tuple[float, float]] = []
        self.pending: list[tuple[float, float]] = []  # the current window's block points
        self._window: list[tuple[float, float]] = []  # the window just completed, until commit()
        self.spreads: list[float] = []  # standard error of each block median in the current window
        self.slope_floor = 0.0  # the current slope's error implied by the noise inside its blocks
        self.block_id = -1
        self.count = 0  # blocks completed
        self.current: tuple[float, float, float, int] | None = None  # (log-slope, loss at end, t, step)
        self.reference: tuple[float, float, float, int] | None = None

    def add(self, step: int, loss: float) -> bool:
        """Add a point; True when it completed a window (`current` and `reference` were updated).

        After a True, call `commit()` to let the window into the reference, or leave it out to
        hold the reference still.
        """
        if step < self.start or not math.isfinite(loss):
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
        if n >= 4:  # the block median's own error, from the spread inside the block (IQR / 1.349)
            self.spreads.append(1.2533 * (block[(3 * n) // 4][0] - block[n // 4][0]) / 1.349 / math.sqrt(n))
        block.clear()
        self.fit.add(x, med)
        self.pending.append((x, med))
        self.count += 1
        if self.count % self.BLOCKS:
            return False
        res = self.fit.fit()
        noise = self.fit.noise()
        spreads, self.spreads = sorted(self.spreads), []
        self.slope_floor = 0.0
        if spreads and noise is not None:
            self.slope_floor = spreads[len(spreads) // 2] / math.sqrt(noise[1])
        ref = self.history.fit() if self.history.n >= self.BLOCKS else None
        self.current = None if res is None else (res[0], res[1], res[2], step)
        if ref is not None:
            self.reference = (ref[0], ref[1], ref[2], step)
        pending, self.pending = self.pending, []
        self._window = pending
        return self.current is not None

    def commit(self) -> None:
        """Let the window just completed into the reference history."""
        for x, y in self._window:
            self.history.add(x, y)
        self._window = []

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
        expo = (target - at_end) / slope
        return None if expo > self.MAX_EXP else step * math.exp(expo)


def _se(fit: tuple[float, float, float, int]) -> float:
    """Standard error of a window's slope, from its slope and t-statistic."""
    slope, _, t, _ = fit
    return abs(slope / t) if t else 0.0


class Convergence:
    rule: ClassVar[str] = "convergence"
    summary: ClassVar[str] = "loss descent slowing down"
    metric: ClassVar[str] = "loss"
    requires: ClassVar[frozenset[str]] = frozenset({"loss"})
    hint: ClassVar[str] = ("Progress has stalled: check the LR (decayed too early? stuck at its minimum?), "
                           "data repetition, and whether the planned steps still make sense.")

    def __init__(self, p: ConvergenceParams, ctx: DetectorContext) -> None:
        window = p.window_steps
        if window is None:
            window = max(1000, (ctx.total_steps or 0) // 50)
        self.trend = Trend(window, burn_in=window)  # the first window's fast initial fall is no baseline
        self.min_t = p.min_t
        self.last: Finding | None = None

    def _se_now(self) -> float:
        """The current window's slope error: from its ten-point fit, but never below what the noise
        inside its blocks implies (ten points alone misjudge their own noise too often)."""
        tr = self.trend
        assert tr.current is not None
        return max(_se(tr.current), tr.slope_floor)

    def update(self, s: Sample, p: RuleParams) -> Finding | None:
        x = s.loss
        tr = self.trend
        if x is None or not tr.add(s.step, x):
            return self.last  # a window's verdict holds until the next window ends
        cur, ref = tr.current, tr.reference
        finding = None
        if cur is not None and ref is not None and ref[0] < 0.0:
            lost = 1.0 - cur[0] / ref[0]
            level, thr = classify(lost, p)
            # A new finding needs a reference that clearly fell and a change that is itself clear
            # (not the reference's luck regressing to the mean); a standing one holds while the
            # descent stays lost, against the reference from before the slowdown.
            clear = ref[2] <= -self.min_t and (cur[0] - ref[0]) >= self.min_t * math.hypot(_se(ref), self._se_now())
            if level is not None and (clear or self.last is not None):
                what = "the loss is now rising" if cur[0] > 0 else "convergence slowed"
                finding = Finding(
                    level, lost, thr,
                    f"{what}: the loss changed {tr.per_doubling(ref[0]):+.3g} per doubling of steps before, "
                    f"{tr.per_doubling(cur[0]):+.3g} in the last {tr.block_steps * tr.BLOCKS} steps to step "
                    f"{cur[3]} ({tr.per_1000_steps(ref[0], cur[3]):+.2g} -> {tr.per_1000_steps(cur[0], cur[3]):+.2g} "
                    f"per 1000 steps at this point; {lost:.0%} of the descent lost, threshold {thr:.0%})",
                    tr.per_doubling(ref[0]))
        self.last = finding
        if finding is None:
            tr.commit()
        return finding


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
    summary: ClassVar[str] = "forecast loss vs training.target_loss"
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
