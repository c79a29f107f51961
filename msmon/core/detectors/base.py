"""What every rule shares: its parameters, what it reports, and the Detector protocol.

Detectors are pure: fed one `Sample` at a time, no I/O, no clock. All of them measure a value in
their own unit where *higher is worse*, and compare it with a WARNING and an ERROR level.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Iterator
from typing import Any, ClassVar, Protocol

from msmon.contract.wire import Sample, Severity
from msmon.core.detectors.rolling import RollingQuantiles
from msmon.core.spec import spec


@dataclasses.dataclass
class RuleParams:
    """The knobs every rule has. Subclasses set their own defaults and add their own keys."""

    enable: bool = dataclasses.field(default=True, metadata=spec(doc="run this rule"))
    warning: float | None = dataclasses.field(default=None, metadata=spec(doc="WARNING level (null: off)"))
    error: float | None = dataclasses.field(default=None, metadata=spec(doc="ERROR level (null: off)"))
    consecutive: int = dataclasses.field(
        default=1, metadata=spec(ge=1, doc="sampled steps in a row over a level before it alerts"))

    # Keys a phase may override; the others shape a detector's memory and are fixed for the run.
    PHASE_KEYS: ClassVar[frozenset[str]] = frozenset({"enable", "warning", "error", "consecutive"})

    def __setattr__(self, name: str, value: Any) -> None:
        # Levels are read on every sample: keep them resolved (defaults derived from the other
        # level included), also when changed live (loosen-threshold).
        object.__setattr__(self, name, value)
        if name in ("warning", "error"):
            object.__setattr__(self, "levels", (self.warning_level(), self.error_level()))

    levels: tuple[float | None, float | None] = dataclasses.field(
        default=(None, None), init=False, repr=False, compare=False, metadata={"internal": True})

    def __post_init__(self) -> None:
        object.__setattr__(self, "levels", (self.warning_level(), self.error_level()))

    def warning_level(self) -> float | None:
        return self.warning

    def error_level(self) -> float | None:
        return self.error

    def check(self) -> Iterator[tuple[str, str]]:
        w, e = self.warning_level(), self.error_level()
        if w is not None and e is not None and e < w:
            yield "error", f"the ERROR level ({e:g}) must not be below the WARNING level ({w:g})"


class Finding:
    """A rule's verdict on one sample: over a level (or not), with the numbers behind it."""

    __slots__ = ("level", "value", "threshold", "message", "baseline", "absolute", "new")

    def __init__(
        self,
        level: Severity | None,
        value: float,
        threshold: float,
        message: str,
        baseline: float | None = None,
        absolute: bool = False,
        new: bool = False,
    ) -> None:
        self.level = level
        self.value = value
        self.threshold = threshold
        self.message = message
        self.baseline = baseline
        # Judged against a level that needs no learned baseline (an absolute level set by the user, a
        # gross jump): it alerts from the first sampled step, even inside an explicit `baseline_steps`.
        self.absolute = absolute
        # A finding of its own inside a firing episode (a second LR change while the first is held): the gate sends
        # it as a new alert, not as a reminder of the one firing.
        self.new = new

    def __repr__(self) -> str:
        return f"Finding({self.level}, value={self.value:.4g}, threshold={self.threshold:.4g})"


_NONE: tuple[None, float] = (None, float("nan"))

# Returned when a sample has nothing for a rule to judge (its metric absent, NaN or Inf): the
# rule's alert state stays as it was. `None` means "judged, and normal", which counts toward
# resolving an alert; a NaN loss must not resolve a loss-spike alert.
SKIP = Finding(None, float("nan"), float("nan"), "no data")


def classify(value: float, p: RuleParams) -> tuple[Severity | None, float]:
    """The level `value` reaches under `p`, and the level's threshold (nan when none is reached)."""
    w, e = p.levels
    if e is not None and value >= e:
        return Severity.ERROR, e
    if w is not None and value >= w:
        return Severity.WARNING, w
    return _NONE


class Warmup:
    """Whether a sample is in the LR warmup, from the run's own LR curve: before `training.warmup_steps`
    when it is given, else while the LR is still rising (a new high within the last `SETTLE` samples).
    A run with no LR, or a constant LR from its first sample, has no warmup."""

    __slots__ = ("steps", "peak", "rose", "since_peak", "over")

    SETTLE: ClassVar[int] = 5  # samples without a new LR high: warmup is over
    SAME: ClassVar[float] = 1e-6  # relative rise below which the LR has not risen

    def __init__(self, warmup_steps: int | None) -> None:
        self.steps = warmup_steps
        self.peak = 0.0
        self.rose = False
        self.since_peak = 0
        self.over = False

    def at(self, s: Sample) -> bool:
        if self.steps is not None:
            return s.step < self.steps
        if self.over:
            return False
        lr = s.learning_rate
        if lr is None or not math.isfinite(lr):
            return False
        if lr > self.peak * (1.0 + self.SAME):
            self.rose = self.rose or self.peak > 0.0
            self.peak, self.since_peak = lr, 0
        else:
            self.since_peak += 1
            self.over = self.since_peak >= self.SETTLE
        return self.rose and not self.over


class Judged:
    """A baseline rule's verdict on a value that reached a level (see `BaselineRule.judge`)."""

    __slots__ = ("level", "threshold", "score", "base", "kind")

    def __init__(self, level: Severity, threshold: float, score: float, base: float, kind: str) -> None:
        self.level, self.threshold, self.score, self.base = level, threshold, score, base
        self.kind = kind  # "level": over a (scaled) level; "gross": a gross jump; "held": not yet returned


class BaselineRule:
    """The shared shape of rules that score a value against a rolling baseline of normal values.

    Until `min_samples` values are in, everything is learned and nothing is judged. After that a
    value that reaches no level is learned, one that does is not: a spike never becomes the new
    normal. Subclasses say how a value scores against the window (`score`).
    """

    __slots__ = ("window", "min_samples")

    def __init__(self, size: int) -> None:
        self.window = RollingQuantiles(size)
        self.min_samples = max(10, size // 5)

    def score(self, x: float, w: RollingQuantiles) -> tuple[float, float]:
        """(score in the rule's unit, the baseline it was measured against)."""
        raise NotImplementedError

    def judge(self, x: float, p: RuleParams) -> tuple[Severity, float, float, float] | None:
        """(level, threshold, score, baseline) when `x` reaches a level, else None (and x is learned)."""
        w = self.window
        if w.n < self.min_samples:
            w.add(x)
            return None
        score, base = self.score(x, w)
        lw, le = p.levels
        if le is not None and score >= le:
            return Severity.ERROR, le, score, base
        if lw is not None and score >= lw:
            return Severity.WARNING, lw, score, base
        w.add(x)
        return None


def scaled(p: RuleParams, k: float) -> RuleParams:
    """A copy of `p` whose levels are k times its own (for the looser levels of a young baseline)."""
    q = copy.copy(p)
    w, e = p.levels
    object.__setattr__(q, "levels", (None if w is None else w * k, None if e is None else e * k))
    return q


class EarlyBaselineRule(BaselineRule):
    """A baseline rule that is not blind early on and does not learn a shift (loss_spike, grad_norm_spike).

    - After `GROSS_AFTER` values a gross jump (`gross_ratio` at least the rule's `gross`) is an ERROR.
    - After `min_samples` values (tens, not hundreds) the score is judged against the levels, looser
      while the baseline is young (x up to 1 + `YOUNG`, shrinking as the window fills) and during the LR
      warmup (x `WARMUP`); full levels once the window is full and warmup is over.
    - A value that reaches no level is learned, one that does is not: a spike never becomes the new normal.
    - Once a level has been reached `consecutive` times in a row the rule *holds*: nothing is learned,
      and a value still at `RETURN` x the WARNING level or more is reported (a WARNING, "not returned")
      until the value comes back below it. A shift to a new level stays visible against the
      pre-shift reference while it lasts, until the value returns or a person acknowledges the alert
      (`acknowledge`: the new level is learned as the normal).
    Subclasses say what a gross jump is (`gross_ratio`).
    """

    __slots__ = ("warmup", "hits", "held")

    GROSS_AFTER: ClassVar[int] = 1
    YOUNG: ClassVar[float] = 1.0
    WARMUP: ClassVar[float] = 1.5
    RETURN: ClassVar[float] = 0.5

    def __init__(self, size: int, warmup_steps: int | None = None) -> None:
        super().__init__(size)
        self.warmup = Warmup(warmup_steps)
        self.hits = 0  # samples in a row at a level
        self.held = False  # firing: the reference is frozen until the value returns

    def gross_ratio(self, x: float, w: RollingQuantiles) -> float:
        """How many times its recent level `x` is, for the gross-jump check (0: no gross jump possible)."""
        raise NotImplementedError

    def looseness(self, warm: bool) -> float:
        """The factor on the levels now: > 1 while the window fills and during warmup."""
        w = self.window
        young = 1.0 + self.YOUNG * (w.size - w.n) / w.size if w.n < w.size else 1.0
        return young * self.WARMUP if warm else young

    def assess(self, x: float, s: Sample, p: RuleParams, gross: float | None) -> Judged | None:
        """The verdict on `x` when it reaches a level, is a gross jump or has not returned; else None (x is learned).

        The levels themselves are judged by `BaselineRule.judge` with scaled levels, so whatever wraps
        `judge` (msmon calibrate's probes) sees every value the rule judges."""
        w = self.window
        warm = self.warmup.at(s)
        k = 1.0 if w.n >= w.size and not warm else self.looseness(warm)  # a full window after warmup: full levels
        if gross is not None and w.n >= self.GROSS_AFTER:
            ratio = self.gross_ratio(x, w)
            if ratio >= gross:
                return self._hit(Judged(Severity.ERROR, gross, ratio, w.median(), "gross"), p)
        if w.n < self.GROSS_AFTER:
            w.add(x)
            return None
        levels = p if k == 1.0 else scaled(p, k)
        if self.held and w.n >= self.min_samples:
            score, base = self.score(x, w)
            lw = levels.levels[0]
            back = None if p.levels[0] is None else self.RETURN * p.levels[0]
            if back is not None and score >= back and (lw is None or score < lw):
                return Judged(Severity.WARNING, back, score, base, "held")
        r = self.judge(x, levels)  # learns x when it reaches no level
        if r is None:
            self.hits, self.held = 0, False
            return None
        return self._hit(Judged(r[0], r[1], r[2], r[3], "level"), p)

    def _hit(self, j: Judged, p: RuleParams) -> Judged:
        self.hits += 1
        if self.hits >= p.consecutive:
            self.held = True
        return j

    def acknowledge(self) -> bool:
        """A person acknowledged the alert: a held shift is the new normal. The baseline is learned afresh from
        the next samples (young, so looser levels at first); whether a shift was held."""
        if not self.held:
            return False
        self.window.clear()
        self.hits, self.held = 0, False
        return True


class Detector(Protocol):
    """One rule's memory and logic. `update` returns None when the sample is normal."""

    rule: ClassVar[str]
    summary: ClassVar[str]  # what it watches, in one line
    metric: ClassVar[str]  # the metric the rule watches (shown in alerts)
    requires: ClassVar[frozenset[str]]  # metrics that must be in `metrics:` for the rule to run
    hint: ClassVar[str]  # what the person reading the alert should do first

    def __init__(self, p: Any, ctx: DetectorContext) -> None: ...

    def update(self, s: Sample, p: RuleParams) -> Finding | None: ...


@dataclasses.dataclass
class DetectorContext:
    """What a detector may know about its run besides its samples."""

    device: str = "0"
    total_steps: int | None = None
    # the optimizer steps the job itself says it will run (MindSpore: epochs x steps per epoch), known when training
    # starts and set only where the config declares no total_steps: what lr_schedule judges the run's length by then
    job_steps: int | None = None
    warmup_steps: int | None = None
    target_loss: float | None = None
    peers: dict[str, float] = dataclasses.field(default_factory=dict)  # device -> latest step time
    # the device's recent samples, newest last (the Monitor's own, the one being judged included): read, never
    # written, by a rule that needs another metric's recent history only now and then (grad_norm_creep's loss)
    recent: Any = None
