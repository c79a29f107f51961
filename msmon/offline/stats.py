"""The statistics a calibration reads a healthy baseline with: quantiles, the level held for N samples in a row, the
noise about a rolling line (without the trend), and levels rounded up or down to a few significant digits."""

from __future__ import annotations

import math
from collections.abc import Sequence

from msmon.core.detectors.rolling import SlidingFit


def _quantile(values: Sequence[float], q: float) -> float:
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def sustained_max(values: Sequence[float], run: int) -> float:
    """The highest level `values` held for `run` samples in a row (what a rule with consecutive: run sees)."""
    if len(values) < run:
        return -math.inf
    return max(min(values[i:i + run]) for i in range(len(values) - run + 1))


def detrended_sigma(values: Sequence[float], width: int) -> float:
    """Robust sigma (IQR / 1.349) of the residuals about a centred rolling line: the noise without the trend."""
    half = max(1, width // 2)
    n = 2 * half + 1
    if len(values) < n:
        return math.nan
    fit = SlidingFit(n)
    resid = []
    for i, x in enumerate(values):
        fit.add(float(i), x)
        if i >= n - 1:
            line = fit.predict(float(i - half))
            if line is not None:
                resid.append(values[i - half] - line[0])
    if not resid:
        return math.nan
    # the centre point's residual has variance sigma^2 (1 - 1/n): scale it back
    return (_quantile(resid, 0.75) - _quantile(resid, 0.25)) / 1.349 / math.sqrt(1.0 - 1.0 / n)


def _ceil_to(x: float, step: float) -> float:
    return round(math.ceil(x / step - 1e-9) * step, 10)


def _ceil_sig(x: float, digits: int = 2) -> float:
    """Round up to `digits` significant digits (0.4312 -> 0.44)."""
    if x <= 0 or not math.isfinite(x):
        return x
    scale = 10.0 ** (math.floor(math.log10(x)) - digits + 1)
    return round(math.ceil(x / scale - 1e-9) * scale, 12)


def _floor_sig(x: float, digits: int = 1) -> float:
    if x <= 0 or not math.isfinite(x):
        return x
    scale = 10.0 ** (math.floor(math.log10(x)) - digits + 1)
    return round(math.floor(x / scale + 1e-9) * scale, 12)


__all__ = ["detrended_sigma", "sustained_max"]
