"""Bounded rolling statistics, O(log n) or O(1) per update: the detectors' only memory."""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import deque


class RollingQuantiles:
    """The last `size` values, kept sorted: median and IQR in O(1), an update in O(log n) + memmove."""

    __slots__ = ("_fifo", "_sorted", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self._fifo: deque[float] = deque()
        self._sorted: list[float] = []

    def __len__(self) -> int:
        return len(self._fifo)

    def add(self, x: float) -> None:
        """Add a finite value (NaN would break the order; callers filter it)."""
        if len(self._fifo) == self.size:
            old = self._fifo.popleft()
            del self._sorted[bisect_left(self._sorted, old)]
        self._fifo.append(x)
        insort(self._sorted, x)

    def clear(self) -> None:
        self._fifo.clear()
        self._sorted.clear()

    def quantile(self, q: float) -> float:
        s = self._sorted
        pos = q * (len(s) - 1)
        lo = int(pos)
        hi = min(lo + 1, len(s) - 1)
        return s[lo] + (s[hi] - s[lo]) * (pos - lo)

    def median(self) -> float:
        s = self._sorted
        n = len(s)
        m = n >> 1
        return s[m] if n & 1 else 0.5 * (s[m - 1] + s[m])

    def sigma(self) -> float:
        """Robust standard deviation: IQR / 1.349 (equals sigma for normal noise, ignores outliers)."""
        return (self.quantile(0.75) - self.quantile(0.25)) / 1.349


class SlidingFit:
    """Least-squares line through the last `size` (x, y) points, updated in O(1).

    Sums are kept relative to an origin that is moved to the oldest point every `size` updates,
    when they are also recomputed from the buffer, so rounding error cannot build up.
    """

    __slots__ = ("size", "_xs", "_ys", "_x0", "_n_added", "_sx", "_sy", "_sxx", "_sxy", "_syy")

    def __init__(self, size: int) -> None:
        self.size = size
        self._xs: deque[float] = deque()
        self._ys: deque[float] = deque()
        self._x0 = 0.0
        self._n_added = 0
        self._sx = self._sy = self._sxx = self._sxy = self._syy = 0.0

    def __len__(self) -> int:
        return len(self._xs)

    def clear(self) -> None:
        self._xs.clear()
        self._ys.clear()
        self._n_added = 0
        self._sx = self._sy = self._sxx = self._sxy = self._syy = 0.0

    def add(self, x: float, y: float) -> None:
        if not self._xs:
            self._x0 = x
        if len(self._xs) == self.size:
            ox = self._xs.popleft() - self._x0
            oy = self._ys.popleft()
            self._sx -= ox
            self._sy -= oy
            self._sxx -= ox * ox
            self._sxy -= ox * oy
            self._syy -= oy * oy
        self._xs.append(x)
        self._ys.append(y)
        dx = x - self._x0
        self._sx += dx
        self._sy += y
        self._sxx += dx * dx
        self._sxy += dx * y
        self._syy += y * y
        self._n_added += 1
        if self._n_added % self.size == 0:
            self._rebuild()

    def _rebuild(self) -> None:
        self._x0 = self._xs[0]
        self._sx = self._sy = self._sxx = self._sxy = self._syy = 0.0
        for x, y in zip(self._xs, self._ys, strict=True):
            dx = x - self._x0
            self._sx += dx
            self._sy += y
            self._sxx += dx * dx
            self._sxy += dx * y
            self._syy += y * y

    @property
    def span(self) -> float:
        """Distance in x from the oldest to the newest point."""
        return self._xs[-1] - self._xs[0] if self._xs else 0.0

    def fit(self) -> tuple[float, float, float] | None:
        """(slope, value of the line at the newest x, t-statistic of the slope); None if degenerate."""
        n = len(self._xs)
        if n < 3:
            return None
        mx = self._sx / n
        my = self._sy / n
        sxx = self._sxx - n * mx * mx
        if sxx <= 0.0:
            return None
        sxy = self._sxy - n * mx * my
        syy = self._syy - n * my * my
        slope = sxy / sxx
        resid = max(syy - slope * sxy, 0.0) / (n - 2)
        se = math.sqrt(resid / sxx)
        t = slope / se if se > 0.0 else math.copysign(math.inf, slope) if slope else 0.0
        at_end = my + slope * ((self._xs[-1] - self._x0) - mx)
        return slope, at_end, t

    def predict(self, x: float) -> tuple[float, float] | None:
        """The line's value at `x` and its standard error; None if degenerate."""
        n = len(self._xs)
        if n < 3:
            return None
        mx = self._sx / n
        my = self._sy / n
        sxx = self._sxx - n * mx * mx
        if sxx <= 0.0:
            return None
        sxy = self._sxy - n * mx * my
        syy = self._syy - n * my * my
        slope = sxy / sxx
        resid = max(syy - slope * sxy, 0.0) / (n - 2)
        dx = (x - self._x0) - mx
        return my + slope * dx, math.sqrt(resid * (1.0 / n + dx * dx / sxx))
