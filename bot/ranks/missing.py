"""Missing rank: a rank that stops reporting (no sample, no heartbeat) for `missing_after` seconds while
the other ranks go on -> ERROR at once. A rank that said it finished (its final heartbeat) is not missing;
when the whole run falls silent, that is the watchdog's job_gone, and a rank already missing stays so."""

from __future__ import annotations

from .rule import Check, Finding
from .view import RunRanks

RULE = "rank_missing"


def judge(ctx: Check, run: RunRanks) -> list[Finding]:
    cfg = ctx.settings
    live = run.live()
    if len(live) < cfg.min_ranks:
        return []
    newest = max(m.last_seen for m in live)
    going_on = ctx.now - newest <= cfg.missing_after
    out = []
    for m in live:
        silent = ctx.now - m.last_seen
        if silent <= cfg.missing_after:
            continue
        if not going_on:  # nobody reports: keep what was already missing, raise nothing new
            st = run.firing.get((RULE, m.key))
            if st is None or st.severity is None:
                continue
        talking = sum(1 for o in live if ctx.now - o.last_seen <= cfg.missing_after)
        out.append(Finding(m, silent, cfg.missing_after, (
            f"{m.name()} stopped reporting at step {m.step or 0:,}: silent for {silent:.0f} s while "
            f"{talking} other rank{'s' if talking != 1 else ''} report (limit {cfg.missing_after:.0f} s)"),
            "last_seen"))
    return out
