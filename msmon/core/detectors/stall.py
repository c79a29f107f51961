"""A step that took far longer than the median step: a local stall (I/O, a slow collective, a hiccup)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from msmon.contract.wire import Sample
from msmon.core.detectors.base import SKIP, BaselineRule, DetectorContext, Finding, RuleParams
from msmon.core.detectors.rolling import RollingQuantiles
from msmon.core.spec import spec


@dataclasses.dataclass
class StepStallParams(RuleParams):
    """Levels are the slowest step since the last sample, as a multiple of the median step time.

    The slowest step is timed on every step (a clock read), so a stall between two samples is
    seen; it must also last `min_seconds` (a 20 ms scheduler hiccup in a job of 2 ms steps is 10x
    the median, and nobody's business). A job that stops stepping altogether is seen by the bot's
    heartbeat watchdog instead. Time paused on purpose (a `pause` command or action) never reaches
    this rule: the Monitor leaves it out of step times (`Monitor.hold_clock`).
    """

    warning: float | None = dataclasses.field(default=10.0, metadata=spec(gt=1, doc="x the median step time"))
    error: float | None = dataclasses.field(default=None, metadata=spec(gt=1, doc="x the median step time"))
    window: int = dataclasses.field(default=100, metadata=spec(ge=10, doc="samples in the rolling baseline"))
    min_seconds: float = dataclasses.field(
        default=1.0, metadata=spec(ge=0, doc="a step shorter than this is never a stall, whatever the ratio"))


class StepStall(BaselineRule):
    rule: ClassVar[str] = "step_stall"
    summary: ClassVar[str] = "one step far slower than the median"
    metric: ClassVar[str] = "step_time"
    requires: ClassVar[frozenset[str]] = frozenset()
    hint: ClassVar[str] = ("One step took far longer than usual: look for checkpoint or log I/O, a slow "
                           "collective (a straggling device), or host contention at that time.")

    def __init__(self, p: StepStallParams, ctx: DetectorContext) -> None:
        super().__init__(p.window)
        self.worst = 0.0
        self.min_seconds = p.min_seconds

    def score(self, x: float, w: RollingQuantiles) -> tuple[float, float]:
        # The window learns mean step times; the score is the slowest single step against them.
        med = w.median()
        if med <= 0.0 or self.worst < self.min_seconds:
            return 0.0, med
        return self.worst / med, med

    def update(self, s: Sample, p: RuleParams) -> Finding | None:
        mean, worst = s.step_time, s.max_step_time
        if not mean or worst is None:
            return SKIP
        self.worst = worst
        r = self.judge(mean, p)
        if r is None:
            return None
        level, thr, ratio, med = r
        return Finding(level, ratio, thr,
                       f"a step took {worst:.3g} s, {ratio:.0f}x the median step time {med:.3g} s "
                       f"(threshold {thr:g}x)", med)
