"""Learning-rate schedule sanity: LR 0 after warmup, LR rising after warmup, warmup as long as the run."""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

from msmon.contract.wire import Sample, Severity
from msmon.core.detectors.base import SKIP, DetectorContext, Finding, RuleParams
from msmon.core.spec import spec


@dataclasses.dataclass
class LrScheduleParams(RuleParams):
    """Fixed severities: LR at zero after warmup is an ERROR; LR rising after warmup and a warmup
    as long as the run are WARNINGs. Warmup ends at `training.warmup_steps` when given, else where
    the LR first went down, else (warmup into a constant LR) where it rose to the level it has then
    held for at least twice as many steps as the run had before. Cosine-with-restarts schedules rise
    on purpose: disable this rule."""

    PHASE_KEYS = frozenset({"enable"})
    epsilon: float = dataclasses.field(default=0.0, metadata=spec(ge=0, doc="an LR at or below counts as zero"))
    end_fraction: float = dataclasses.field(
        default=0.98, metadata=spec(gt=0, le=1, doc="LR 0 after this fraction of total_steps is the schedule's end"))


class LrSchedule:
    rule: ClassVar[str] = "lr_schedule"
    summary: ClassVar[str] = "LR schedule sanity"
    metric: ClassVar[str] = "learning_rate"
    requires: ClassVar[frozenset[str]] = frozenset({"learning_rate"})
    hint: ClassVar[str] = ("Check the LR schedule settings (warmup_steps, total_steps / decay steps, min_lr) "
                           "and, after a resume, that the optimizer's global step was restored.")

    ZERO_FRACTION: ClassVar[float] = 0.1  # zero for this fraction of the run so far: not the schedule's end
    # A warmup into a constant LR has ended once the LR has held its peak for this many samples and for
    # twice the steps before it. Twice: a staircase warmup never holds a level that long, nor does a
    # constant LR from the first step (no rise was seen) count as the end of a warmup.
    SETTLE_SAMPLES: ClassVar[int] = 10
    SETTLE_RATIO: ClassVar[float] = 2.0
    SAME: ClassVar[float] = 1e-6  # relative change below which two LR values are the same

    def __init__(self, p: LrScheduleParams, ctx: DetectorContext) -> None:
        self.ctx = ctx
        self.epsilon = p.epsilon
        self.end_fraction = p.end_fraction
        self.prev: float | None = None
        self.max_lr = 0.0
        self.peak_step: int | None = None  # where the LR first went down (inferred end of warmup)
        self.samples = 0
        self.zero_run = 0  # samples in a row at LR zero
        self.zero_since = 0  # step where the current run of zero LR began
        self.first_step: int | None = None
        self.rose = False  # the LR has gone up at least once (a warmup was seen)
        self.level_since = 0  # step where the LR reached the peak level it holds now
        self.level_samples = 0  # samples at that level
        self.settled_at: int | None = None  # inferred end of a warmup into a constant LR

    def expect_change(self) -> None:
        """The LR was changed on purpose (scale_lr): the next move is not a schedule bug."""
        self.prev = None

    def _zero(self, step: int, lr: float, prev: float | None, total: int | None,
              warmup: int | None) -> Finding | None:
        """LR at zero: a bug unless it is the end of the schedule."""
        if total is not None and warmup is not None and step > warmup:
            return Finding(Severity.ERROR, lr, self.epsilon,
                           f"learning rate is {lr:g} at step {step} of {total}, after warmup ended at step {warmup}")
        if prev is not None and prev > 0.1 * self.max_lr:
            return Finding(Severity.ERROR, lr, self.epsilon,
                           f"learning rate dropped to {lr:g} from {prev:.3g} (peak {self.max_lr:.3g}) in one sample")
        if self.max_lr <= self.epsilon and self.samples >= 10:
            return Finding(Severity.ERROR, lr, self.epsilon,
                           f"learning rate has been {lr:g} for all {self.samples} samples so far")
        if total is None and self.zero_run >= 10 and step - self.zero_since >= self.ZERO_FRACTION * step:
            # Decayed smoothly to zero: the end of the schedule, or a decay far shorter than the run.
            return Finding(Severity.WARNING, lr, self.epsilon,
                           f"learning rate has been {lr:g} since step {self.zero_since}: if the run is not about "
                           "to end, the schedule's decay is shorter than the run (set training.total_steps to "
                           "make this an ERROR)")
        return None

    def _warmup_end(self) -> int | None:
        if self.ctx.warmup_steps is not None:
            return self.ctx.warmup_steps
        return self.peak_step if self.peak_step is not None else self.settled_at

    def _track_level(self, step: int, lr: float, prev: float | None) -> None:
        """Infer the end of a warmup into a constant LR (see SETTLE_SAMPLES)."""
        if self.first_step is None:
            self.first_step = step
        same = self.SAME
        if prev is not None and lr > prev * (1 + same):
            self.rose = True
        if prev is not None and abs(lr - prev) <= same * prev and lr >= self.max_lr * (1 - same):
            self.level_samples += 1
        else:
            self.level_since, self.level_samples = step, 1
        if (self.rose and self.level_samples >= self.SETTLE_SAMPLES
                and step - self.level_since >= self.SETTLE_RATIO * (self.level_since - self.first_step)):
            self.settled_at = self.level_since

    def update(self, s: Sample, p: RuleParams) -> Finding | None:
        lr = s.learning_rate
        if lr is None or not math.isfinite(lr):
            return SKIP
        self.samples += 1
        prev, self.prev = self.prev, lr
        if prev is not None and lr < prev and self.peak_step is None:
            self.peak_step = s.step
        self.max_lr = max(self.max_lr, lr)
        if self.settled_at is None and self.peak_step is None:
            self._track_level(s.step, lr, prev)
        total, warmup = self.ctx.total_steps, self._warmup_end()
        near_end = total is not None and s.step >= self.end_fraction * total
        if lr <= self.epsilon:
            if self.zero_run == 0:
                self.zero_since = s.step
            self.zero_run += 1
            if not near_end:
                found = self._zero(s.step, lr, prev, total, warmup)
                if found is not None:
                    return found
        else:
            self.zero_run = 0
        if prev is not None and warmup is not None and s.step > warmup and lr > prev * (1 + 1e-6):
            return Finding(Severity.WARNING, lr, prev,
                           f"learning rate rose from {prev:.3g} to {lr:.3g} after warmup ended at step {warmup}")
        cw = self.ctx.warmup_steps
        if cw is not None and total is not None and cw >= total:
            return Finding(Severity.WARNING, float(cw), float(total),
                           f"warmup_steps {cw} is not shorter than total_steps {total}: the LR never leaves warmup")
        rising = prev is not None and lr > prev * (1 + 1e-6)
        if rising and total is not None and self.peak_step is None and cw is None and s.step > total // 2:
            return Finding(Severity.WARNING, lr, self.max_lr,
                           f"learning rate is still rising at step {s.step} of {total}: is warmup as long as the run?")
        return None
