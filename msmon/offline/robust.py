"""A robust loss trend for replays: a spike that fills a few whole blocks of steps (a bad shard, a short
divergence that recovered) must not tilt the summary's line.

`despike(steps, losses, window_steps)` cuts the steps into the trend's own blocks (a tenth of a window,
`msmon.core.trend`), fits a Theil-Sen line (the median of the pairwise slopes: up to ~29% of the blocks may
be outliers without tilting it) through the block medians against log(step), and sets the points of every
block whose median lies more than `k` robust sigmas off that line onto the line. `summarize` then fits the
cleaned points as usual. Pure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from msmon.core.detectors.convergence import Trend

K = 4.0  # a block is a spike when its median is this many robust sigmas (1.4826 x MAD) off the line


def _median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n & 1 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def theil_sen(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """(slope, intercept): the median of the slopes between every two points, and the median of y - slope x."""
    slopes = [(ys[j] - ys[i]) / (xs[j] - xs[i]) for i in range(len(xs)) for j in range(i + 1, len(xs))
              if xs[j] != xs[i]]
    slope = _median(slopes) if slopes else 0.0
    return slope, _median([y - slope * x for x, y in zip(xs, ys, strict=True)])


@dataclass(frozen=True)
class Despiked:
    losses: list[float | None]  # the losses, with the outlying blocks' points on the robust line
    blocks: int  # blocks with a finite loss
    set_aside: int  # blocks found to be spikes


def despike(steps: Sequence[int], losses: Sequence[float | None], window_steps: int, k: float = K) -> Despiked:
    block = max(1, window_steps // Trend.BLOCKS)
    members: dict[int, list[int]] = {}
    for i, (s, x) in enumerate(zip(steps, losses, strict=True)):
        if x is not None and s >= 1 and math.isfinite(x):
            members.setdefault(s // block, []).append(i)
    ids = sorted(members)
    out = list(losses)
    if len(ids) < Trend.BLOCKS:
        return Despiked(out, len(ids), 0)
    xs = [sum(math.log(steps[i]) for i in members[b]) / len(members[b]) for b in ids]
    meds = [_median([x for i in members[b] if (x := losses[i]) is not None]) for b in ids]
    slope, icpt = theil_sen(xs, meds)
    resid = [m - (icpt + slope * x) for x, m in zip(xs, meds, strict=True)]
    centre = _median(resid)
    sigma = 1.4826 * _median([abs(r - centre) for r in resid])
    if sigma <= 0.0:
        return Despiked(out, len(ids), 0)
    spikes = [b for b, r in zip(ids, resid, strict=True) if abs(r - centre) > k * sigma]
    for b in spikes:
        for i in members[b]:
            out[i] = icpt + centre + slope * math.log(steps[i])
    return Despiked(out, len(ids), len(spikes))
