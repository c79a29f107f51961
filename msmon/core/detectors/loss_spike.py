"""Loss spike: the loss rises above its recent median by several times its normal fluctuation."""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from typing import ClassVar

from msmon.contract.wire import Sample, Severity
from msmon.core.detectors.base import SKIP, DetectorContext, EarlyBaselineRule, Finding, Judged, RuleParams
from msmon.core.detectors.rolling import RollingQuantiles
from msmon.core.spec import spec


@dataclasses.dataclass
class LossSpikeParams(RuleParams):
    """Levels are in units of the loss's normal fluctuation (a robust z-score).

    score = (loss - median of the last `window` samples) / sigma, where sigma is the robust
    standard deviation of that window (IQR / 1.349), floored at `min_fluctuation` x median.
    3.0 means "three times the usual step-to-step noise": with noise of +-0.05 a rise of 0.15.
    A slow rise, each sample under those levels and so learned, is judged on the long horizon: the
    median of the last `window` samples against the lowest such median (one per `window` samples,
    after warmup) of the last `long_window` samples, in the same sigma (`long_warning`, `long_error`).
    """

    warning: float | None = dataclasses.field(
        default=3.0, metadata=spec(gt=0, doc="rise, in multiples of normal fluctuation (= alert.loss_spike_threshold)"))
    error: float | None = dataclasses.field(
        default=None, metadata=spec(gt=0, doc="rise for ERROR; null: twice the WARNING level"))
    consecutive: int = dataclasses.field(
        default=3, metadata=spec(ge=1, doc="samples in a row; 3 lets one-batch data spikes pass"))
    window: int = dataclasses.field(default=100, metadata=spec(ge=10, doc="samples in the rolling baseline"))
    min_fluctuation: float = dataclasses.field(
        default=0.01, metadata=spec(ge=0, doc="floor on sigma as a fraction of the median loss"))
    gross: float | None = dataclasses.field(
        default=3.0, metadata=spec(gt=1, doc="a loss this many x its recent median (and 10 sigma above it) is an "
                                             "ERROR from the 5th sample on; null: off"))
    long_warning: float | None = dataclasses.field(
        default=4.0, metadata=spec(gt=0, doc="slow rise: the recent median this many sigma above its lowest of the "
                                             "last long_window samples (null: off)"))
    long_error: float | None = dataclasses.field(
        default=8.0, metadata=spec(gt=0, doc="slow rise for ERROR, in sigma (null: off)"))
    long_window: int = dataclasses.field(
        default=1000, metadata=spec(ge=10, doc="samples the slow-rise reference looks back"))

    def error_level(self) -> float | None:
        if self.error is not None:
            return self.error
        return None if self.warning is None else 2.0 * self.warning


class LossSpike(EarlyBaselineRule):
    rule: ClassVar[str] = "loss_spike"
    summary: ClassVar[str] = "loss above its rolling median"
    metric: ClassVar[str] = "loss"
    requires: ClassVar[frozenset[str]] = frozenset({"loss"})
    hint: ClassVar[str] = ("Look at the data batch and the grad norm around this step. If the loss does not come "
                           "back within a few hundred steps, save a checkpoint, then scale the LR down or roll back.")

    GROSS_SIGMA: ClassVar[float] = 10.0  # a gross jump is also this many sigma above the median
    TRANSIENT: ClassVar[tuple[str, ...]] = ("_scored_ms", "_scored_x", "_scored")

    def __init__(self, p: LossSpikeParams, ctx: DetectorContext) -> None:
        super().__init__(p.window, ctx.warmup_steps)
        self.min_fluctuation = p.min_fluctuation
        self.gross = p.gross
        self.sigma = 0.0
        self.long_levels = (p.long_warning, p.long_error)
        blocks = max(2, p.long_window // p.window)
        self.low_medians: deque[float] = deque(maxlen=blocks)  # one median per `window` learned samples
        self.low_steps: deque[int] = deque(maxlen=blocks)
        self.block_n = 0  # learned samples since the last median was kept
        # the last score, by the window's (median, sigma) it was taken on and the value: a cache, not state
        self._scored_ms: tuple[float, float] | None = None
        self._scored_x: float | None = None
        self._scored = (0.0, 0.0, 0.0)

    def score(self, x: float, w: RollingQuantiles) -> tuple[float, float]:
        ms = w.median_sigma()
        if ms is self._scored_ms and x is self._scored_x:  # asked again for this value on this window (gross, level)
            self.sigma = self._scored[2]
            return self._scored[0], self._scored[1]
        med, sigma = ms
        self.sigma = sigma = max(sigma, self.min_fluctuation * abs(med), 1e-12)
        z = (x - med) / sigma
        self._scored_ms, self._scored_x, self._scored = ms, x, (z, med, sigma)
        return z, med

    def gross_ratio(self, x: float, w: RollingQuantiles) -> float:
        z, med = self.score(x, w)
        return x / med if med > 0.0 and z >= self.GROSS_SIGMA else 0.0

    def acknowledge(self) -> bool:
        """A held shift accepted as the new normal; the slow-rise reference is taken again from the new level."""
        held = super().acknowledge()
        if held:
            self.low_medians.clear()
            self.low_steps.clear()
            self.block_n = 0
        return held

    def update(self, s: Sample, p: RuleParams) -> Finding | None:
        x = s.loss
        if x is None or not math.isfinite(x):
            return SKIP
        j = self.assess(x, s, p, self.gross)
        if j is not None:
            return _finding(x, j, self.sigma)
        return self._slow_rise(s)

    def _slow_rise(self, s: Sample) -> Finding | None:
        """The long horizon, on a sample just learned: the recent median against the lowest of the last blocks."""
        w = self.window
        if w.n < w.size or self.warmup.at(s):
            return None
        med, sigma = w.median_sigma()
        sigma = max(sigma, self.min_fluctuation * abs(med), 1e-12)
        self.block_n += 1
        if self.block_n >= w.size:
            self.block_n = 0
            self.low_medians.append(med)
            self.low_steps.append(s.step)
        if len(self.low_medians) < 2:
            return None
        low = min(self.low_medians)
        rise = (med - low) / sigma
        lw, le = self.long_levels
        level, thr = ((Severity.ERROR, le) if le is not None and rise >= le else
                      (Severity.WARNING, lw) if lw is not None and rise >= lw else (None, 0.0))
        if level is None:
            return None
        at = self.low_steps[self.low_medians.index(low)]
        return Finding(level, rise, thr,
                       f"loss has risen slowly: its median {med:.4g} over the last {w.n} samples is {rise:.1f} sigma "
                       f"above its lowest, {low:.4g} at step {at}, {s.step - at} steps ago (normal fluctuation "
                       f"{sigma:.3g}; long horizon, threshold {thr:g} sigma)", low)


def _finding(x: float, j: Judged, sigma: float) -> Finding:
    if j.kind == "gross":
        return Finding(j.level, j.score, j.threshold,
                       f"loss {x:.4g} jumped to {j.score:.1f}x its recent median {j.base:.4g} "
                       f"(gross jump; threshold {j.threshold:g}x)", j.base, absolute=True)
    if j.kind == "held":
        return Finding(j.level, j.score, j.threshold,
                       f"loss {x:.4g} has not returned: still {j.score:.1f} sigma above its median before the "
                       f"rise, {j.base:.4g} (resolves below {j.threshold:g} sigma)", j.base)
    return Finding(j.level, j.score, j.threshold,
                   f"loss {x:.4g} is {j.score:.1f} sigma above its recent median {j.base:.4g} "
                   f"(normal fluctuation {sigma:.3g}; threshold {j.threshold:.3g} sigma)", j.base)
