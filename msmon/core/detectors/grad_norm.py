"""Grad-norm rules: over an absolute threshold, exploding against its own baseline, creeping upward."""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

from msmon.contract.wire import Sample, Severity
from msmon.core.detectors.base import SKIP, DetectorContext, EarlyBaselineRule, Finding, RuleParams, Warmup, classify
from msmon.core.detectors.rolling import RollingQuantiles, SlidingFit, median
from msmon.core.spec import spec

_HINT = ("A growing grad norm comes before loss divergence. Save a checkpoint now; consider scaling the LR "
         "down (scale-lr 0.5) or tightening gradient clipping, and check the last data batches.")


@dataclasses.dataclass
class GradNormParams(RuleParams):
    """Absolute global grad norm (L2 over all gradients, before clipping).

    An absolute level means something only at the model's own scale. A run whose first sampled grad norm
    is already `out_of_scale` times the ERROR level or more (an fp16 run of a 100B model logs 10^4 to
    10^6 on healthy steps; the example's level is 10) was not what the level was set for: the rule stands
    down for this run, the job's log says so once with the numbers, and `grad_norm_spike` (the grad norm
    against its own median) still judges. A level set live (`set_threshold`, `loosen-threshold`) is judged
    again. A level exceeded less than that at the first sample (llm.c GPT-2 starts at 15 against 10)
    alerts from the first sample, as the level says. In the run's first `early_steps` steps a freshly
    initialised network's grad norm can start over the level and fall as it leaves its initialisation (GPT-2's
    is 15 for its first 4 steps against the example's 10): while it has been over the level from its first
    sample on, it alerts once it is also `early_rise` x the run's first grad norm, or has stayed over the level
    for 10 samples (a run that is over it, not leaving it); once under the level, the level applies as it
    says. A gross jump is `grad_norm_spike`'s, from its 2nd sample.
    """

    warning: float | None = dataclasses.field(
        default=None, metadata=spec(gt=0, doc="WARNING level; null: half the ERROR level"))
    error: float | None = dataclasses.field(
        default=None, metadata=spec(gt=0, doc="ERROR level (= alert.grad_norm_threshold); null: rule off"))
    consecutive: int = dataclasses.field(default=2, metadata=spec(ge=1, doc="samples in a row"))
    out_of_scale: float | None = dataclasses.field(default=100.0, metadata=spec(
        gt=1, le=1e12, doc="the run's first grad norm this many x the ERROR level: the level is not at this "
                           "model's scale and the rule stands down for the run (null: never)"))
    early_steps: int = dataclasses.field(default=300, metadata=spec(
        ge=0, le=1_000_000_000, doc="the run's first steps: a grad norm over the level but not over early_rise x "
                                   "the run's first one, for under 10 samples, is the network's initialisation"))
    early_rise: float = dataclasses.field(default=2.0, metadata=spec(
        gt=1, le=1e6, doc="in the first early_steps, the level judges a grad norm this many x the run's first"))

    def warning_level(self) -> float | None:
        if self.warning is not None:
            return self.warning
        return None if self.error is None else 0.5 * self.error


class GradNormThreshold:
    rule: ClassVar[str] = "grad_norm"
    EARLY_HOLD: ClassVar[int] = 10  # in the first early_steps: samples in a row over the level that are the run's
    summary: ClassVar[str] = "grad norm above an absolute threshold"
    metric: ClassVar[str] = "grad_norm"
    requires: ClassVar[frozenset[str]] = frozenset({"grad_norm"})
    hint: ClassVar[str] = _HINT

    def __init__(self, p: GradNormParams, ctx: DetectorContext) -> None:
        self.out_of_scale = p.out_of_scale
        self.early_steps, self.early_rise = p.early_steps, p.early_rise
        self.first = True  # no grad norm seen yet
        self.initial = 0.0  # the run's first grad norm
        self.early_over = 0  # samples over the level since the first, none under it (the initialisation's excess)
        self.down_at: float | None = None  # the ERROR level found out of this run's scale
        self.notice: str | None = None  # why it stood down, for the job's log (taken by the Monitor)

    def update(self, s: Sample, p: RuleParams) -> Finding | None:
        g = s.grad_norm
        if g is None or not math.isfinite(g):
            return SKIP
        err = p.levels[1]
        if self.first:
            self.first = False
            self.initial = g
            k = self.out_of_scale
            if k is not None and err is not None and g >= k * err:
                self.down_at = err
                self.notice = (f"grad_norm stands down for this run: its first grad norm {g:.4g} (step {s.step}) "
                               f"is {g / err:.3g}x the ERROR level {err:g}, so that level is not at this model's "
                               f"scale (out_of_scale: {k:g}x). grad_norm_spike still judges the grad norm against "
                               f"its own median; set grad_norm_threshold to this model's scale to use it.")
        if self.down_at is not None:
            if err == self.down_at:
                return None
            self.down_at = None  # a new level was set: judged as given
        level, thr = classify(g, p)
        if level is None:
            self.early_over = self.EARLY_HOLD  # under the level once: the initialisation is behind it
            return None
        if s.step < self.early_steps and self.early_over < self.EARLY_HOLD and g <= self.early_rise * self.initial:
            self.early_over += 1  # over the level from the first sample on: leaving its initialisation, as far
            return None  # as it can tell yet (see GradNormParams)
        return Finding(level, g, thr, f"grad norm {g:.4g} is over the threshold {thr:g}", absolute=True)


@dataclasses.dataclass
class GradNormSpikeParams(RuleParams):
    """Grad norm as a multiple of its rolling median: an explosion, whatever the model's scale."""

    warning: float | None = dataclasses.field(default=4.0, metadata=spec(gt=1, doc="x the rolling median"))
    error: float | None = dataclasses.field(default=10.0, metadata=spec(gt=1, doc="x the rolling median"))
    consecutive: int = dataclasses.field(default=2, metadata=spec(ge=1, doc="samples in a row"))
    window: int = dataclasses.field(default=100, metadata=spec(ge=10, doc="samples in the rolling baseline"))
    gross: float | None = dataclasses.field(
        default=10.0, metadata=spec(gt=1, doc="x the recent median: an ERROR from the 5th sample on, at full "
                                              "strength while the baseline is young or in warmup; null: off"))


class GradNormSpike(EarlyBaselineRule):
    rule: ClassVar[str] = "grad_norm_spike"
    summary: ClassVar[str] = "grad norm x its rolling median"
    metric: ClassVar[str] = "grad_norm"
    requires: ClassVar[frozenset[str]] = frozenset({"grad_norm"})
    hint: ClassVar[str] = _HINT

    def __init__(self, p: GradNormSpikeParams, ctx: DetectorContext) -> None:
        super().__init__(p.window, ctx.warmup_steps)
        self.gross = p.gross

    def score(self, x: float, w: RollingQuantiles) -> tuple[float, float]:
        med = w.median()
        return (x / med if med > 0.0 else 0.0), med

    def gross_ratio(self, x: float, w: RollingQuantiles) -> float:
        return self.score(x, w)[0]

    def update(self, s: Sample, p: RuleParams) -> Finding | None:
        g = s.grad_norm
        if g is None or not math.isfinite(g) or g <= 0.0:
            return SKIP
        j = self.assess(g, s, p, self.gross)
        if j is None:
            return None
        what = {"gross": "gross jump; threshold", "held": "not returned; resolves below",
                "level": "threshold"}[j.kind]
        before = "its median before the rise" if j.kind == "held" else "its recent median"
        return Finding(j.level, j.score, j.threshold,
                       f"grad norm {g:.4g} is {j.score:.1f}x {before} {j.base:.4g} ({what} {j.threshold:.3g}x)",
                       j.base, absolute=j.kind == "gross")


@dataclasses.dataclass
class GradNormCreepParams(RuleParams):
    """A sustained rise of the grad norm, on two horizons.

    Recent: a least-squares line through log(grad norm) over the last `window` samples; the value is
    exp(slope x span), how many times larger the trend line ends than it began, counted only when the
    rise is statistically clear (t-statistic of the slope >= `min_t`). One-step blips barely move the
    fit; a steady climb does, tens of minutes before the threshold is crossed.
    Long: the median of the last `window` samples against a reference, the median of the first
    `window` samples after warmup, renewed every `long_window` samples while the rule is quiet (a
    drift slower than that, as when the LR decays, is absorbed); counted while the recent fit rises.
    `long_warning` / `long_error` are those factors.
    Neither horizon looks at the run's first `early_steps` steps: a freshly initialised network's grad norm
    rises (or falls) for tens to hundreds of steps as it leaves its initialisation, which is no creep.
    A rise while the loss falls fast is learning, not a creep (a small LM leaving its plateau: the loss 5.47 ->
    4.67 while the grad norm rises 3-15x and settles): when the median loss of the last `window` / 5 samples is
    `learning` (a fraction) below the median of the `window` before them, by 3 standard errors of that median at
    least, and twice as far as the loss fell over the window before that (the descent sped up, as when a plateau
    is left; a run's steady decline does not), nothing is reported, and the rise becomes the new normal (the fit
    starts over, the long reference is taken again). A creep is a rise while the loss
    stops improving or rises (the 13B case: the loss flat at 1.82, the grad norm climbing for 40 minutes).
    """

    warning: float | None = dataclasses.field(default=1.5, metadata=spec(gt=1, doc="rise factor over the window"))
    error: float | None = dataclasses.field(default=3.0, metadata=spec(gt=1, doc="rise factor over the window"))
    window: int = dataclasses.field(default=50, metadata=spec(ge=10, doc="samples in the trend fit"))
    min_t: float = dataclasses.field(default=4.0, metadata=spec(gt=0, doc="t-statistic the rise must reach"))
    jump: float = dataclasses.field(
        default=3.0, metadata=spec(gt=1, doc="a sample this many x above the trend line is a jump, not creep"))
    long_warning: float | None = dataclasses.field(
        default=2.0, metadata=spec(gt=1, doc="recent median x the long reference for WARNING (null: off)"))
    long_error: float | None = dataclasses.field(
        default=3.0, metadata=spec(gt=1, doc="recent median x the long reference for ERROR (null: off)"))
    long_window: int = dataclasses.field(
        default=1000, metadata=spec(ge=10, doc="samples a long reference is kept before it is renewed"))
    early_steps: int = dataclasses.field(default=300, metadata=spec(
        ge=0, le=1_000_000_000, doc="the run's first steps, where a grad norm rising out of its initialisation is "
                                   "normal: no trend is fitted over them (grad_norm_spike's gross jumps still judge)"))
    learning: float | None = dataclasses.field(default=0.01, metadata=spec(
        gt=0, le=0.99, doc="the loss's median over the last window/5 samples this fraction below the window before "
                           "(and clearly, and twice its fall before): a rise of the grad norm is learning, not a "
                           "creep, and its level the new normal (null: off)"))


class GradNormCreep:
    rule: ClassVar[str] = "grad_norm_creep"
    summary: ClassVar[str] = "sustained rise of the grad norm"
    metric: ClassVar[str] = "grad_norm"
    requires: ClassVar[frozenset[str]] = frozenset({"grad_norm"})
    hint: ClassVar[str] = ("The grad norm has been climbing steadily: the early sign of a coming divergence. "
                           "Save a checkpoint; scaling the LR down now is cheaper than a rollback later.")

    JUMP_RESET = 5  # jumps in a row: a new level; the fit starts over
    ACCEL = 2.0  # learning: the loss's fall over the last window this many x its fall over the window before
    LOG_CLIMB = math.log(1.05)  # the long horizon counts while the recent fit rises this much over its window

    def __init__(self, p: GradNormCreepParams, ctx: DetectorContext) -> None:
        self.early_steps = p.early_steps
        self.fit = SlidingFit(p.window)
        self.min_t = p.min_t
        self.full = p.window
        self.log_jump = math.log(p.jump)
        self.trend_end: float | None = None  # log grad norm at the end of the last fit
        self.jumps = 0
        self.recent = RollingQuantiles(p.window)
        self.warmup = Warmup(ctx.warmup_steps)
        self.long_levels = (p.long_warning, p.long_error)
        self.long_window = p.long_window
        self.post_warmup = 0  # samples since warmup ended
        self.reference: float | None = None  # long reference (a median grad norm)
        self.reference_step = 0
        self.reference_age = 0  # samples since the reference was taken
        self.long_firing = False
        self.learning = p.learning
        self.recent_n = max(p.window // 5, 3)
        self.in_phase = False  # a learning phase was seen and the loss has kept falling fast since
        self.ctx = ctx  # its `recent` samples: the losses _learning reads (none: no learning phase is read)

    def update(self, s: Sample, p: RuleParams) -> Finding | None:
        g = s.grad_norm
        if g is None or not math.isfinite(g) or g <= 0.0:
            return SKIP
        if s.step < self.early_steps:
            return None  # leaving its initialisation, the grad norm rises and falls by itself
        y = math.log(g)
        if self.trend_end is not None and y - self.trend_end > self.log_jump:
            # A sudden jump is the spike and threshold rules' business; kept out, it cannot fake a trend.
            self.jumps += 1
            if self.jumps >= self.JUMP_RESET:
                self.fit.clear()
                self.trend_end = None
            return None
        self.jumps = 0
        self.fit.add(float(s.step), y)
        self.recent.add(g)
        short, long = self._recent(p), self._long(s)
        if short is None or (long is not None and long.level is not None and short.level is not None
                             and long.level.rank > short.level.rank):
            if long is None:
                return None
            short = long
        if self._learning():
            self._new_normal()
            return None
        return short

    def _learning(self) -> bool:
        """Whether the loss is falling fast now (see GradNormCreepParams): the median of its last `window` / 5 samples
        `learning` below the median of the `window` before them, and clearly (3 standard errors of that median, from
        the window's own fluctuation), and twice as far as over the `window` before that when the phase begins."""
        k, recent = self.learning, self.ctx.recent
        need = 2 * self.full + self.recent_n  # two windows and the last window / 5 samples
        if k is None or recent is None or len(recent) < min(need, recent.maxlen or need):
            return False
        v = [x for x in (s.loss for s in list(recent)[-need:]) if x is not None and x - x == 0.0]
        if len(v) < min(need, len(recent)) * 9 // 10:  # losses missing or NaN: not enough to tell
            return False
        r = self.recent_n
        w = (len(v) - r) // 2
        old, mid, now = median(v[:w]), median(v[w:2 * w]), median(v[2 * w:])
        if old <= 0.0 or mid <= 0.0:
            return False
        # the loss's fluctuation from one sample to the next (its trend left out): robust sigma of the differences
        q = sorted(v[i + 1] - v[i] for i in range(w, 2 * w - 1))
        se = (q[(3 * len(q)) // 4] - q[len(q) // 4]) / 1.349 / math.sqrt(2.0 * r)
        fall = (mid - now) / mid
        # a phase goes on while the loss keeps falling that fast; it begins where its fall sped up
        accel = self.in_phase or fall >= self.ACCEL * (old - mid) / old
        self.in_phase = fall >= k and fall * mid >= 3.0 * se and accel
        return self.in_phase

    def _new_normal(self) -> None:
        """A learning phase: its grad norm level is the new normal; the fit starts over, the long reference is
        taken again."""
        self.fit.clear()
        self.trend_end = None
        self.reference, self.reference_age, self.post_warmup, self.long_firing = None, 0, 0, False

    def acknowledge(self) -> bool:
        """A person acknowledged the creep: the grad norm's level now is the new normal. The fit starts over and
        the long reference is taken again after `window` samples; whether the long horizon was firing."""
        was = self.long_firing
        self._new_normal()
        return was

    def _recent(self, p: RuleParams) -> Finding | None:
        """The short horizon: the fitted rise over the last `window` samples."""
        f = self.fit
        n = f.n
        if n < self.full // 2 or (n >= self.full and self.trend_end is not None and not f.rising()):
            return None
        res = f.fit()
        if res is None:
            return None
        slope, at_end, t = res
        self.trend_end = at_end
        if slope <= 0.0 or n < self.full or t < self.min_t:
            return None
        rise = math.exp(slope * f.span)
        level, thr = classify(rise, p)
        if level is None:
            return None
        start = math.exp(at_end - slope * f.span)
        return Finding(level, rise, thr,
                       f"grad norm has crept up {rise:.2f}x over the last {f.span:.0f} steps "
                       f"(trend {start:.3g} -> {math.exp(at_end):.3g}; threshold {thr:g}x)", start)

    def _climbing(self) -> bool:
        """Whether the recent fit still rises, clearly and by `CLIMB` at least over its window: a creep in
        progress (a level that jumped and then held flat is the spike rule's, not a creep)."""
        f = self.fit
        if f.n < self.full or not f.rising():
            return False
        res = f.fit()
        return res is not None and res[2] >= 0.5 * self.min_t and res[0] * f.span >= self.LOG_CLIMB

    def _long(self, s: Sample) -> Finding | None:
        """The long horizon: the recent median against the reference taken after warmup."""
        if self.warmup.at(s):
            return None
        self.post_warmup += 1
        self.reference_age += 1
        renew = self.reference_age >= self.long_window and not self.long_firing
        if (self.reference is None and self.post_warmup >= self.full) or renew:
            self.reference, self.reference_step, self.reference_age = self.recent.median(), s.step, 0
            return None
        ref = self.reference
        self.long_firing = False
        if ref is None or ref <= 0.0 or self.reference_age < self.full or not self._climbing():
            return None
        now = self.recent.median()
        ratio = now / ref
        lw, le = self.long_levels
        thr = le if le is not None and ratio >= le else lw if lw is not None and ratio >= lw else None
        if thr is None:
            return None
        self.long_firing = True
        level = Severity.ERROR if thr is le else Severity.WARNING
        return Finding(level, ratio, thr,
                       f"grad norm has crept up {ratio:.2f}x over {s.step - self.reference_step} steps: median "
                       f"{now:.3g} over the last {self.recent.n} samples vs {ref:.3g} at step "
                       f"{self.reference_step} (long horizon; threshold {thr:g}x)", ref)
