"""Vanished gradients: the grad norm stays at zero (clipping or loss scaling misconfigured)."""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

from msmon.contract.wire import Sample
from msmon.core.detectors.base import SKIP, DetectorContext, Finding, RuleParams, classify
from msmon.core.spec import spec


@dataclasses.dataclass
class VanishedGradParams(RuleParams):
    """Levels count samples in a row whose grad norm is at most `epsilon`."""

    warning: float | None = dataclasses.field(default=3, metadata=spec(ge=1, doc="zero-grad samples in a row"))
    error: float | None = dataclasses.field(default=10, metadata=spec(ge=1, doc="zero-grad samples in a row"))
    epsilon: float = dataclasses.field(default=1e-10, metadata=spec(ge=0, doc="grad norms at or below count as zero"))


class VanishedGrad:
    rule: ClassVar[str] = "vanished_grad"
    summary: ClassVar[str] = "grad norm stuck at zero"
    metric: ClassVar[str] = "grad_norm"
    requires: ClassVar[frozenset[str]] = frozenset({"grad_norm"})
    hint: ClassVar[str] = ("Nothing is being learned. Check gradient clipping (max norm 0?), the loss scale "
                           "(overflow skipping every step?), frozen parameters and the optimizer's parameter list.")

    def __init__(self, p: VanishedGradParams, ctx: DetectorContext) -> None:
        self.epsilon = p.epsilon
        self.run = 0

    def update(self, s: Sample, p: RuleParams) -> Finding | None:
        g = s.grad_norm
        if g is None or not math.isfinite(g):
            return SKIP
        if g > self.epsilon:
            self.run = 0
            return None
        self.run += 1
        level, thr = classify(float(self.run), p)
        if level is None:
            return None
        return Finding(level, float(self.run), thr,
                       f"grad norm has been {g:.3g} for {self.run} samples in a row (threshold {thr:g})")
