"""Persistent loss-scale overflow: every step skipped, the dynamic loss scale collapsing (training has stalled).

fp16 dynamic loss scaling (MindSpore's `DynamicLossScaleUpdateCell`, MindFormers' loss-scale cells, msmon's
`TrainStepWithGradNormLossScale`) overflows now and then by design: the step is skipped, the scale halves, and
training goes on. That is a skipped step, counted (`Sample.skipped_steps`), never an alert. What stalls a run
is an overflow that does not stop: every step skipped while the scale falls to its floor.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from msmon.contract.wire import Sample, Severity
from msmon.core.detectors.base import SKIP, DetectorContext, Finding, RuleParams, classify
from msmon.core.spec import spec


@dataclasses.dataclass
class LossScaleParams(RuleParams):
    """Levels are steps in a row that overflowed: from the first sampled step that overflowed to the one now,
    every sample between them overflowed too (at `step_interval` 10, three such samples span 21 steps). A scale
    at `min_scale` or below that still overflows is an ERROR at once: it cannot go lower. Until the run's first
    step that did not overflow (the scale searching down from its initial value) only that floor and `start`
    times the ERROR span count."""

    warning: float | None = dataclasses.field(
        default=20, metadata=spec(ge=1, le=1e9, doc="steps in a row overflowing"))
    error: float | None = dataclasses.field(default=50, metadata=spec(ge=1, le=1e9, doc="steps in a row overflowing"))
    min_scale: float = dataclasses.field(default=1.0, metadata=spec(
        ge=0, le=1e38, doc="the scale's floor (DynamicLossScaleUpdateCell: 1); overflowing there is an ERROR"))
    start: float = dataclasses.field(default=4.0, metadata=spec(
        ge=1, le=1e6, doc="before the first step that did not overflow: this many x the ERROR span"))


class LossScale:
    rule: ClassVar[str] = "loss_scale"
    summary: ClassVar[str] = "every step overflowing (loss scale collapsing)"
    metric: ClassVar[str] = "loss_scale"
    requires: ClassVar[frozenset[str]] = frozenset()
    hint: ClassVar[str] = ("Every step overflows, so no update is applied: training has stalled. Look for Inf/NaN "
                           "in the data or the weights (roll back to the last good checkpoint), an fp16 op that "
                           "overflows at any scale (keep it in fp32), or a loss scale manager misconfigured.")

    def __init__(self, p: LossScaleParams, ctx: DetectorContext) -> None:
        self.min_scale = p.min_scale
        self.start = p.start
        self.good = False  # a step that did not overflow was seen
        self.since: int | None = None  # first step of the current run of overflowed samples

    def update(self, s: Sample, p: RuleParams) -> Finding | None:
        if s.overflow is None:
            return SKIP
        if not s.overflow:
            self.good, self.since = True, None
            return None
        if self.since is None:
            self.since = s.step
        span = float(s.step - self.since + 1)
        scale = s.loss_scale
        if scale is not None and scale <= self.min_scale and span > 1:
            return Finding(Severity.ERROR, span, self.min_scale,
                           f"every step has overflowed since step {self.since} and the loss scale is down to its "
                           f"floor ({scale:g}): no update is being applied", absolute=True)
        judged = span if self.good else span / self.start
        level, thr = classify(judged, p)
        if level is None:
            return None
        shown = thr if self.good else thr * self.start
        where = "" if scale is None else f", the loss scale now {scale:g}"
        return Finding(level, span, shown,
                       f"every sampled step has overflowed for {span:.0f} steps since step {self.since}{where}: their "
                       f"updates were skipped (threshold {shown:g} steps)")

