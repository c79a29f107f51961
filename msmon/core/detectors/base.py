"""What every rule shares: its parameters, what it reports, and the Detector protocol.

Detectors are pure: fed one `Sample` at a time, no I/O, no clock. All of them measure a value in
their own unit where *higher is worse*, and compare it with a WARNING and an ERROR level.
"""

from __future__ import annotations

import dataclasses
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

    __slots__ = ("level", "value", "threshold", "message", "baseline")

    def __init__(
        self,
        level: Severity | None,
        value: float,
        threshold: float,
        message: str,
        baseline: float | None = None,
    ) -> None:
        self.level = level
        self.value = value
        self.threshold = threshold
        self.message = message
        self.baseline = baseline

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
    warmup_steps: int | None = None
    target_loss: float | None = None
    peers: dict[str, float] = dataclasses.field(default_factory=dict)  # device -> latest step time
