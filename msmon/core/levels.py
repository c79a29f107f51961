"""The rules' levels over a run: which phase's parameters apply at a step, and live changes to them.

Pure: the Monitor builds `Levels` from its config, asks `at(step)` on the hot path (a phase knows its
step range, so the answer is cached until the step leaves it) and changes levels through `set`,
`loosen` and `restore` (JobControl's set_threshold, loosen_threshold and restore_threshold).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from typing import Any

from msmon.core.detectors.base import RuleParams

DEFAULT = "default"  # the name of the steps no configured phase covers


class Phase:
    """A step range [start, end) and every rule's parameters in it."""

    __slots__ = ("name", "start", "end", "params", "ordered")

    def __init__(self, name: str, start: int, end: float, params: dict[str, RuleParams]) -> None:
        self.name, self.start, self.end, self.params = name, start, end, params
        self.ordered: list[RuleParams] = []  # params in the order of the active rules (see `order`)


@dataclasses.dataclass(frozen=True)
class PhaseSpec:
    """A configured phase: its name, its steps (`end` None: to the end of the run), its per-rule overrides."""

    name: str
    start: int
    end: int | None
    overrides: Mapping[str, Mapping[str, Any]]


class Levels:
    """Non-overlapping phases covering steps 0..inf: the configured ones, "default" between them. The
    default phase's parameters are `base` itself (the config's), so a live change there is the config's."""

    def __init__(self, base: dict[str, RuleParams], phases: Iterable[PhaseSpec]) -> None:
        self.phases: list[Phase] = []
        at = 0
        for p in sorted(phases, key=lambda p: p.start):
            if p.start > at:
                self.phases.append(Phase(DEFAULT, at, p.start, base))
            params = dict(base)
            for rule, override in p.overrides.items():
                params[rule] = dataclasses.replace(base[rule], **override)
            end = math.inf if p.end is None else p.end
            self.phases.append(Phase(p.name, p.start, end, params))
            if p.end is None:
                return
            at = p.end
        self.phases.append(Phase(DEFAULT, at, math.inf, base))

    def order(self, rules: list[str]) -> None:
        """Fix the order of every phase's `ordered` params: that of the active rules."""
        for ph in self.phases:
            ph.ordered = [ph.params[name] for name in rules]

    def at(self, step: int) -> Phase:
        for p in self.phases:
            if p.start <= step < p.end:
                return p
        return self.phases[-1]

    def of(self, rule: str) -> list[tuple[str, RuleParams]]:
        """(phase name, params) of `rule` in every phase, each params object once."""
        seen: set[int] = set()
        out = []
        for ph in self.phases:
            params = ph.params[rule]
            if id(params) not in seen:
                seen.add(id(params))
                out.append((ph.name, params))
        return out

    def set(self, rule: str, value: float, level: str = "warning") -> float | None:
        """Set a rule's WARNING or ERROR level in every phase; returns the old one (the default phase's)."""
        if level not in ("warning", "error"):
            raise ValueError(f"level must be warning or error, not {level!r}")
        old = None
        for name, params in self.of(rule):
            if name == DEFAULT or old is None:
                old = params.levels[0 if level == "warning" else 1]
            setattr(params, level, value)
        return old

    def loosen(self, rule: str, *, value: float | None = None, factor: float | None = None) -> tuple[str, Any]:
        """Scale a rule's levels in every phase: by `factor`, or so that its main level (WARNING if set, else
        ERROR) becomes `value`; the other level moves in proportion. Returns a description and an opaque
        `undo` for `restore()`."""
        found = self.of(rule)
        main = next((params for name, params in found if name == DEFAULT), found[0][1])  # not a warmup's
        base = main.warning if main.warning is not None else main.error
        if base is None:
            raise ValueError(f"rule {rule} has no level set: nothing to loosen (set one with set_threshold)")
        if factor is None:
            if value is None:
                raise ValueError("give a value or a factor")
            factor = value / base
        if not (factor > 0 and math.isfinite(factor)):
            raise ValueError(f"factor must be a positive number, not {factor}")
        before = main.levels
        undo = [(params, params.warning, params.error) for _, params in found]
        for _, params in found:
            for level in ("warning", "error"):
                v = getattr(params, level)
                if v is not None:
                    setattr(params, level, v * factor)
        after = main.levels
        return (f"{rule} WARNING {_level(before[0])} -> {_level(after[0])}, "
                f"ERROR {_level(before[1])} -> {_level(after[1])}"), undo

    @staticmethod
    def restore(undo: Any) -> None:
        """Put back the levels `loosen()` changed."""
        for params, warning, error in undo:
            params.warning, params.error = warning, error


def _level(v: float | None) -> str:
    return "off" if v is None else f"{v:g}"
