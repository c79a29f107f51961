"""Where the loss is heading, from a run's (step, loss) points: pure, no I/O.

    s = summarize(steps, losses, total_steps=20_000, target_loss=3.3)
    for line in s.describe() if s else [NOT_ENOUGH]: ...

The fits are the convergence rules' own (`detectors.convergence.Trend`): the loss against
log(step) through block medians, over the last window and the window before it, both ending at
the newest point. A healthy power-law loss keeps its slope per doubling of the step count about
steady, so "descent lost" compares those; the slope per 1000 steps is what people quote.
`msmon replay` prints it, and the bot's `status` shows it for a run's recent window.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from msmon.core.detectors.convergence import Trend
from msmon.core.detectors.rolling import median

NOT_ENOUGH = "trend: not enough loss data yet (it needs finite losses spread over at least 10 blocks of steps)"
MIN_T = 2.0  # a slope is "clear" when it is at least this many standard errors from zero
SLOWED = 0.5  # fraction of the previous window's descent lost to call it "slowed"


@dataclass(frozen=True)
class Shift:
    """The loss has sat at a new, higher level since `since_step`: a level shift at the end of the data, which a
    fitted line (a robust one sets it aside as an outlier) does not describe."""

    since_step: int
    level: float  # the median loss since then
    before: float  # the median loss before it
    sigma: float  # the loss's normal fluctuation before it (robust: IQR / 1.349)

    def describe(self) -> str:
        z = (self.level - self.before) / self.sigma
        return (f"level shift: the loss has sat at {self.level:.4g} since step {self.since_step:,}, "
                f"{self.level / self.before:.3g}x its {self.before:.4g} before ({z:.0f} sigma of its normal "
                "fluctuation); the trend below leaves it out")


SHIFT_SIGMA = 5.0  # the tail's median this many sigma above the median before it ...
SHIFT_RATIO = 0.2  # ... and this fraction above it: a level shift
SHIFT_ABOVE = 3.0  # a point this many sigma above the median before is part of the shift
SHIFT_SHARE = 0.75  # the share of the tail's points above that
SHIFT_BEFORE = 20  # points before the tail, at least


_median = median


def _level(xs: Sequence[float]) -> tuple[float, float]:
    """(median, robust sigma) of `xs`, sigma floored at 1% of the median."""
    q = sorted(xs)
    m = _median(q)
    return m, max((q[(3 * len(q)) // 4] - q[len(q) // 4]) / 1.349, 0.01 * abs(m), 1e-12)


def level_shift(points: Sequence[tuple[int, float]]) -> Shift | None:
    """A level shift up at the end of `points` ((step, finite loss), in step order), on the smallest tail that
    shows one: the last T points (T = 10, 12, 15, ... x1.25 up to all but `SHIFT_BEFORE`) mostly (`SHIFT_SHARE`)
    `SHIFT_ABOVE` sigma above the median of the (up to) 3T points before, their median `SHIFT_SIGMA` sigma and
    `SHIFT_RATIO` above it. Its start: the first of the high points at the end (an isolated low one among them
    allowed; low points after the last high one, a loss on its way back, are not where it starts); its level: the
    median from there on."""
    n = len(points)
    t = 10
    while n - t >= SHIFT_BEFORE:
        m0, sigma = _level([x for _, x in points[max(0, n - 4 * t):n - t]])
        high = m0 + SHIFT_ABOVE * sigma
        tail = [x for _, x in points[n - t:]]
        level = _median(tail)
        if (level - m0 >= max(SHIFT_SIGMA * sigma, SHIFT_RATIO * abs(m0))
                and sum(x > high for x in tail) >= SHIFT_SHARE * t):
            i = n - 1
            while points[i][1] <= high:  # the last high point (the tail has some: the loss may have come back since)
                i -= 1
            while i > 0 and (points[i - 1][1] > high or (i > 1 and points[i - 2][1] > high)):
                i -= 1
            since = i if points[i][1] > high else i + 1
            m0, sigma = _level([x for _, x in points[max(0, since - 3 * (n - since)):since]])  # just before it
            return Shift(points[since][0], _median([x for _, x in points[since:]]), m0, sigma)
        t = n if t >= n - SHIFT_BEFORE else min(max(t + 1, int(1.25 * t)), n - SHIFT_BEFORE)
    return None


@dataclass(frozen=True)
class TrendSummary:
    """The loss trend at `end_step`. Slopes are loss change per 1000 steps at each window's end, and per
    doubling of the step count (the scale-free form the convergence rule compares)."""

    start_step: int  # first step analysed (start of the previous window, or of the current one)
    end_step: int  # newest step analysed
    window_steps: int
    points: int  # (step, loss) points used
    loss_now: float  # the current window's line at its end
    slope_per_1000: float
    per_doubling: float
    clear: bool  # the current slope is clearly away from zero (|t| >= MIN_T, noise inside blocks counted)
    prev_end_step: int | None = None
    prev_slope_per_1000: float | None = None
    prev_per_doubling: float | None = None
    descent_lost: float | None = None  # 1 - now / before (per doubling), when the loss fell before
    total_steps: int | None = None
    forecast: float | None = None  # loss the current line reaches at total_steps
    forecast_se: float | None = None
    target_loss: float | None = None
    eta_step: float | None = None  # step the current line reaches target_loss; None: never at this rate
    shift: Shift | None = None  # a level shift up at the end of the data: the headline

    @property
    def verdict(self) -> str:
        """shifted, falling, slowed, sped up, flat or rising."""
        if self.shift is not None:
            return "shifted"
        if not self.clear:
            return "flat"
        if self.per_doubling > 0:
            return "rising"
        if self.descent_lost is not None and self.descent_lost >= SLOWED:
            return "slowed"
        if self.descent_lost is not None and self.descent_lost <= -SLOWED:
            return "sped up"
        return "falling"

    def describe(self) -> list[str]:
        """Human lines, most important first."""
        lines = [f"loss trend at step {self.end_step:,}: {self.loss_now:.4g}, {self.slope_per_1000:+.3g} per 1000 "
                 f"steps ({self.per_doubling:+.3g} per doubling of the step count; {self.window_steps:,}-step windows, "
                 f"{self.points:,} points from step {self.start_step:,})"]
        if self.shift is not None:
            lines.insert(0, self.shift.describe())
        v = self.verdict
        if self.prev_slope_per_1000 is not None and v != "shifted":
            before = f"{self.prev_slope_per_1000:+.2g} per 1000 steps (window to step {self.prev_end_step:,})"
            now = f"{self.slope_per_1000:+.2g}"
            lost = "" if self.descent_lost is None else f"; {self.descent_lost:.0%} of the descent per doubling lost"
            lines.append({
                "slowed": f"convergence slowed from {before} to {now}{lost}",
                "sped up": f"convergence sped up from {before} to {now}",
                "rising": f"the loss is rising: {now} per 1000 steps, after {before}",
                "flat": f"no clear trend now ({now} per 1000 steps is within the noise), after {before}",
                "falling": f"falling steadily: {now} per 1000 steps, after {before}{lost}",
            }[v])
        elif v in ("flat", "rising"):
            lines.append("no clear descent: the slope is within the noise" if v == "flat" else "the loss is rising")
        if self.forecast is not None and self.total_steps is not None:
            se = f" +- {2 * self.forecast_se:.2g}" if self.forecast_se is not None else ""
            lines.append(f"forecast at step {self.total_steps:,} (the planned last step): {self.forecast:.4g}{se}")
        if self.target_loss is not None:
            lines.append(self._eta_line())
        return lines

    def _eta_line(self) -> str:
        target = f"target loss {self.target_loss:g}"
        if self.eta_step is None:
            return f"{target}: not reached at the current rate"
        if self.eta_step <= self.end_step:
            return f"{target}: reached (the trend line is at or below it)"
        late = ""
        if self.total_steps is not None and self.eta_step > self.total_steps:
            late = f", after the planned {self.total_steps:,} steps"
        return f"{target}: reached at step ~{self.eta_step:,.0f} at the current rate{late}"


def default_window(first: int, last: int, gap: int, total_steps: int | None) -> int:
    """A fifth of the steps run so far (a slope per log(step) needs windows that grow with the step), at least
    the convergence rule's window (total_steps / 50, at least 1000); at most half the data; never so short
    that a block (a tenth of a window) holds no point."""
    w = max(1000, (total_steps or 0) // 50, last // 5)
    w = min(w, (last - first) // 2)
    return max(w, 10 * gap, Trend.BLOCKS)


def summarize(
    steps: Sequence[int],
    losses: Sequence[float | None],
    *,
    total_steps: int | None = None,
    target_loss: float | None = None,
    window_steps: int | None = None,
) -> TrendSummary | None:
    """The trend of the loss over the last window and the one before; None when there is not enough data
    (fewer than 10 blocks of a tenth of a window with a finite loss)."""
    pts = sorted((int(s), float(x)) for s, x in zip(steps, losses, strict=True)
                 if x is not None and s >= 1 and math.isfinite(x))
    if len(pts) < Trend.BLOCKS:
        return None
    gaps = sorted(b[0] - a[0] for a, b in zip(pts, pts[1:], strict=False))
    window = max(window_steps or default_window(pts[0][0], pts[-1][0], gaps[len(gaps) // 2], total_steps),
                 Trend.BLOCKS)
    tr = Trend(window, history=1)
    b = tr.block_steps
    blocks = sorted({s // b for s, _ in pts})
    if len(blocks) < Trend.BLOCKS:
        return None
    used = blocks[-2 * Trend.BLOCKS:] if len(blocks) >= 2 * Trend.BLOCKS else blocks[-Trend.BLOCKS:]
    first = used[0]
    pts = [p for p in pts if p[0] // b >= first]
    prev_end: int | None = None
    for s, x in pts:
        if tr.add(s, x) and tr.reference is None:  # the previous window just completed
            prev_end = max(p[0] for p in pts if p[0] // b < s // b)
            tr.commit()
    tr.add((blocks[-1] + 1) * b, pts[-1][1])  # closes the newest block, so the last window ends at the data's end
    cur = tr.current
    if cur is None:
        return None
    end = pts[-1][0]
    slope, at_end, t, _ = cur
    se = max(abs(slope / t) if t else 0.0, tr.slope_floor)
    clear = abs(slope) >= MIN_T * se if se > 0 else slope != 0.0
    ref = tr.reference
    fc = tr.forecast(total_steps) if total_steps is not None and total_steps > end else None
    eta: float | None = None
    if target_loss is not None:
        eta = float(end) if at_end <= target_loss else tr.eta(target_loss)
        if eta is not None:
            eta = max(eta, float(end))
    return TrendSummary(
        shift=level_shift(pts), start_step=pts[0][0], end_step=end, window_steps=window, points=len(pts),
        loss_now=at_end,
        slope_per_1000=Trend.per_1000_steps(slope, end), per_doubling=Trend.per_doubling(slope), clear=clear,
        prev_end_step=prev_end if ref is not None else None,
        prev_slope_per_1000=None if ref is None or prev_end is None else Trend.per_1000_steps(ref[0], prev_end),
        prev_per_doubling=None if ref is None else Trend.per_doubling(ref[0]),
        descent_lost=None if ref is None or ref[0] >= 0 else 1.0 - slope / ref[0],
        total_steps=total_steps, forecast=None if fc is None else fc[0], forecast_se=None if fc is None else fc[1],
        target_loss=target_loss, eta_step=eta,
    )
