"""NaN or Inf in the loss or the grad norm: ERROR at once, baseline period or not."""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

from msmon.contract.wire import Sample, Severity
from msmon.core.detectors.base import DetectorContext, Finding, RuleParams


@dataclasses.dataclass
class NonFiniteParams(RuleParams):
    """No levels: a NaN or Inf loss or grad norm is an ERROR on the first sample that shows it."""

    PHASE_KEYS = frozenset({"enable"})


class NonFinite:
    rule: ClassVar[str] = "nonfinite"
    summary: ClassVar[str] = "NaN/Inf in loss or grad norm: ERROR at once"
    metric: ClassVar[str] = "loss"
    requires: ClassVar[frozenset[str]] = frozenset()
    hint: ClassVar[str] = ("The weights are probably corrupted from here on. Stop or roll back to the last good "
                           "checkpoint; with fp16, check the loss scale; lower the LR or clip gradients harder.")

    def __init__(self, p: NonFiniteParams, ctx: DetectorContext) -> None:
        pass

    def update(self, s: Sample, p: RuleParams) -> Finding | None:
        loss, g = s.loss, s.grad_norm
        if loss is not None and not math.isfinite(loss):
            return Finding(Severity.ERROR, loss, math.inf, f"loss is {loss} (not a finite number)")
        if g is not None and not math.isfinite(g):
            return Finding(Severity.ERROR, g, math.inf, f"grad norm is {g} (not a finite number)")
        return None
