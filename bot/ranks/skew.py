"""Step skew: ranks further apart in steps than `skew_steps` (a rank held back, a restart that lost
steps), for `skew_checks` checks in a row -> WARNING on each rank that far behind the most advanced.
The bound is in reported steps: with `step_interval` N the ranks' reports are up to N apart anyway."""

from __future__ import annotations

from bot.ranks.rule import Check, Finding
from bot.ranks.view import RunRanks


def judge(ctx: Check, run: RunRanks) -> list[Finding]:
    cfg = ctx.settings
    live = [m for m in run.live() if m.step is not None and not m.paused
            and ctx.now - m.last_seen <= cfg.missing_after]
    if len(live) < cfg.min_ranks:
        return []
    lead = max(live, key=lambda m: m.step or 0)
    top = lead.step or 0
    out = []
    for m in live:
        behind = top - (m.step or 0)
        if behind > cfg.skew_steps:
            out.append(Finding(m, float(behind), float(cfg.skew_steps), (
                f"{m.name()} is at step {m.step or 0:,}, {behind:,} steps behind {lead.name()} at step {top:,} "
                f"(bound {cfg.skew_steps:,})"), "step"))
    return out
