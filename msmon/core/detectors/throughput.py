"""Throughput drop, sustained, against the run's own rolling median."""

from __future__ import annotations

import dataclasses
from collections import deque
from typing import ClassVar

from msmon.contract.wire import Sample, Severity
from msmon.core.detectors.base import SKIP, BaselineRule, DetectorContext, Finding, RuleParams, classify
from msmon.core.detectors.rolling import RollingQuantiles
from msmon.core.spec import spec


def rate_of(s: Sample) -> tuple[float | None, str]:
    """The best throughput a sample has: tokens/s, else samples/s, else steps/s."""
    if s.tokens_per_s is not None:
        return s.tokens_per_s, "tokens/s"
    if s.samples_per_s is not None:
        return s.samples_per_s, "samples/s"
    if s.step_time:
        return 1.0 / s.step_time, "steps/s"
    return None, ""


UNTIMED_STEPS = 10  # steps in a span when the samples carry no time (the default min_steps then)
UNTIMED_RATES = 3  # rates pooled in a span when the samples carry no time (the default min_rates)


@dataclasses.dataclass
class ThroughputDropParams(RuleParams):
    """Levels are the fraction lost against the rolling median: 0.3 means 30% slower than usual.

    Rates are pooled into spans and each span's rate is judged: a span holds at least `min_seconds` of
    the samples' time when they carry it, and at least `min_steps` steps (by default 10 without the
    samples' time, 1 with it); without the samples' time it also pools at least `min_rates` rates (3), so
    that at `step_interval: 10` one step's hiccup is a third of a span, not all of it. Time is the samples' own (a
    replay's timestamps, the clock of a live job that counts tokens or samples), never how fast
    `Monitor.step` is called: a rate handed in measured (`throughput=`) without `time=` is pooled by steps
    alone. With the default `consecutive: 5` a drop must hold for 5 spans in a row (ERROR: 5 spans at
    the ERROR loss), so a dip of a few steps is averaged out inside one span. Short dips that repeat
    (`repeats` spans over a level, none held `consecutive` in a row, within `window` spans) are a WARNING,
    never an ERROR, until they stop; they count once the baseline holds `window` spans (while it fills, the job's
    rate is still settling: compiling, warming up, a shared machine's first minutes).

    A loss must also be beyond the rate's own noise: at least `noise_sigma` robust sigmas (IQR / 1.349
    of the rolling spans) below the median, as well as the level's fraction. A 30% dip of a rate that
    swings by 15% from span to span on a shared machine is its noise, not a drop; on a steady rate the
    fraction alone decides.

    With `expected` (samples/s per device; MindFormers' `throughput_baseline` sets it) the loss is
    judged against that rate from the first span on, for samples that carry samples/s; the rolling
    median still judges the others.
    """

    warning: float | None = dataclasses.field(default=0.3, metadata=spec(gt=0, le=1, doc="fraction lost"))
    error: float | None = dataclasses.field(default=0.6, metadata=spec(gt=0, le=1, doc="fraction lost"))
    consecutive: int = dataclasses.field(default=5, metadata=spec(ge=1, doc="spans in a row"))
    window: int = dataclasses.field(default=100, metadata=spec(ge=10, doc="spans in the rolling baseline"))
    min_seconds: float = dataclasses.field(
        default=10.0, metadata=spec(ge=0, doc="shortest span judged, in the samples' time (when they carry it)"))
    min_steps: int | None = dataclasses.field(default=None, metadata=spec(
        ge=1, doc=f"fewest steps in a span judged (null: {UNTIMED_STEPS} when the samples carry no time, else 1)"))
    repeats: int = dataclasses.field(
        default=3, metadata=spec(ge=2, doc="short dips within `window` spans that make a WARNING"))
    min_rates: int = dataclasses.field(default=UNTIMED_RATES, metadata=spec(
        ge=1, le=10_000, doc="fewest rates pooled in a span when the samples carry no time"))
    noise_sigma: float = dataclasses.field(default=3.0, metadata=spec(
        ge=0, le=100, doc="a drop must also be this many robust sigmas of the spans' rate below the median (0: off)"))
    expected: float | None = dataclasses.field(default=None,
                                               metadata=spec(gt=0, le=1e12, doc="samples/s per device expected"))


class ThroughputDrop(BaselineRule):
    rule: ClassVar[str] = "throughput_drop"
    summary: ClassVar[str] = "sustained throughput drop"
    metric: ClassVar[str] = "throughput"
    requires: ClassVar[frozenset[str]] = frozenset({"throughput"})
    hint: ClassVar[str] = ("Check the data loader (CPU load, storage), host memory and swap, thermal throttling, "
                           "and whether another job shares these devices.")

    def __init__(self, p: ThroughputDropParams, ctx: DetectorContext) -> None:
        super().__init__(p.window)
        self.min_seconds = p.min_seconds
        self.min_steps = p.min_steps
        self.min_rates = p.min_rates
        self.noise_sigma = p.noise_sigma
        self.span = _Span()
        self.prev_step: int | None = None
        self.dips = Dips(p.repeats, p.window, p.consecutive)

    def score(self, x: float, w: RollingQuantiles) -> tuple[float, float]:
        """The fraction lost against the median; 0 when the loss is within the rate's own noise."""
        med, sigma = w.median_sigma()
        if med - x < self.noise_sigma * sigma:
            return 0.0, med
        return 1.0 - x / med, med

    def update(self, s: Sample, p: RuleParams) -> Finding | None:
        expected = getattr(p, "expected", None)
        rate, unit = (s.samples_per_s, "samples/s") if expected and s.samples_per_s is not None else rate_of(s)
        prev, self.prev_step = self.prev_step, s.step
        if rate is None or not rate > 0.0:
            return SKIP
        span = self.span
        span.add(rate, max(s.step - prev, 1) if prev is not None else 1, s.elapsed)
        need = self.min_steps if self.min_steps is not None else 1 if span.timed else UNTIMED_STEPS
        if span.steps < need or (span.seconds < self.min_seconds if span.timed else span.rates < self.min_rates):
            return SKIP  # still pooling: nothing new to judge
        rate, steps, seconds = span.close()
        lasted = f"over {steps} steps" + (f" and {seconds:.3g} s" if seconds is not None else "")
        if expected and unit == "samples/s":
            f = _against(rate, expected, p, lasted)
        else:
            f = self._judged(rate, unit, p, lasted)
        return self.dips.see(f, s.step, young=self.window.n < self.window.size)

    def _judged(self, rate: float, unit: str, p: RuleParams, lasted: str) -> Finding | None:
        r = self.judge(rate, p)
        if r is None:
            return None
        level, thr, drop, med = r
        return Finding(level, drop, thr,
                       f"throughput {rate:.4g} {unit} {lasted} is {drop:.0%} below its usual {med:.4g} {unit} "
                       f"(threshold {thr:.0%})", med)


class _Span:
    """Work pooled since the last judged span: the rate weighted by the samples' time when every sample
    carried it, else by steps."""

    __slots__ = ("work", "steps", "rates", "seconds", "timed")

    def __init__(self) -> None:
        self.work = 0.0  # rate x weight (seconds, or steps)
        self.steps = 0
        self.rates = 0  # rates pooled
        self.seconds = 0.0
        self.timed = True  # every sample in the span carried its time

    def add(self, rate: float, steps: int, elapsed: float | None) -> None:
        if self.timed and not (elapsed and elapsed > 0.0):
            if self.steps:  # the time stopped being known mid-span: weigh what is there by steps
                self.work = self.work / self.seconds * self.steps if self.seconds else 0.0
            self.timed = False
        self.steps += steps
        self.rates += 1
        if self.timed:
            self.seconds += elapsed or 0.0
            self.work += rate * (elapsed or 0.0)
        else:
            self.work += rate * steps

    def close(self) -> tuple[float, int, float | None]:
        """(pooled rate, steps, seconds or None) of the span, and a fresh one begins."""
        timed = self.timed
        out = (self.work / (self.seconds if timed else self.steps), self.steps, self.seconds if timed else None)
        self.work, self.steps, self.rates, self.seconds, self.timed = 0.0, 0, 0, 0.0, True
        return out


class Dips:
    """Short dips that repeat: spans over a level that never held `consecutive` in a row. `repeats` of them
    within `horizon` spans are a WARNING on every span (an ERROR-deep dip too) until they stop repeating;
    a drop that holds is passed on as it is, for the alert gate to count."""

    __slots__ = ("repeats", "horizon", "consecutive", "spans", "run", "ends")

    def __init__(self, repeats: int, horizon: int, consecutive: int) -> None:
        self.repeats, self.horizon, self.consecutive = repeats, horizon, consecutive
        self.spans = 0  # spans judged
        self.run = 0  # spans in a row over a level
        self.ends: deque[int] = deque(maxlen=repeats)  # span numbers where short dips ended

    def see(self, f: Finding | None, step: int, young: bool = False) -> Finding | None:
        """`young`: the baseline is still filling (a job warming up, compiling, its rate not settled): a short dip
        then is not counted toward the repeats; a drop that holds is judged all the same."""
        self.spans += 1
        if f is not None and f.level is not None:
            self.run += 1
            if self.run >= self.consecutive:
                return f  # sustained: the gate decides
        else:
            if 0 < self.run < self.consecutive and not young:
                self.ends.append(self.spans)
            self.run = 0
        ends = self.ends
        if len(ends) < self.repeats or self.spans - ends[0] > self.horizon:
            return f
        return Finding(Severity.WARNING, float(len(ends)), float(self.repeats),
                       f"{len(ends)} short throughput dips within the last {self.spans - ends[0] + 1} spans "
                       f"(each under {self.consecutive} span(s) long); latest at step {step}", None)


def _against(rate: float, expected: float, p: RuleParams, lasted: str) -> Finding | None:
    """The loss of throughput against a fixed expected rate (no baseline to learn)."""
    drop = 1.0 - rate / expected
    level, thr = classify(drop, p)
    if level is None:
        return None
    return Finding(level, drop, thr, f"throughput {rate:.4g} samples/s {lasted} is {drop:.0%} below the expected "
                   f"{expected:.4g} samples/s (throughput_baseline; threshold {thr:.0%})", expected)
