"""Straggler: a rank whose pace stays behind the others', or that waits for its input longer than they do.

Two of its times are compared with the other ranks', each a median of its own recent samples (its own
history: one slow step, a checkpoint or a compile, does not make a straggler), for `straggler_checks`
new samples in a row (the tracker) -> WARNING:

- its input wait (`Sample.data_time`, its own: from one step's end to the next one's begin), where the
  ranks report it: over the others' median by `straggler_ratio`, by `straggler_sigmas` robust sigmas
  (MAD) of them and by `straggler_wait_share` of its own step. In lockstep data parallel this is the one
  that tells: every rank waits for the slowest at each all-reduce, so every rank's wall step time is the
  slowest one's, but only the slow rank waits for its data;
- its step time (ranks that report only a throughput: its inverse): over the others' median by
  `straggler_ratio` and by `straggler_sigmas` robust sigmas of them (ranks that do not step together).

A rank found by both is named once, by its input wait.
"""

from __future__ import annotations

from bot.ranks.rule import Check, Finding
from bot.ranks.stats import Spread, others
from bot.ranks.view import RankState, RunRanks


def _recent(m: RankState, ctx: Check) -> bool:
    return not m.paused and ctx.now - m.last_seen <= ctx.settings.missing_after


def _who(m: RankState) -> str:
    """Its name with its device always said (RankState.name leaves a device equal to the rank out)."""
    name = m.name()
    return name if f"device {m.device}" in name else f"{name}, device {m.device},"


def _by_step_time(ctx: Check, members: dict[str, RankState]) -> list[Finding]:
    cfg = ctx.settings
    paces = {k: p for k, m in members.items() if (p := m.pace()) is not None}
    if len(paces) < cfg.min_ranks:
        return []
    out = []
    for key, o in others(paces).items():
        pace = paces[key]
        limit = max(o.median * cfg.straggler_ratio, o.median + cfg.straggler_sigmas * o.sigma)
        if pace > limit and o.median > 0:
            m = members[key]
            own = min(m.history) if m.history else pace
            usual = f"; its own fastest recent step {own:.3g} s" if own < pace else ""
            out.append(Finding(m, pace, limit, (
                f"{m.name()} is a straggler at step {m.step or 0:,}: {pace:.3g} s a step against the other "
                f"{o.n} ranks' median {o.median:.3g} s ({pace / o.median:.2f}x; slowest of them {o.high:.3g} s)"
                f"{usual}"), "step_time"))
    return out


def _wait_limit(ctx: Check, o: Spread, step: float | None) -> float:
    cfg = ctx.settings
    floor = o.median + cfg.straggler_wait_share * step if step is not None else 0.0
    return max(o.median * cfg.straggler_ratio, o.median + cfg.straggler_sigmas * o.sigma, floor)


def _by_input_wait(ctx: Check, members: dict[str, RankState]) -> list[Finding]:
    waits = {k: w for k, m in members.items() if (w := m.usual_wait()) is not None}
    if len(waits) < ctx.settings.min_ranks:
        return []
    out = []
    for key, o in others(waits).items():
        m, wait = members[key], waits[key]
        step = m.pace()
        limit = _wait_limit(ctx, o, step)
        if wait > limit and wait > 0:
            of_step = f", {wait / step:.0%} of its {step:.3g} s step" if step else ""
            own = min(m.waits)
            usual = f"; its own shortest recent wait {own:.3g} s" if own < wait else ""
            out.append(Finding(m, wait, limit, (
                f"{_who(m)} is a straggler at step {m.step or 0:,}: its input wait (the time it waits for its "
                f"next batch, its own, not the step time every rank shares in lockstep) is {wait:.3g} s a "
                f"step{of_step}, against the other {o.n} ranks' median {o.median:.3g} s (longest of them "
                f"{o.high:.3g} s){usual}"), "data_time"))
    return out


def judge(ctx: Check, run: RunRanks) -> list[Finding]:
    members = {m.key: m for m in run.live() if _recent(m, ctx)}
    found = {f.member.key: f for f in _by_step_time(ctx, members)}
    found.update((f.member.key, f) for f in _by_input_wait(ctx, members))
    return list(found.values())
