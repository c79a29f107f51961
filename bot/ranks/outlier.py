"""Outlier rank: a loss or an own grad norm that keeps drifting away from the other ranks'.

Each rank's latest loss and grad norm (its own, `local_grad_norm`, where the job reports it; the
reduced norm is the same on every rank and compares nothing) against the others': further from their
median than `outlier_sigmas` robust sigmas (MAD) and than `outlier_rel` of the median. Held for
`outlier_checks` checks -> WARNING (a bad shard, a failing card), for `outlier_error_checks` -> ERROR.
NaN and Inf are the job's own rules' to report (the storm of them is one message): not compared here.
"""

from __future__ import annotations

from .rule import Check, Finding
from .stats import others
from .view import RankState, RunRanks

METRICS = (("loss", "loss"), ("norm", "grad norm"))


def judge(ctx: Check, run: RunRanks) -> list[Finding]:
    cfg = ctx.settings
    live = [m for m in run.live() if not m.paused and ctx.now - m.last_seen <= cfg.missing_after]
    if len(live) < cfg.min_ranks:
        return []
    worst: dict[str, tuple[float, Finding]] = {}
    for what, label in METRICS:
        values: dict[str, float] = {}
        members: dict[str, RankState] = {}
        for m in live:
            v = m.loss if what == "loss" else m.norm()
            if v is not None and v - v == 0.0:  # finite
                values[m.key], members[m.key] = v, m
        if len(values) < cfg.min_ranks:
            continue
        for key, o in others(values).items():
            v = values[key]
            off = abs(v - o.median)
            limit = max(cfg.outlier_sigmas * o.sigma, cfg.outlier_rel * abs(o.median))
            if off > limit and off > 0:
                m = members[key]
                score = off / limit if limit > 0 else float("inf")
                f = Finding(m, v, o.median + (limit if v > o.median else -limit), (
                    f"{m.name()} is an outlier at step {m.sample_step or 0:,}: {label} {v:.4g} against the other "
                    f"{o.n} ranks' median {o.median:.4g} (range {o.low:.4g} to {o.high:.4g}; bound ±{limit:.3g})"),
                    "loss" if what == "loss" else "grad_norm")
                if key not in worst or score > worst[key][0]:
                    worst[key] = (score, f)
    return [f for _, f in worst.values()]
