"""Grad-norm rules: over an absolute threshold, exploding against its own baseline, creeping upward."""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

from msmon.contract.wire import Sample
from msmon.core.detectors.base import SKIP, BaselineRule, DetectorContext, Finding, RuleParams, classify
from msmon.core.detectors.rolling import RollingQuantiles, SlidingFit
from msmon.core.spec import spec

_HINT = ("A growing grad norm comes before loss divergence. Save a checkpoint now; consider scaling the LR "
         "down (scale-lr 0.5) or tightening gradient clipping, and check the last data batches.")


@dataclasses.dataclass
class GradNormParams(RuleParams):
    """Absolute global grad norm (L2 over all gradients, before clipping)."""

    warning: float | None = dataclasses.field(
        default=None, metadata=spec(gt=0, doc="WARNING level; null: half the ERROR level"))
    error: float | None = dataclasses.field(
        default=None, metadata=spec(gt=0, doc="ERROR level (= alert.grad_norm_threshold); null: rule off"))
    consecutive: int = dataclasses.field(default=2, metadata=spec(ge=1, doc="samples in a row"))

    def warning_level(self) -> float | None:
        if self.warning is not None:
            return self.warning
        return None if self.error is None else 0.5 * self.error


class GradNormThreshold:
    rule: ClassVar[str] = "grad_norm"
    summary: ClassVar[str] = "grad norm above an absolute threshold"
    metric: ClassVar[str] = "grad_norm"
    requires: ClassVar[frozenset[str]] = frozenset({"grad_norm"})
    hint: ClassVar[str] = _HINT

    def __init__(self, p: GradNormParams, ctx: DetectorContext) -> None:
        pass

    def update(self, s: Sample, p: RuleParams) -> Finding | None:
        g = s.grad_norm
        if g is None or not math.isfinite(g):
            return SKIP
        level, thr = classify(g, p)
        if level is None:
            return None
        return Finding(level, g, thr, f"grad norm {g:.4g} is over the threshold {thr:g}")


@dataclasses.dataclass
class GradNormSpikeParams(RuleParams):
    """Grad norm as a multiple of its rolling median: an explosion, whatever the model's scale."""

    warning: float | None = dataclasses.field(default=4.0, metadata=spec(gt=1, doc="x the rolling median"))
    error: float | None = dataclasses.field(default=10.0, metadata=spec(gt=1, doc="x the rolling median"))
    consecutive: int = dataclasses.field(default=2, metadata=spec(ge=1, doc="samples in a row"))
    window: int = dataclasses.field(default=100, metadata=spec(ge=10, doc="samples in the rolling baseline"))


class GradNormSpike(BaselineRule):
    rule: ClassVar[str] = "grad_norm_spike"
    summary: ClassVar[str] = "grad norm x its rolling median"
    metric: ClassVar[str] = "grad_norm"
    requires: ClassVar[frozenset[str]] = frozenset({"grad_norm"})
    hint: ClassVar[str] = _HINT

    def __init__(self, p: GradNormSpikeParams, ctx: DetectorContext) -> None:
        super().__init__(p.window)

    def score(self, x: float, w: RollingQuantiles) -> tuple[float, float]:
        med = w.median()
        return (x / med if med > 0.0 else 0.0), med

    def update(self, s: Sample, p: RuleParams) -> Finding | None:
        g = s.grad_norm
        if g is None or not math.isfinite(g) or g <= 0.0:
            return SKIP
        r = self.judge(g, p)
        if r is None:
            return None
        level, thr, ratio, med = r
        return Finding(level, ratio, thr,
                       f"grad norm {g:.4g} is {ratio:.1f}x its recent median {med:.4g} (threshold {thr:g}x)", med)


@dataclasses.dataclass
class GradNormCreepParams(RuleParams):
    """A sustained rise of the grad norm: the fitted trend over `window` samples, as end / start.

    A least-squares line through log(grad norm) over the last `window` samples; the value is
    exp(slope x span), how many times larger the trend line ends than it began, counted only
    when the rise is statistically clear (t-statistic of the slope >= `min_t`). One-step blips
    barely move the fit; a steady climb does, tens of minutes before the threshold is crossed.
    """

    warning: float | None = dataclasses.field(default=1.5, metadata=spec(gt=1, doc="rise factor over the window"))
    error: float | None = dataclasses.field(default=3.0, metadata=spec(gt=1, doc="rise factor over the window"))
    window: int = dataclasses.field(default=50, metadata=spec(ge=10, doc="samples in the trend fit"))
    min_t: float = dataclasses.field(default=4.0, metadata=spec(gt=0, doc="t-statistic the rise must reach"))
    jump: float = dataclasses.field(
        default=3.0, metadata=spec(gt=1, doc="a sample this many x above the trend line is a jump, not creep"))


class GradNormCreep:
    rule: ClassVar[str] = "grad_norm_creep"
    summary: ClassVar[str] = "sustained rise of the grad norm"
    metric: ClassVar[str] = "grad_norm"
    requires: ClassVar[frozenset[str]] = frozenset({"grad_norm"})
    hint: ClassVar[str] = ("The grad norm has been climbing steadily: the early sign of a coming divergence. "
                           "Save a checkpoint; scaling the LR down now is cheaper than a rollback later.")

    JUMP_RESET = 5  # jumps in a row: a new level; the fit starts over

    def __init__(self, p: GradNormCreepParams, ctx: DetectorContext) -> None:
        self.fit = SlidingFit(p.window)
        self.min_t = p.min_t
        self.full = p.window
        self.log_jump = math.log(p.jump)
        self.trend_end: float | None = None  # log grad norm at the end of the last fit
        self.jumps = 0

    def update(self, s: Sample, p: RuleParams) -> Finding | None:
        g = s.grad_norm
        if g is None or not math.isfinite(g) or g <= 0.0:
            return SKIP
        f = self.fit
        y = math.log(g)
        if self.trend_end is not None and y - self.trend_end > self.log_jump:
            # A sudden jump is the spike and threshold rules' business; kept out, it cannot fake a trend.
            self.jumps += 1
            if self.jumps >= self.JUMP_RESET:
                f.clear()
                self.trend_end = None
            return None
        self.jumps = 0
        f.add(float(s.step), y)
        n = f.n
        if n < self.full // 2 or (n >= self.full and self.trend_end is not None and not f.rising()):
            return None
        res = f.fit()
        if res is None:
            return None
        slope, at_end, t = res
        self.trend_end = at_end
        if slope <= 0.0 or n < self.full:
            return None
        if t < self.min_t:
            return None
        rise = math.exp(slope * f.span)
        level, thr = classify(rise, p)
        if level is None:
            return None
        start = math.exp(at_end - slope * f.span)
        return Finding(level, rise, thr,
                       f"grad norm has crept up {rise:.2f}x over the last {f.span:.0f} steps "
                       f"(trend {start:.3g} -> {math.exp(at_end):.3g}; threshold {thr:g}x)", start)
