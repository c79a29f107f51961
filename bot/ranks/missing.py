"""Missing rank: a rank that stops reporting (no sample, no heartbeat) for `missing_after` seconds while
the other ranks go on -> ERROR at once. Who is missing is the rank lifecycle's (bot/runs/lifecycle.py): a rank
that said it finished (its final heartbeat) is never missing; a missing rank stays missing while it is
silent, whatever the others do (they may all finish meanwhile), and only a message of its own brings it
back; when the whole run falls silent at once, that is the watchdog's job_gone, not a missing rank."""

from __future__ import annotations

from bot.ranks.rule import Check, Finding
from bot.ranks.view import RunRanks
from bot.runs.lifecycle import tick

RULE = "rank_missing"


def judge(ctx: Check, run: RunRanks) -> list[Finding]:
    cfg = ctx.settings
    members = list(run.members.values())
    tick((m.life for m in members), ctx.now, cfg.missing_after / 2, cfg.missing_after)
    out = []
    for m in members:
        if not m.missing:
            continue
        silent = ctx.now - m.last_seen
        talking = sum(1 for o in members if not o.ended and ctx.now - o.last_seen <= cfg.missing_after)
        finished = sum(1 for o in members if o.ended)
        others = (f"{talking} other rank{'s' if talking != 1 else ''} report" if talking or not finished
                  else f"the other {finished} finished")
        out.append(Finding(m, silent, cfg.missing_after, (
            f"{m.name()} stopped reporting at step {m.step or 0:,}: silent for {silent:.0f} s while "
            f"{others} (limit {cfg.missing_after:.0f} s)"), "last_seen"))
    return out
