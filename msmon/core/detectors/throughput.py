"""Throughput drop, sustained, against the run's own rolling median."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from msmon.contract.wire import Sample
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


@dataclasses.dataclass
class ThroughputDropParams(RuleParams):
    """Levels are the fraction lost against the rolling median: 0.3 means 30% slower than usual.

    Rates are judged over spans of at least `min_seconds` of training (samples are pooled until
    then), so a hiccup of a few milliseconds in a job with 5 ms steps is not a "drop"; with the
    default `consecutive: 5` a drop must last 5 such spans.

    With `expected` (samples/s per device; MindFormers' `throughput_baseline` sets it) the loss is
    judged against that rate from the first span on, for samples that carry samples/s; the rolling
    median still judges the others.
    """

    warning: float | None = dataclasses.field(default=0.3, metadata=spec(gt=0, le=1, doc="fraction lost"))
    error: float | None = dataclasses.field(default=0.6, metadata=spec(gt=0, le=1, doc="fraction lost"))
    consecutive: int = dataclasses.field(default=5, metadata=spec(ge=1, doc="samples in a row"))
    window: int = dataclasses.field(default=100, metadata=spec(ge=10, doc="spans in the rolling baseline"))
    min_seconds: float = dataclasses.field(default=10.0, metadata=spec(ge=0, doc="shortest span judged"))
    expected: float | None = dataclasses.field(default=None, metadata=spec(gt=0, doc="samples/s per device expected"))


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
        self.units = 0.0  # work done in the span being pooled
        self.seconds = 0.0

    def score(self, x: float, w: RollingQuantiles) -> tuple[float, float]:
        med = w.median()
        return 1.0 - x / med, med

    def update(self, s: Sample, p: RuleParams) -> Finding | None:
        expected = getattr(p, "expected", None)
        rate, unit = (s.samples_per_s, "samples/s") if expected and s.samples_per_s is not None else rate_of(s)
        if rate is None or not rate > 0.0:
            return SKIP
        if s.elapsed:
            self.units += rate * s.elapsed
            self.seconds += s.elapsed
            if self.seconds < self.min_seconds:
                return SKIP  # still pooling: nothing new to judge
            rate = self.units / self.seconds
            self.units = self.seconds = 0.0
        if expected and unit == "samples/s":
            return _against(rate, expected, p)
        r = self.judge(rate, p)
        if r is None:
            return None
        level, thr, drop, med = r
        return Finding(level, drop, thr,
                       f"throughput {rate:.4g} {unit} is {drop:.0%} below its usual {med:.4g} {unit} "
                       f"(threshold {thr:.0%})", med)


def _against(rate: float, expected: float, p: RuleParams) -> Finding | None:
    """The loss of throughput against a fixed expected rate (no baseline to learn)."""
    drop = 1.0 - rate / expected
    level, thr = classify(drop, p)
    if level is None:
        return None
    return Finding(level, drop, thr, f"throughput {rate:.4g} samples/s is {drop:.0%} below the expected "
                   f"{expected:.4g} samples/s (throughput_baseline; threshold {thr:.0%})", expected)
