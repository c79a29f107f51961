"""Loss spike: the loss rises above its recent median by several times its normal fluctuation."""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

from msmon.contract.wire import Sample
from msmon.core.detectors.base import SKIP, BaselineRule, DetectorContext, Finding, RuleParams
from msmon.core.detectors.rolling import RollingQuantiles
from msmon.core.spec import spec


@dataclasses.dataclass
class LossSpikeParams(RuleParams):
    """Levels are in units of the loss's normal fluctuation (a robust z-score).

    score = (loss - median of the last `window` samples) / sigma, where sigma is the robust
    standard deviation of that window (IQR / 1.349), floored at `min_fluctuation` x median.
    3.0 means "three times the usual step-to-step noise": with noise of +-0.05 a rise of 0.15.
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

    def error_level(self) -> float | None:
        if self.error is not None:
            return self.error
        return None if self.warning is None else 2.0 * self.warning


class LossSpike(BaselineRule):
    rule: ClassVar[str] = "loss_spike"
    summary: ClassVar[str] = "loss above its rolling median"
    metric: ClassVar[str] = "loss"
    requires: ClassVar[frozenset[str]] = frozenset({"loss"})
    hint: ClassVar[str] = ("Look at the data batch and the grad norm around this step. If the loss does not come "
                           "back within a few hundred steps, save a checkpoint, then scale the LR down or roll back.")

    def __init__(self, p: LossSpikeParams, ctx: DetectorContext) -> None:
        super().__init__(p.window)
        self.min_fluctuation = p.min_fluctuation
        self.sigma = 0.0

    def score(self, x: float, w: RollingQuantiles) -> tuple[float, float]:
        med, sigma = w.median_sigma()
        self.sigma = sigma = max(sigma, self.min_fluctuation * abs(med), 1e-12)
        return (x - med) / sigma, med

    def update(self, s: Sample, p: RuleParams) -> Finding | None:
        x = s.loss
        if x is None or not math.isfinite(x):
            return SKIP
        r = self.judge(x, p)
        if r is None:
            return None
        level, thr, z, med = r
        return Finding(level, z, thr,
                       f"loss {x:.4g} is {z:.1f} sigma above its recent median {med:.4g} "
                       f"(normal fluctuation {self.sigma:.3g}; threshold {thr:g} sigma)", med)
