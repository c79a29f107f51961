"""Robust statistics across ranks: median, MAD (scaled to a standard deviation), min and max.

Pure and small: a run's ranks are at most `ranks.max_ranks` numbers per metric, sorted once per check.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable

MAD_SIGMA = 1.4826  # MAD x this = the standard deviation of normal noise


def median_of_sorted(xs: list[float]) -> float:
    n = len(xs)
    m = n >> 1
    return xs[m] if n & 1 else 0.5 * (xs[m - 1] + xs[m])


@dataclasses.dataclass(frozen=True)
class Spread:
    """One metric across the ranks that reported it: how many, the median, the robust sigma (MAD x
    1.4826), the smallest and the largest."""

    n: int
    median: float
    sigma: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Iterable[float | None]) -> Spread | None:
        """The spread of the finite values; None when there is none."""
        xs = sorted(v for v in values if v is not None and math.isfinite(v))
        if not xs:
            return None
        med = median_of_sorted(xs)
        dev = sorted(abs(x - med) for x in xs)
        return cls(len(xs), med, MAD_SIGMA * median_of_sorted(dev), xs[0], xs[-1])


LEAVE_ONE_OUT = 16  # fewer ranks than this: each is judged against the others only (one rank moves a small median)


def others(values: dict[str, float]) -> dict[str, Spread]:
    """For each rank, the spread of the *other* ranks' values. With many ranks one rank barely moves the
    median, so all share the spread of everyone (one sort, not one per rank); with few (two or three on a
    small job) each is left out of its own comparison, or a rank twice as slow as its only peer would be
    exactly as far from the median as that peer."""
    if len(values) < 2:
        return {}
    if len(values) >= LEAVE_ONE_OUT:
        everyone = Spread.of(values.values())
        return {} if everyone is None else dict.fromkeys(values, everyone)
    out: dict[str, Spread] = {}
    for key in values:
        s = Spread.of(v for k, v in values.items() if k != key)
        if s is not None:
            out[key] = s
    return out
