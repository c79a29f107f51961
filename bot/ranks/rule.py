"""The one shape of a cross-rank rule, and the tracker that turns their findings into alerts.

A `Rule` is a name, a pure `judge(ctx, run) -> findings` (which ranks the condition holds for now,
with the numbers and the words), a `level(settings, streak) -> severity | None` (how many checks in a
row make it a WARNING or an ERROR: "sustained"), and a hint. `track` runs the rules over a run and
keeps, per rule and rank, the streak and the severity it fires at, in the run's own bounded memory
(`RunRanks.firing`; a rule on the ranks' numbers counts a rank's new samples, not checks): it
returns the wire `Event`s to raise, firing when a streak reaches its level or
climbs to ERROR, resolved when the condition is gone. No clock and no I/O: `now` comes in the context.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

from bot.config import RanksConfig
from bot.ranks.view import Firing, RankState, RunRanks
from msmon.contract.wire import Event, Severity, Status


@dataclasses.dataclass(frozen=True)
class Check:
    """What every rule of one check shares: the bot's clock reading and the settings."""

    now: float
    settings: RanksConfig


@dataclasses.dataclass(frozen=True)
class Finding:
    """The condition holds for rank `member` now: its value against the threshold, in words."""

    member: RankState
    value: float
    threshold: float
    message: str  # job data in it (rank names, hosts) is escaped by each receiver
    metric: str = ""


Judge = Callable[[Check, RunRanks], list[Finding]]
Level = Callable[[RanksConfig, int], Severity | None]


@dataclasses.dataclass(frozen=True)
class Rule:
    """`fresh`: the streak moves on a new sample of the rank only (a rule on its numbers: a rank whose last
    report is old does not become an outlier by being checked again); else on every check (silence, skew)."""

    name: str
    judge: Judge
    level: Level
    hint: str
    fresh: bool = False


def warning_after(checks: Callable[[RanksConfig], int]) -> Level:
    """A WARNING once the condition held `checks(settings)` checks in a row."""
    return lambda cfg, streak: Severity.WARNING if streak >= checks(cfg) else None


def warning_then_error(warn: Callable[[RanksConfig], int], error: Callable[[RanksConfig], int]) -> Level:
    """A WARNING after `warn(settings)` checks in a row, an ERROR after `error(settings)`."""
    def level(cfg: RanksConfig, streak: int) -> Severity | None:
        if streak >= error(cfg):
            return Severity.ERROR
        return Severity.WARNING if streak >= warn(cfg) else None
    return level


def error_at_once(cfg: RanksConfig, streak: int) -> Severity | None:
    return Severity.ERROR


def _event(run: RunRanks, rule: Rule, f: Finding | None, m: RankState, severity: Severity, status: Status,
           now: float) -> Event:
    firing = status is Status.FIRING and f is not None
    return Event(run_id=run.run_id, device=m.key, step=m.step or 0, time=now, rule=rule.name, severity=severity,
                 status=status, value=f.value if f is not None else 0.0,
                 threshold=f.threshold if f is not None else 0.0,
                 message=f.message if f is not None else f"{rule.name} cleared on {m.name()}",
                 hint=rule.hint if firing else "", metric=f.metric if f is not None else "")


def track(rules: Iterable[Rule], ctx: Check, run: RunRanks) -> list[Event]:
    """The events one check raises for a run: each rule judged, its streaks moved on, its transitions out."""
    out: list[Event] = []
    for rule in rules:
        found = {f.member.key: f for f in rule.judge(ctx, run)}
        for key, f in found.items():
            state = run.firing.setdefault((rule.name, key), Firing())
            if not rule.fresh or state.counted != f.member.sample_step:
                state.streak += 1
                state.counted = f.member.sample_step
            want = rule.level(ctx.settings, state.streak)
            if want is not None and (state.severity is None or want.rank > state.severity.rank):
                state.severity = want
                out.append(_event(run, rule, f, f.member, want, Status.FIRING, ctx.now))
        for (name, key), state in list(run.firing.items()):
            if name != rule.name or key in found:
                continue
            m = run.members.get(key)
            if state.severity is not None and m is not None:
                out.append(_event(run, rule, None, m, state.severity, Status.RESOLVED, ctx.now))
            del run.firing[(name, key)]
    return out
