"""Learning-rate changes the job did not announce, and schedule bugs (LR 0 after warmup, warmup as long as the run)."""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from typing import ClassVar

from msmon.contract.wire import Sample, Severity
from msmon.core.detectors.base import SKIP, DetectorContext, Finding, RuleParams
from msmon.core.detectors.rolling import median
from msmon.core.spec import spec


@dataclasses.dataclass
class LrScheduleParams(RuleParams):
    """An LR change the job did not announce, and schedule bugs.

    - An unannounced rise (WARNING at its sample; ERROR once the loss or the grad norm reacts): a rise
      above every LR seen so far after the LR had stopped rising (a constant LR that jumps, a creep
      after warmup or during the decay), or, while the LR rises (warmup), a step `jump` x above the
      line through the last two samples. No warmup or declared schedule is needed: constant, step,
      cosine, linear and WSD schedules never rise above their peak once it is behind them, and a
      restart that climbs back to a level already seen is a restart. The alert holds until the LR is
      back within `jump` of what it was before the change, or a person acknowledges it, or the job
      announces a change (`scale-lr`, `note_lr_change`). Before `training.warmup_steps` rises are the
      configured warmup's.
    - LR at zero after warmup is an ERROR; a warmup as long as the run is a WARNING.
    """

    PHASE_KEYS = frozenset({"enable"})
    epsilon: float = dataclasses.field(default=0.0, metadata=spec(ge=0, doc="an LR at or below counts as zero"))
    end_fraction: float = dataclasses.field(
        default=0.98, metadata=spec(gt=0, le=1, doc="LR 0 after this fraction of total_steps is the schedule's end"))
    jump: float = dataclasses.field(default=0.2, metadata=spec(
        gt=0, le=100, doc="a rise this fraction above the schedule's line (or its peak) is a change"))
    react_grad: float = dataclasses.field(default=3.0, metadata=spec(
        gt=1, le=1e6, doc="after a change, the grad norm this many x its median before it: ERROR"))
    react_loss: float = dataclasses.field(default=1.5, metadata=spec(
        gt=1, le=1e6, doc="after a change, the loss this many x its median before it: ERROR"))


class LrSchedule:
    rule: ClassVar[str] = "lr_schedule"
    summary: ClassVar[str] = "unannounced LR change, LR schedule sanity"
    metric: ClassVar[str] = "learning_rate"
    requires: ClassVar[frozenset[str]] = frozenset({"learning_rate"})
    hint: ClassVar[str] = ("The LR changed without a scale-lr or note_lr_change: check the LR schedule settings "
                           "(warmup_steps, total_steps / decay steps, min_lr) and, after a resume, that the "
                           "optimizer's LR and global step were restored. If the new LR is intended, acknowledge it.")

    ZERO_FRACTION: ClassVar[float] = 0.05  # zero for this fraction of the run so far: not the schedule's end
    ZERO_SAMPLES: ClassVar[int] = 3  # ... and this many samples in a row
    # A warmup into a constant LR has ended once the LR has held its peak for this many samples and for
    # twice the steps before it (for the LR-zero check: an LR at zero after warmup is an ERROR).
    SETTLE_SAMPLES: ClassVar[int] = 10
    SETTLE_RATIO: ClassVar[float] = 2.0
    SAME: ClassVar[float] = 1e-6  # relative change below which two LR values are the same
    FLAT: ClassVar[int] = 5  # samples without a new highest LR: it has settled (a rise above that peak is a change)
    JUMP_RATE: ClassVar[float] = 3.0  # while rising: a rise this many x as steep as the recent ones is a change
    OVER_PEAK: ClassVar[float] = 0.01  # once the LR stopped rising, a rise this fraction above its peak is a change
    RECENT: ClassVar[int] = 20  # recent rises and LRs kept: what a warmup's steps look like, where the LR just was
    FIRST: ClassVar[float] = 2.5  # the LR's first rise, up to this many x, in its first RECENT samples: warmup
    RESTART: ClassVar[float] = 0.9  # once settled, a rise back to this fraction of the peak or more is a restart
    RESTART_LOW: ClassVar[float] = 0.3  # ... and from the bottom of a decay (BOTTOM), to this fraction, see _restart
    BOTTOM: ClassVar[float] = 0.1
    REACT: ClassVar[int] = 5  # loss and grad norm samples before a change: their reference (median)

    def __init__(self, p: LrScheduleParams, ctx: DetectorContext) -> None:
        self.ctx = ctx
        self.epsilon = p.epsilon
        self.end_fraction = p.end_fraction
        self.jump = p.jump
        self.react = (p.react_grad, p.react_loss)
        self.prev: float | None = None
        self.prev_step = 0
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
        self.since_max = 0  # samples since the highest LR rose (FLAT or more: settled)
        self.hold = 0  # the longest the LR held between two rises of its warmup (a staircase's stair), in samples
        self.settle = self.FLAT  # samples without a new highest LR that make it settled: FLAT, 2 x hold at least
        self.rose_once = False  # the LR has risen above its first level
        self.restart_lr = math.inf  # the level of the last warm restart read as one (see _restart)
        self.first_change = 0  # the step of the change held when another came
        self.held_lr = 0.0  # held: the highest LR since the change (a further jump above it is a change of its own)
        self.announced = 0  # samples left in which an LR change is the job's own (scale_lr, note_lr_change)
        self.before: float | None = None  # held: the LR before the unannounced change (it resolves on return)
        self.change_step = 0
        self.rates: deque[float] = deque(maxlen=self.RECENT)  # recent rises per step (0 when it did not rise)
        self.lrs: deque[float] = deque(maxlen=self.RECENT)
        self.losses: deque[float] = deque(maxlen=self.REACT)  # recent values before a change
        self.grads: deque[float] = deque(maxlen=self.REACT)
        self.ref_loss: float | None = None  # their medians when the change came
        self.ref_grad: float | None = None

    ANNOUNCE_SAMPLES: ClassVar[int] = 5  # an announced change must show within this many samples

    def expect_change(self) -> None:
        """The LR was changed on purpose (scale_lr, note_lr_change): the next move is not a change to report, and
        a change held now is the job's (released)."""
        self.announced = self.ANNOUNCE_SAMPLES
        self._release()

    def acknowledge(self) -> bool:
        """A person acknowledged the alert: the LR now is intended (the new peak); whether a change was held."""
        held = self.before is not None
        self._release()
        return held

    def _release(self, accept: bool = True) -> None:
        """No change held any more; `accept`: the LR now is intended (its level joins the schedule's)."""
        if accept and self.before is not None and self.prev is not None:
            self.max_lr = max(self.max_lr, self.prev)
        self.before = self.ref_loss = self.ref_grad = None

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
        if total is None and self.peak_step is not None and self.zero_run >= self.ZERO_SAMPLES and (
                step - self.zero_since >= self.ZERO_FRACTION * step):
            # Decayed smoothly to zero: the end of the schedule, or a decay far shorter than the run (llm.c's GPT-2
            # ends its decay at 0 350 steps before its last, 1.8% of the run).
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
        prev_step, self.prev_step = self.prev_step, s.step
        if prev is not None and lr < prev and self.peak_step is None:
            self.peak_step = s.step
        if self.settled_at is None and self.peak_step is None:
            self._track_level(s.step, lr, prev)
        total = self.ctx.total_steps or self.ctx.job_steps  # declared, else what the job says it will run
        change = self._change(s, lr, prev, prev_step)
        if lr <= self.epsilon:
            if self.zero_run == 0:
                self.zero_since = s.step
            self.zero_run += 1
            if not (total is not None and s.step >= self.end_fraction * total):  # not near the end
                found = self._zero(s.step, lr, prev, total, self._warmup_end())
                if found is not None:
                    return found
        else:
            self.zero_run = 0
        if change is not None:
            return change
        cw = self.ctx.warmup_steps
        if cw is not None and total is not None and cw >= total:
            return Finding(Severity.WARNING, float(cw), float(total),
                           f"warmup_steps {cw} is not shorter than total_steps {total}: the LR never leaves warmup")
        if (cw is None and self.peak_step is None and total is not None and s.step > total // 2 and self.rose
                and not self._settled()):  # still rising (a staircase's stairs included)
            return Finding(Severity.WARNING, lr, self.max_lr,
                           f"learning rate is still rising at step {s.step} of {total}: is warmup as long as the run?")
        return None

    def _change(self, s: Sample, lr: float, prev: float | None, prev_step: int) -> Finding | None:
        """An unannounced rise, found now or held since (see LrScheduleParams); None otherwise.

        Two modes. Rising (a new highest LR within the last FLAT samples: a warmup): a rise is a change when its
        rate per step is JUMP_RATE x the steepest of the recent rises or more (a quantized log's uneven steps are
        not). Settled (no new highest for FLAT samples): the peak is frozen, and any LR above it by OVER_PEAK is a
        change, whether it jumped or crept there; a rise back to it (a restart, a return from a dip) is not."""
        dstep = s.step - prev_step
        rate = 0.0 if prev is None or dstep <= 0 else (lr - prev) / dstep
        try:
            return self._judge_change(s, lr, prev, rate)
        finally:  # the recent rises and LRs take this sample after it was judged against them
            self.rates.append(max(rate, 0.0))
            self.lrs.append(lr)

    def _judge_change(self, s: Sample, lr: float, prev: float | None, rate: float) -> Finding | None:
        """`_change` with this sample not yet in the recent rises and LRs (their maxima, a pass over them each, are
        taken only where a decision needs them)."""
        if self.announced:
            self.announced -= 1
            if prev is not None and abs(lr - prev) > self.SAME * prev:
                self.announced = 0  # the job's own change: the new normal
                self.max_lr, self.since_max = lr, 0
                self._remember(s)
                return None
        if self.before is not None:
            return self._held(s, lr, prev, rate)
        settled = self.since_max >= self.settle
        new_high = lr > self.max_lr * (1 + self.SAME)
        cw = self.ctx.warmup_steps
        if prev is None or self.samples < 3 or (cw is not None and s.step <= cw) or new_high and (
                self.max_lr <= 0.0 or not self.rose_once and self.samples <= self.RECENT and lr <= prev * self.FIRST):
            # the LR's first rise from zero, or in the run's first samples: a warmup starting (a staircase's first
            # stair)
            if prev is not None and new_high:
                self.rose_once = True
                self._held_for(self.since_max)
            self.since_max = 0 if new_high else self.since_max + 1
            self.max_lr = max(self.max_lr, lr)
            self._remember(s)
            return None
        steepest = 0.0
        if not new_high:  # below the peak: a change only if it jumped to a level neither recent nor the peak's
            self.since_max += 1
            change = (settled and lr > prev * (1 + self.jump) and lr > max(self.lrs, default=lr) * (1 + self.OVER_PEAK)
                      and lr < self.RESTART * self.max_lr and not self._restart(lr, prev))
        elif settled:  # above the peak; a restart from the bottom of a decay to just above it is a restart (the
            # first peak was between two samples, never seen: a warmup's top at step_interval 10)
            over = lr > self.max_lr * (1 + self.OVER_PEAK)
            change = over and not (lr <= self.max_lr * (1 + self.jump) and self._restart(lr, prev))
        else:
            steepest = max(self.rates, default=0.0)
            change = lr > prev * (1 + self.jump) and rate > self.JUMP_RATE * steepest
        if not change:
            if new_high and not settled:  # warmup goes on; a settled peak stays where it was
                self._held_for(self.since_max)
                self.since_max, self.max_lr = 0, lr
            self._remember(s)
            return None
        return self._changed(s, lr, prev, rate, new_high, settled, steepest)

    def _restart(self, lr: float, prev: float) -> bool:
        """A warm restart whose peaks decay (SGDR with a restart decay: 0.8, 0.64, ... of the first peak): from the
        bottom of a decay (at most BOTTOM x the peak) back up to RESTART_LOW x the peak or more, and not above the
        last restart's level. The first restart and every later one are judged so; a jump from the bottom of a decay
        into that band is read as a restart too (the known price)."""
        peak = self.max_lr
        if prev > self.BOTTOM * peak or lr < self.RESTART_LOW * peak or lr > self.restart_lr * (1 + self.OVER_PEAK):
            return False
        self.restart_lr = lr
        self.max_lr = max(peak, lr)  # a peak between two samples, never seen before: this is it
        return True

    def _settled(self) -> bool:
        """No new highest LR for FLAT samples, and for twice the longest hold between two rises of the warmup (the
        stairs of a warmup logged per micro-step, or updated every k steps, are holds of k samples)."""
        return self.since_max >= self.settle

    def _held_for(self, samples: int) -> None:
        """The warmup's LR held `samples` between two rises (a stair): settled takes twice the longest."""
        if samples > self.hold:
            self.hold = samples
            self.settle = max(self.FLAT, 2 * samples)

    def _changed(self, s: Sample, lr: float, prev: float, rate: float, new_high: bool, settled: bool,
                 steepest: float, again: bool = False) -> Finding:
        """An unannounced change found at `s`: held from here on (a further one while it is held is reported too)."""
        if not again:
            self.before = prev
            self.ref_loss = _median(self.losses)
            self.ref_grad = _median(self.grads)
        self.change_step, self.held_lr = s.step, lr
        how = ("to a level it had not been at" if not new_high
               else f"above the {self.max_lr:.3g} it had settled at" if settled
               else f"a rise {rate / steepest:.3g}x as steep as the warmup's" if steepest > 0.0 else "")
        return Finding(Severity.WARNING, lr, prev,
                       f"learning rate changed from {prev:.3g} to {lr:.3g} at step {s.step} ({_times(lr, prev)}"
                       + (f", {how}" if how else "") + ") and no change was announced (scale-lr, note_lr_change)"
                       + (f"; a change of its own on top of the one at step {self.first_change}" if again else ""),
                       new=again)

    def _remember(self, s: Sample) -> None:
        if s.loss is not None and math.isfinite(s.loss):
            self.losses.append(s.loss)
        if s.grad_norm is not None and math.isfinite(s.grad_norm) and s.grad_norm > 0.0:
            self.grads.append(s.grad_norm)

    def _held(self, s: Sample, lr: float, prev: float | None, rate: float) -> Finding | None:
        before = self.before
        assert before is not None
        if lr <= before * (1 + self.jump):
            self._release(accept=False)
            self._remember(s)
            return None
        if (prev is not None and lr > self.held_lr * (1 + self.jump) and lr > prev * (1 + self.jump)
                and rate > self.JUMP_RATE * max(self.rates, default=0.0)):
            # another jump while the first is held: its own alert, at its step (a held alarm, right or wrong, must not
            # hide it), judged against the loss and grad norm from before the first
            self.first_change = self.change_step
            return self._changed(s, lr, prev, rate, True, True, 0.0, again=True)
        self.held_lr = max(self.held_lr, lr)
        level, why = Severity.WARNING, ""
        kg, kl = self.react
        for what, x, ref, k in (("grad norm", s.grad_norm, self.ref_grad, kg), ("loss", s.loss, self.ref_loss, kl)):
            if x is not None and ref and ref > 0.0 and (not math.isfinite(x) or x >= k * ref):
                level, why = Severity.ERROR, f"; the {what} {x:.4g} is {x / ref:.3g}x its {ref:.4g} before"
                break
        return Finding(level, lr, before,
                       f"learning rate is {lr:.3g} since step {self.change_step}, {_times(lr, before)} the "
                       f"{before:.3g} before it, unannounced{why} (resolves when it is back, on an acknowledgement or "
                       "an announced change)")


def _times(x: float, ref: float) -> str:
    return f"{x / ref:.3g}x" if ref > 0.0 else "up from zero"


def _median(xs: deque[float]) -> float | None:
    return median(xs) if xs else None
