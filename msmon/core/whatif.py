"""What a threshold change would have done: a rule's alerts on a run's recent samples at the old and the new levels.

Pure: `effect(samples, rule, old, new, ...)` replays the samples through a fresh detector and a fresh alert
gate twice, once with each rule parameters, and counts the alerts that would have gone out (new episodes and
rises to ERROR; reminders are not counted). The job runs it where the data is (`notifier.levels_effect`), so
the answer to a `loosen-threshold` or `set_threshold` says "over the last 600 samples: 0 alerts at 15
instead of 14 at 10" (`Recent`: the run's last `WHATIF_SAMPLES` samples per device, kept as bare tuples),
and `LevelChange` is the record of the change the bot keeps and a replay applies.

A fresh detector starts without the run's history, so a rule with a long rolling baseline judges only the part
of the window after its own warm-up: the counts are for the window as a stretch of its own, said as such.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Iterable, Mapping
from operator import attrgetter
from typing import Any, ClassVar

from msmon.contract.wire import Sample, Severity, Status
from msmon.core.detectors import RULES, DetectorContext, RuleParams
from msmon.core.detectors.base import SKIP
from msmon.core.gate import AlertGate, GateState

WHATIF_SAMPLES = 600  # samples per device a threshold change is judged on


class Recent:
    """A device's last `size` samples for the what-if, bounded and compact: each a bare tuple of its numbers
    (no Sample objects, no run or device strings), rebuilt as Samples only when a change is judged. About
    100 bytes a sample: 600 samples are some 60 KB per device."""

    __slots__ = ("ring", "run_id", "device")

    FIELDS: ClassVar[tuple[str, ...]] = tuple(f for f in Sample.__struct_fields__ if f not in ("run_id", "device"))
    _get: ClassVar[Any] = attrgetter(*FIELDS)

    def __init__(self, size: int = WHATIF_SAMPLES) -> None:
        self.ring: deque[tuple[Any, ...]] = deque(maxlen=size)
        self.run_id = ""
        self.device = ""

    def __len__(self) -> int:
        return len(self.ring)

    def add(self, s: Sample) -> None:
        if not self.ring:
            self.run_id, self.device = s.run_id, s.device
        self.ring.append(self._get(s))

    def samples(self) -> list[Sample]:
        """The kept samples, oldest first."""
        names = self.FIELDS
        return [Sample(run_id=self.run_id, device=self.device, **dict(zip(names, t, strict=True))) for t in self.ring]


@dataclasses.dataclass(frozen=True)
class Alerts:
    """Alerts a rule would have raised on a window: `total` episodes, `errors` of them at or risen to ERROR."""

    total: int = 0
    errors: int = 0

    def describe(self) -> str:
        if not self.total:
            return "0 alerts"
        word = "alert" if self.total == 1 else "alerts"
        return f"{self.total} {word} ({self.errors} ERROR)" if self.errors else f"{self.total} {word}"

    def to_dict(self) -> dict[str, int]:
        return {"total": self.total, "errors": self.errors}


@dataclasses.dataclass(frozen=True)
class Effect:
    """A change's effect on one window: its size and steps, the alerts at the old and at the new levels."""

    rule: str
    samples: int
    first_step: int | None
    last_step: int | None
    old_levels: tuple[float | None, float | None]
    new_levels: tuple[float | None, float | None]
    old: Alerts
    new: Alerts

    def describe(self) -> str:
        """'over the last 600 samples (steps 10-6,000): 0 alerts at 15 instead of 14 at 10'."""
        if not self.samples:
            return "no recent samples to judge the change on"
        steps = "" if self.first_step is None else (f" (step {self.first_step:,})" if self.first_step == self.last_step
                                                    else f" (steps {self.first_step:,}-{self.last_step:,})")
        plural = "s" if self.samples != 1 else ""
        return (f"over the last {self.samples:,} sample{plural}{steps}: {self.new.describe()} at "
                f"{levels_text(self.new_levels)} instead of {self.old.describe()} at {levels_text(self.old_levels)}")

    def to_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "samples": self.samples, "first_step": self.first_step,
                "last_step": self.last_step, "old_levels": list(self.old_levels),
                "new_levels": list(self.new_levels), "old": self.old.to_dict(), "new": self.new.to_dict()}


def levels_text(levels: tuple[float | None, float | None]) -> str:
    """(10, 20) -> '10 / 20' (WARNING / ERROR); one level alone as itself; 'off' for none."""
    warning, error = levels
    if warning is None and error is None:
        return "off"
    if warning is None or error is None or warning == error:
        return f"{warning if warning is not None else error:g}"
    return f"{warning:g} / {error:g}"


def count_alerts(samples: Iterable[Sample], rule: str, params: RuleParams, ctx: DetectorContext,
                 gate: AlertGate) -> Alerts:
    """The alerts of `rule` at `params` on `samples`, from a fresh detector and gate state."""
    detector = RULES[rule][1](params, ctx)
    state = GateState()
    immediate = rule == "nonfinite"
    total = errors = 0
    for s in samples:
        f = detector.update(s, params)
        if f is SKIP:
            continue
        was = state.firing
        v = gate.admit(state, f if params.enable else None, s.step, params.consecutive, immediate)
        if v is None or v.status is not Status.FIRING or v.repeat:
            continue
        total += was is None  # a new episode; else a rise to ERROR
        errors += v.severity is Severity.ERROR
    return Alerts(total, errors)


def effect(samples: Iterable[Sample], rule: str, old: RuleParams, new: RuleParams, *,
           ctx: DetectorContext | None = None, gate: AlertGate | None = None) -> Effect:
    """The alerts `rule` would have raised on `samples` at `old` and at `new` (its parameters before and after
    the change). `gate`: the run's alert gate settings (default: no baseline, no repeats, resolve after 3)."""
    window = list(samples)
    ctx = ctx or DetectorContext()
    gate = gate or AlertGate(alert_interval=0, baseline_steps=0, resolve_after=3)
    return Effect(rule=rule, samples=len(window), first_step=window[0].step if window else None,
                  last_step=window[-1].step if window else None, old_levels=old.levels, new_levels=new.levels,
                  old=count_alerts(window, rule, old, ctx, gate), new=count_alerts(window, rule, new, ctx, gate))


def combine(effects: Iterable[Effect]) -> Effect | None:
    """One effect over several devices' windows (the same rule and levels): the samples and alerts summed, the
    steps spanned."""
    es = list(effects)
    if not es:
        return None
    firsts = [e.first_step for e in es if e.first_step is not None]
    lasts = [e.last_step for e in es if e.last_step is not None]
    return dataclasses.replace(
        es[0], samples=sum(e.samples for e in es), first_step=min(firsts, default=None),
        last_step=max(lasts, default=None), old=Alerts(sum(e.old.total for e in es), sum(e.old.errors for e in es)),
        new=Alerts(sum(e.new.total for e in es), sum(e.new.errors for e in es)))


@dataclasses.dataclass(frozen=True)
class LevelChange:
    """One live change of a rule's levels: the record the job writes next to its CSV (one JSON line each),
    the bot keeps with the run and `msmon replay --levels` applies at the same step."""

    step: int
    rule: str
    warning: float | None = None
    error: float | None = None
    old_warning: float | None = None
    old_error: float | None = None
    time: float | None = None
    action: str = ""
    source: str = ""
    effect: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "level change") -> LevelChange:
        """From a JSON object; a ValueError naming `where` and the key when it is not one."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - set(fields))
        if unknown:
            raise ValueError(f"{where}: unknown key {unknown[0]!r} (keys: {', '.join(fields)})")
        for key in ("step", "rule"):
            if key not in d:
                raise ValueError(f"{where}: missing key {key!r}")
        if not isinstance(d["step"], int) or isinstance(d["step"], bool) or d["step"] < 0:
            raise ValueError(f"{where}: step must be a whole number >= 0, got {d['step']!r}")
        if d["rule"] not in RULES:
            raise ValueError(f"{where}: unknown rule {d['rule']!r}")
        for key in ("warning", "error", "old_warning", "old_error", "time"):
            v = d.get(key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int | float)):
                raise ValueError(f"{where}: {key} must be a number or null, got {v!r}")
        return cls(**{k: d[k] for k in d})


__all__ = ["WHATIF_SAMPLES", "Alerts", "Effect", "LevelChange", "Recent", "combine", "count_alerts", "effect",
           "levels_text"]
