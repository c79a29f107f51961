"""Outlier rank: a loss or an own grad norm that keeps drifting away from the other ranks'.

Each rank's typical loss and grad norm (the median of its last `history` samples, so one noisy batch is
not an outlier; the norm its own, `local_grad_norm`, where the job reports it: the reduced norm is the
same on every rank and compares nothing) against the others': further from their
median than `outlier_sigmas` robust sigmas (MAD) and than `outlier_rel` of the median. Held for
`outlier_checks` checks -> WARNING (a bad shard, a failing card), for `outlier_error_checks` -> ERROR.
NaN and Inf are the job's own rules' to report (the storm of them is one message): not compared here.
It takes three ranks at least: of two that disagree, which one is off cannot be told.
"""

from __future__ import annotations

from bot.ranks.rule import Check, Finding
from bot.ranks.stats import others
from bot.ranks.view import RankState, RunRanks

METRICS = (("loss", "loss"), ("norm", "grad norm"))
FEWEST = 3  # ranks with a value: two that disagree do not say which is off


def judge(ctx: Check, run: RunRanks) -> list[Finding]:
    cfg = ctx.settings
    live = [m for m in run.live() if not m.paused and ctx.now - m.last_seen <= cfg.missing_after]
    if len(live) < max(cfg.min_ranks, FEWEST):
        return []
    worst: dict[str, tuple[float, Finding]] = {}
    for what, label in METRICS:
        values: dict[str, float] = {}
        members: dict[str, RankState] = {}
        for m in live:
            v = m.typical(what)
            if v is not None:
                values[m.key], members[m.key] = v, m
        if len(values) < max(cfg.min_ranks, FEWEST):
            continue
        for key, o in others(values).items():
            v = values[key]
            off = abs(v - o.median)
            limit = max(cfg.outlier_sigmas * o.sigma, cfg.outlier_rel * abs(o.median))
            if off > limit and off > 0:
                m = members[key]
                score = off / limit if limit > 0 else float("inf")
                f = Finding(m, v, o.median + (limit if v > o.median else -limit), (
                    f"{m.name()} is an outlier at step {m.sample_step or 0:,}: {label} {v:.4g} (its median of the "
                    f"last {len(m.losses if what == 'loss' else m.norms)}) against the other {o.n} ranks' median "
                    f"{o.median:.4g} (range {o.low:.4g} to {o.high:.4g}; bound ±{limit:.3g})"),
                    "loss" if what == "loss" else "grad_norm")
                if key not in worst or score > worst[key][0]:
                    worst[key] = (score, f)
    return [f for _, f in worst.values()]
