"""Straggler: a rank whose pace stays behind the others'.

Its pace is the median of its own recent step times (RankState.pace: one slow step, a checkpoint or a
compile, does not make a straggler), compared with the other ranks' paces: over their median by
`straggler_ratio` and by `straggler_sigmas` robust sigmas (MAD) of them, for `straggler_checks` checks
in a row (the tracker) -> WARNING. Ranks that report only a throughput are compared by its inverse.
"""

from __future__ import annotations

from .rule import Check, Finding
from .stats import others
from .view import RankState, RunRanks


def _recent(m: RankState, ctx: Check) -> bool:
    return not m.paused and ctx.now - m.last_seen <= ctx.settings.missing_after


def judge(ctx: Check, run: RunRanks) -> list[Finding]:
    cfg = ctx.settings
    paces: dict[str, float] = {}
    members: dict[str, RankState] = {}
    for m in run.live():
        p = m.pace()
        if p is not None and _recent(m, ctx):
            paces[m.key], members[m.key] = p, m
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
