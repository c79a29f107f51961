"""Bounded rolling statistics, O(log n) or O(1) per update: the detectors' only memory."""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Iterable
from typing import ClassVar


def median(xs: Iterable[float]) -> float:
    """The median of `xs` (not empty), the mean of the middle two for an even count."""
    v = sorted(xs)
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


class RollingQuantiles:
    """The last `size` values, kept sorted: median and IQR in O(1), an update in O(log n) + memmove.

    The median and (median, sigma) are kept once computed until the next `add` or `clear`: a rule that asks
    for them several times on one sample (a gross-jump check, the level check, the slow-rise check) computes
    them once, and what it is given is the same float it computed before."""

    __slots__ = ("_ring", "_next", "_sorted", "size", "n", "_med", "_ms")
    # caches, not state: not saved by Monitor.state_dict (msmon.core.state), None again when a state is loaded
    TRANSIENT: ClassVar[tuple[str, ...]] = ("_med", "_ms")

    def __init__(self, size: int) -> None:
        self.size = size
        self.n = 0  # values held (an attribute: read on every sample, cheaper than len())
        self._ring: list[float] = []  # insertion order; a ring once full
        self._next = 0  # ring slot of the oldest value, once full
        self._sorted: list[float] = []
        self._med: float | None = None
        self._ms: tuple[float, float] | None = None

    def __len__(self) -> int:
        return self.n

    def add(self, x: float) -> None:
        """Add a finite value (NaN would break the order; callers filter it)."""
        self._med = self._ms = None
        s = self._sorted
        ring = self._ring
        if self.n < self.size:
            ring.append(x)
            self.n += 1
        else:
            i = self._next
            del s[bisect_left(s, ring[i])]
            ring[i] = x
            self._next = (i + 1) % self.size
        insort(s, x)

    def clear(self) -> None:
        self._ring.clear()
        self._sorted.clear()
        self._next = 0
        self.n = 0
        self._med = self._ms = None

    def quantile(self, q: float) -> float:
        s = self._sorted
        pos = q * (len(s) - 1)
        lo = int(pos)
        hi = min(lo + 1, len(s) - 1)
        return s[lo] + (s[hi] - s[lo]) * (pos - lo)

    def median(self) -> float:
        med = self._med
        if med is None:
            s = self._sorted
            n = len(s)
            m = n >> 1
            med = self._med = s[m] if n & 1 else 0.5 * (s[m - 1] + s[m])
        return med

    def median_sigma(self) -> tuple[float, float]:
        """(median, robust sigma) in one pass over the index arithmetic."""
        ms = self._ms
        if ms is not None:
            return ms
        s = self._sorted
        n = len(s)
        m = n >> 1
        med = s[m] if n & 1 else 0.5 * (s[m - 1] + s[m])
        pos = 0.25 * (n - 1)
        lo = int(pos)
        q1 = s[lo] + (s[lo + 1] - s[lo]) * (pos - lo) if lo + 1 < n else s[lo]
        pos = 0.75 * (n - 1)
        lo = int(pos)
        q3 = s[lo] + (s[lo + 1] - s[lo]) * (pos - lo) if lo + 1 < n else s[lo]
        ms = self._ms = (med, (q3 - q1) / 1.349)
        return ms

    def sigma(self) -> float:
        """Robust standard deviation: IQR / 1.349 (equals sigma for normal noise, ignores outliers)."""
        return (self.quantile(0.75) - self.quantile(0.25)) / 1.349


class SlidingFit:
    """Least-squares line through the last `size` (x, y) points, updated in O(1).

    Sums are kept relative to an origin that is moved to the oldest point every `size` updates,
    when they are also recomputed from the buffer, so rounding error cannot build up.
    """

    __slots__ = ("size", "n", "_xs", "_ys", "_x0", "_n_added", "_sx", "_sy", "_sxx", "_sxy", "_syy", "_line_at",
                 "_fit_at")
    # caches of the line and the fit until the next point (a rule asks for the fit twice on one sample), not state
    TRANSIENT: ClassVar[tuple[str, ...]] = ("_line_at", "_fit_at")

    def __init__(self, size: int) -> None:
        self.size = size
        self.n = 0  # points held
        self._xs: deque[float] = deque()
        self._ys: deque[float] = deque()
        self._x0 = 0.0
        self._n_added = 0
        self._sx = self._sy = self._sxx = self._sxy = self._syy = 0.0
        self._line_at: tuple[int, float, float, float, float, float] | None = None
        self._fit_at: tuple[float, float, float] | None = None

    def __len__(self) -> int:
        return self.n

    def clear(self) -> None:
        self._line_at = self._fit_at = None
        self._xs.clear()
        self._ys.clear()
        self.n = 0
        self._n_added = 0
        self._sx = self._sy = self._sxx = self._sxy = self._syy = 0.0

    def add(self, x: float, y: float) -> None:
        self._line_at = self._fit_at = None
        xs, ys = self._xs, self._ys
        if self.n == self.size:
            ox = xs.popleft() - self._x0
            oy = ys.popleft()
            self._sx -= ox
            self._sy -= oy
            self._sxx -= ox * ox
            self._sxy -= ox * oy
            self._syy -= oy * oy
        else:
            if not self.n:
                self._x0 = x
            self.n += 1
        xs.append(x)
        ys.append(y)
        dx = x - self._x0  # self._count(x, y), inlined: the hot path of every trend rule
        self._sx += dx
        self._sy += y
        self._sxx += dx * dx
        self._sxy += dx * y
        self._syy += y * y
        self._n_added += 1
        if self._n_added == self.size:
            self._n_added = 0
            self._rebuild()

    def _count(self, x: float, y: float) -> None:
        """Add one point to the sums (relative to the origin `_x0`)."""
        dx = x - self._x0
        self._sx += dx
        self._sy += y
        self._sxx += dx * dx
        self._sxy += dx * y
        self._syy += y * y

    def _rebuild(self) -> None:
        self._x0 = self._xs[0]
        self._sx = self._sy = self._sxx = self._sxy = self._syy = 0.0
        for x, y in zip(self._xs, self._ys, strict=True):
            self._count(x, y)

    @property
    def span(self) -> float:
        """Distance in x from the oldest to the newest point."""
        return self._xs[-1] - self._xs[0] if self._xs else 0.0

    def rising(self) -> bool:
        """Whether the fitted slope is positive (cheap: no square root)."""
        n = self.n
        return n >= 3 and n * self._sxy - self._sx * self._sy > 0.0

    def _line(self) -> tuple[int, float, float, float, float, float] | None:
        """(n, mean x, mean y, Sxx, slope, residual variance per point); None when no line fits."""
        line = self._line_at
        if line is not None:
            return line
        n = self.n
        if n < 3:
            return None
        mx = self._sx / n
        my = self._sy / n
        sxx = self._sxx - n * mx * mx
        if sxx <= 0.0:
            return None
        sxy = self._sxy - n * mx * my
        slope = sxy / sxx
        resid = max(self._syy - n * my * my - slope * sxy, 0.0) / (n - 2)
        line = self._line_at = (n, mx, my, sxx, slope, resid)
        return line

    def fit(self) -> tuple[float, float, float] | None:
        """(slope, value of the line at the newest x, t-statistic of the slope); None if degenerate."""
        fit = self._fit_at
        if fit is not None:
            return fit
        line = self._line()
        if line is None:
            return None
        _, mx, my, sxx, slope, resid = line
        se = math.sqrt(resid / sxx)
        t = slope / se if se > 0.0 else math.copysign(math.inf, slope) if slope else 0.0
        fit = self._fit_at = (slope, my + slope * ((self._xs[-1] - self._x0) - mx), t)
        return fit

    def noise(self) -> tuple[float, float] | None:
        """(residual variance per point, sum of squared x deviations) of the current fit."""
        line = self._line()
        return None if line is None else (line[5], line[3])

    def predict(self, x: float) -> tuple[float, float] | None:
        """The line's value at `x` and its standard error; None if degenerate."""
        line = self._line()
        if line is None:
            return None
        n, mx, my, sxx, slope, resid = line
        dx = (x - self._x0) - mx
        return my + slope * dx, math.sqrt(resid * (1.0 / n + dx * dx / sxx))
