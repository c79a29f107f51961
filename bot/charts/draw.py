"""The metric snapshot posted with an alert: four stacked panels of the run's recent metrics.

`render_chart(event)` returns PNG bytes. It uses matplotlib's object API with the Agg canvas only
(a `Figure` of its own per call, no pyplot, no rcParams changes), so worker threads can call it
side by side. The layout is computed here in pixels rather than by a layout engine: the panels'
margins are known in advance, and skipping constrained/tight layout halves the render time.

What is drawn follows the README's rule table:

- every panel: the finite values as a line, a red 'x' near the top edge where a value was NaN/Inf,
  "not reported" where the series is all None, and a dotted vertical line at the alert step;
- the panel of the metric the rule watches (`event.metric`) gets a frame in the severity's colour
  (`step_time` has no panel, so nothing is framed for its rules);
- horizontal lines only where they are in the metric's own units: `grad_norm`'s absolute threshold;
  the rolling median (`baseline`) of `loss_spike`, `grad_norm_spike` and `throughput_drop`, plus the
  level it implies (baseline x threshold for a spike or a gross jump; for `loss_spike` in sigmas,
  baseline + threshold x sigma, the sigma being the one the alert measured; baseline x (1 - threshold)
  for a drop). The other rules' thresholds are in units of their own (fractions of a fit, sample counts)
  and are not drawn;
- the throughput panel draws tokens/s, or samples/s when the job reports no tokens/s (its label says
  which); with `ranks` (a run's per-device rings, `rank_throughput`) one line per rank;
- `grad_norm_creep`'s fitted trend over its span and the level its threshold sets at the trend's end;
- the steps fp16 loss scaling skipped (`window.overflow_steps`) as small triangles at the foot of the grad norm
  panel: a skipped step, not a fault (its grad norm is no measurement, often absent);
- a constant series (a flat LR) is one line mid-panel with one tick, not ticks around nothing;
- the x label says the alert's step and its wall-clock time (UTC, the job's clock);
- a log scale (the grad norm over more than `LOG_SPAN`x) says so in its panel's label;
- a `status` chart (`rule == "status"`) is titled with the highest severity firing, or "no alert firing".
"""

from __future__ import annotations

import datetime
import io
import math
import textwrap
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import EngFormatter, FixedLocator, Formatter, FuncFormatter, MaxNLocator, NullLocator

from msmon.contract.wire import Event, Severity, Status, Window

from .lines import _finite, threshold_lines

if TYPE_CHECKING:
    from bot.store.windows import Windows

SEVERITY_COLOURS = {Severity.ERROR: "#d62728", Severity.WARNING: "#ff7f0e"}
RESOLVED_COLOUR = "#2ca02c"
NONFINITE_COLOUR = "#d62728"
SKIPPED_COLOUR = "#9467bd"
LINE_COLOUR = "#1f77b4"
BASELINE_COLOUR = "#444444"
TEXT_COLOUR = "#222222"
MUTED_COLOUR = "#888888"

DPI = 100
ASPECT = 0.75  # height / width of the full chart (1200 x 900 at the default width)
EMPTY_ASPECT = 0.25  # height / width of the "no recent metrics" image
LOG_SPAN = 20.0  # grad norm on a log scale when its finite range spans more than this factor
MESSAGE_LINES = 3  # the message is wrapped to at most this many lines
MAX_RANK_LINES = 8  # ranks drawn one line each in the throughput panel; more: the 8 slowest at the end
RANK_COLOURS = ("#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")

RankSeries = tuple[Sequence[int], Sequence[float | None]]  # one rank's (steps, throughput)
AlertStart = tuple[int, str, str]  # a firing alert's (first step, rule, severity), marked on a status chart

# (event.metric, Window field, panel label)
PANELS = (
    ("loss", "loss", "loss"),
    ("grad_norm", "grad_norm", "grad norm"),
    ("learning_rate", "learning_rate", "learning rate"),
    ("throughput", "tokens_per_s", "tokens/s"),
)


def chart_size(event: Event, width_px: int = 1200) -> tuple[int, int]:
    """The (width, height) in pixels of the PNG that `render_chart` makes for `event`."""
    aspect = ASPECT if _has_points(event.window) else EMPTY_ASPECT
    return width_px, max(1, round(width_px * aspect))


def alert_starts(firing: Sequence[Mapping[str, Any]]) -> list[AlertStart]:
    """The firing alerts (the store's rows) as `render_chart(starts=...)` marks them: where each began."""
    return sorted((int(a["first_step"]), str(a["rule"]), str(a["severity"])) for a in firing)


def throughput_field(window: Window) -> tuple[str, str]:
    """(Window field, label) of the throughput panel: tokens/s when the job reports it, else samples/s."""
    if not any(v is not None for v in window.tokens_per_s) and any(v is not None for v in window.samples_per_s):
        return "samples_per_s", "samples/s"
    return "tokens_per_s", "tokens/s"


def rank_throughput(windows: Windows, run_id: str) -> dict[str, RankSeries]:
    """Each device's (steps, throughput) from the bot's per-device rings, for `render_chart(ranks=...)`: tokens/s
    when any device reports it, else samples/s. Empty for a run of one device (the window draws it)."""
    rings = windows.runs.get(run_id, {})
    if len(rings) < 2:
        return {}
    samples = {dev: ring.samples() for dev, ring in sorted(rings.items())}
    tokens = any(x.tokens_per_s is not None for ss in samples.values() for x in ss)
    return {dev: ([x.step for x in ss], [x.tokens_per_s if tokens else x.samples_per_s for x in ss])
            for dev, ss in samples.items()}


def render_chart(event: Event, *, width_px: int = 1200, ranks: Mapping[str, RankSeries] | None = None,
                 starts: Sequence[AlertStart] = ()) -> bytes:
    """PNG bytes of the metric snapshot for `event` (1200 x 900 px at the default width). `ranks`: the run's
    throughput per rank (`rank_throughput`), drawn in the throughput panel one line each when there are two
    or more. `starts`: where the run's firing alerts began (`alert_starts`), marked on a status chart, its
    step axis reaching back to the first of them."""
    return _png(chart_figure(event, width_px=width_px, ranks=ranks, starts=starts).canvas)


def chart_figure(event: Event, *, width_px: int = 1200, ranks: Mapping[str, RankSeries] | None = None,
                 starts: Sequence[AlertStart] = ()) -> Any:
    """The matplotlib `Figure` that `render_chart` saves (with its Agg canvas): what the tests look into."""
    width, height = chart_size(event, width_px)
    # A hair over the exact size: Agg truncates width_in * dpi to whole pixels.
    fig = Figure(figsize=((width + 0.01) / DPI, (height + 0.01) / DPI), dpi=DPI, facecolor="white")
    FigureCanvasAgg(fig)
    g = _Geometry(width, height)
    colour = _status_colour(event)
    y = _header(fig, event, g, colour)
    window = event.window
    if not _has_points(window):
        fig.text(0.5, g.fy((y + height) / 2), "no recent metrics", ha="center", va="center", fontsize=g.pt(15),
                 color=MUTED_COLOUR, style="italic")
        return fig
    assert window is not None
    legend_top = y + g.px(10)
    top = legend_top + _line_px(g.pt(10.5)) + g.px(14)  # one legend row under the message
    left = g.px(108)
    axes = _panels(fig, event, window, top, left, colour, ranks, g)
    steps = [float(s) for s in window.steps]
    if window.overflow_steps:
        _mark_skipped(axes[[m for m, _, _ in PANELS].index("grad_norm")], window.overflow_steps, steps, g)
    if starts:
        _mark_starts(axes, starts, steps, g)
    axes[-1].set_xlabel(f"step   ({'now' if event.rule == 'status' else 'alert'} at step {event.step}, "
                        f"{_clock(event.time)})", fontsize=g.pt(12), labelpad=g.pt(3))
    axes[-1].ticklabel_format(axis="x", useOffset=False, style="plain")
    _legend(fig, axes, left, legend_top, g)
    return fig


def _header(fig: Any, event: Event, g: _Geometry, colour: str) -> float:
    """The title, then the message wrapped to the figure's width; returns where the next row starts (px)."""
    width = g.width
    title = _title(event)
    title_pt = min(g.pt(17), _fit_pt(title, width - 2 * g.px(12), bold=True))
    # Job text is text: parse_math=False, or `loss $\frac{1}{$` is mathtext that fails to draw.
    fig.text(g.fx(12), g.fy(10), title, color=colour, fontsize=title_pt, fontweight="bold", va="top",
             parse_math=False)
    y = g.px(10) + _line_px(title_pt) + g.px(4)
    message_pt = g.pt(12.5)
    message = _wrap(event.message, _chars_per_line(width - 2 * g.px(12), message_pt), MESSAGE_LINES)
    fig.text(g.fx(12), g.fy(y), message, color=TEXT_COLOUR, fontsize=message_pt, va="top", linespacing=1.3,
             parse_math=False)
    return y + message.count("\n") * _line_px(message_pt) * 1.3 + _line_px(message_pt)


def _panels(fig: Any, event: Event, window: Any, top: float, left: float, colour: str,
            ranks: Mapping[str, RankSeries] | None, g: _Geometry) -> list[Any]:
    """One panel per metric of PANELS, stacked under `top`, sharing the step axis."""
    width, height = g.width, g.height
    right, bottom, gap = g.px(18), g.px(52), g.px(12)
    panel_h = (height - top - bottom - gap * (len(PANELS) - 1)) / len(PANELS)
    panel_w = width - left - right
    steps = [float(s) for s in window.steps]
    n = len(steps)
    axes: list[Any] = []
    for i, (metric, field, label) in enumerate(PANELS):
        if metric == "throughput":
            field, label = throughput_field(window)
        panel_top = top + i * (panel_h + gap)
        ax = fig.add_axes((left / width, 1 - (panel_top + panel_h) / height, panel_w / width, panel_h / height),
                          sharex=axes[0] if axes else None)
        axes.append(ax)
        raw = list(getattr(window, field))[:n]
        raw += [None] * (n - len(raw))
        _panel(ax, event, steps, raw, label, metric, metric == event.metric, colour, g)
        if metric == "throughput" and ranks and len(ranks) > 1:
            _rank_lines(ax, ranks, label, g)
        ax.yaxis.set_label_coords(-(left - g.px(28)) / panel_w, 0.5)  # labels aligned whatever the ticks
        ax.axvline(event.step, color=colour, linewidth=g.pt(1.5), linestyle=":", zorder=3,
                   label=f"now: step {event.step}" if event.rule == "status" else f"alert at step {event.step}")
        ax.tick_params(labelbottom=i == len(PANELS) - 1)
    return axes


def _legend(fig: Any, axes: list[Any], left: float, legend_top: float, g: _Geometry) -> None:
    """One legend row for every panel's lines, the alert's marker first."""
    handles: dict[str, Any] = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(lab, h)
    order = sorted(handles, key=lambda lab: (not lab.startswith(("alert", "now")), lab == "NaN/Inf"))
    handles = {lab: handles[lab] for lab in order}
    fig.legend(list(handles.values()), list(handles.keys()), loc="upper left", frameon=False,
               bbox_to_anchor=(left / g.width, g.fy(legend_top)), borderaxespad=0, borderpad=0,
               ncol=len(handles), fontsize=g.pt(10.5), handlelength=2.2, columnspacing=2.0)


def _mark_skipped(ax: Any, skipped: Sequence[int], steps: list[float], g: _Geometry) -> None:
    """A small triangle at the foot of the panel at each step whose update loss scaling skipped (overflow), those
    inside the window's steps only."""
    lo, hi = min(steps), max(steps)
    xs = [float(s) for s in skipped if lo <= s <= hi]
    if xs:
        ax.plot(xs, [0.06] * len(xs), linestyle="none", marker="^", color=SKIPPED_COLOUR, markersize=g.pt(6),
                transform=ax.get_xaxis_transform(), zorder=4, label="skipped step (overflow)")


def _mark_starts(axes: list[Any], starts: Sequence[AlertStart], steps: list[float], g: _Geometry) -> None:
    """A dashed line on every panel where each firing alert began, its rule written at the top panel's edge (a
    rule near the one before it goes a row down); the step axis reaches back to the first of them."""
    first = min(s for s, _, _ in starts)
    lo, hi = min(steps + [first]), max(steps + [first])
    axes[0].set_xlim(lo - 0.02 * (hi - lo or 1), hi + 0.02 * (hi - lo or 1))
    last_x: list[float] = []
    for step, rule, severity in starts:
        colour = SEVERITY_COLOURS.get(Severity(severity), SEVERITY_COLOURS[Severity.ERROR]) \
            if severity in ("WARNING", "ERROR") else MUTED_COLOUR
        for ax in axes:
            ax.axvline(step, color=colour, linewidth=g.pt(1.2), linestyle=(0, (4, 3)), alpha=0.85, zorder=3)
        row = next((i for i, x in enumerate(last_x) if step - x > 0.08 * (hi - lo or 1)), len(last_x))
        if row == len(last_x):
            last_x.append(step)
        last_x[row] = step
        right = step > lo + 0.7 * (hi - lo)  # near the right edge: the label left of its line, not cut off
        axes[0].text(step, 0.97 - 0.13 * row, f"{rule} since {step} " if right else f" {rule} since {step}",
                     transform=axes[0].get_xaxis_transform(), ha="right" if right else "left", va="top",
                     fontsize=g.pt(9), color=colour, parse_math=False)


class _Geometry:
    """Pixel sizes at 1200 px wide, scaled to the width asked for; figure fractions from pixels."""

    def __init__(self, width: int, height: int) -> None:
        self.width, self.height = width, height
        self.scale = width / 1200.0

    def px(self, v: float) -> float:
        return v * self.scale

    def pt(self, v: float) -> float:
        return v * self.scale

    def fx(self, px: float) -> float:
        return px / self.width

    def fy(self, px_from_top: float) -> float:
        return 1 - px_from_top / self.height


def _line_px(pt: float) -> float:
    """Height in pixels of one line of text at `pt` points."""
    return pt * DPI / 72 * 1.2


def _chars_per_line(width_px: float, pt: float) -> int:
    """About how many characters of DejaVu Sans at `pt` points fit in `width_px` (0.58 em on average)."""
    return max(20, int(width_px / (pt * DPI / 72 * 0.58)))


def _fit_pt(text: str, width_px: float, *, bold: bool) -> float:
    """The largest font size (points) at which `text` fits in `width_px` (by the average glyph width)."""
    em = 0.66 if bold else 0.58
    return width_px / (max(1, len(text)) * em * DPI / 72)


def _status_colour(event: Event) -> str:
    if event.status is Status.RESOLVED:
        return RESOLVED_COLOUR
    return SEVERITY_COLOURS.get(event.severity, SEVERITY_COLOURS[Severity.ERROR])


def _title(event: Event) -> str:
    run = event.run_id if len(event.run_id) <= 48 else event.run_id[:45] + "..."
    if event.rule == "status":  # a run's status: what fires now, not an alert's own state
        says = f"{event.severity.value} firing" if event.status is Status.FIRING else "no alert firing"
        return f"status  |  run {run}  |  step {event.step}  |  {says}"
    state = " resolved" if event.status is Status.RESOLVED else (" (reminder)" if event.repeat else "")
    return f"{event.severity.value} {event.rule}{state}  |  run {run}  |  device {event.device}  |  step {event.step}"


def _clock(t: float) -> str:
    """The job's time of the event as a person reads it: "2026-12-03 02:14:07 UTC"."""
    try:
        return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, OSError, ValueError):
        return "time unknown"


def _wrap(text: str, width: int, max_lines: int) -> str:
    lines = textwrap.wrap(" ".join(text.split()), width) or [""]
    if len(lines) > max_lines:
        lines = lines[:max_lines]
        lines[-1] = lines[-1][: max(0, width - 3)].rstrip() + "..."
    return "\n".join(lines)


def _has_points(window: Window | None) -> bool:
    return window is not None and len(window.steps) > 0


def _panel(ax: Any, event: Event, steps: list[float], raw: list[float | None], label: str, metric: str,
           watched: bool, colour: str, g: _Geometry) -> None:
    """One metric's panel: line, NaN/Inf marks, the rule's lines when it watches this metric."""
    ax.set_facecolor("white")
    ax.tick_params(labelsize=g.pt(10.5), length=g.px(4), width=g.pt(0.8), colors="#333333")
    ax.grid(True, color="#e8e8e8", linewidth=g.pt(0.8))
    ax.set_axisbelow(True)
    ax.set_ylabel(label, fontsize=g.pt(12), fontweight="bold" if watched else "normal",
                  color=colour if watched else TEXT_COLOUR)
    for spine in ax.spines.values():
        spine.set_edgecolor(colour if watched else "#aaaaaa")
        spine.set_linewidth(g.pt(2.5) if watched else g.pt(0.8))

    if all(v is None for v in raw):
        ax.text(0.5, 0.5, "not reported", transform=ax.transAxes, ha="center", va="center",
                fontsize=g.pt(14), color=MUTED_COLOUR, style="italic")
        ax.set_yticks([])
        return

    x = np.asarray(steps, dtype=float)
    y = np.array([v if _finite(v) else np.nan for v in raw], dtype=float)
    finite = y[np.isfinite(y)]
    ax.plot(x, y, color=LINE_COLOUR, linewidth=g.pt(1.6), marker="o" if len(finite) <= 40 else None,
            markersize=g.pt(3.5), zorder=2)
    if len(finite) == 0:
        ax.text(0.5, 0.5, "no finite values", transform=ax.transAxes, ha="center", va="center",
                fontsize=g.pt(14), color=MUTED_COLOUR, style="italic")
        ax.set_yticks([])

    if watched and event.status is not Status.RESOLVED and len(finite):
        _rule_lines(ax, event, g, colour)

    log = metric == "grad_norm" and len(finite) > 0 and _log_axis(ax, finite, label, watched, colour, g)
    if not log and len(finite) and _constant(finite):
        # one value all along (a constant LR): one line in the middle, one tick saying it, not a panel of
        # ticks 1.90e-5 ... 2.10e-5 around nothing
        v = float(finite[0])
        pad = abs(v) * 0.5 or 1.0
        ax.set_ylim(v - pad, v + pad)
        ax.yaxis.set_major_locator(FixedLocator([v]))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda t, _: f"{t:.4g}"))
        ax.text(0.01, 0.62, f"constant {v:.4g}", transform=ax.transAxes, ha="left", va="bottom",
                fontsize=g.pt(10), color=MUTED_COLOUR)
    elif not log and len(finite):
        ax.yaxis.set_major_locator(MaxNLocator(nbins=5 if metric == "throughput" else 6, steps=[1, 2, 2.5, 5, 10],
                                               min_n_ticks=3))
        ax.yaxis.set_major_formatter(EngFormatter(sep="") if metric == "throughput" else _TickFormatter())

    bad = [s for s, v in zip(steps, raw, strict=True) if v is not None and not math.isfinite(v)]
    if bad:
        if len(finite):  # headroom so the marks sit above the data, not on it
            t = ax.yaxis.get_transform()
            lo, hi = t.transform(np.array(ax.get_ylim()))
            ax.set_ylim(top=float(t.inverted().transform(np.array([hi + 0.18 * (hi - lo)]))[0]))
        ax.plot(bad, [0.93] * len(bad), linestyle="none", marker="x", color=NONFINITE_COLOUR,
                markersize=g.pt(8), markeredgewidth=g.pt(2), transform=ax.get_xaxis_transform(),
                zorder=4, label="NaN/Inf")


def _log_axis(ax: Any, finite: Any, label: str, watched: bool, colour: str, g: _Geometry) -> bool:
    """A log axis for a grad norm spanning more than LOG_SPAN (symlog when some are 0); False: stays linear."""
    pos = finite[finite > 0]
    if not len(pos) or pos.max() / pos.min() <= LOG_SPAN:
        return False
    ax.set_ylabel(f"{label} (log)", fontsize=g.pt(12), fontweight="bold" if watched else "normal",
                  color=colour if watched else TEXT_COLOUR)
    zeros = len(pos) < len(finite)
    if zeros:  # vanished gradients: linear between 0 and the smallest value, log above
        ax.set_yscale("symlog", linthresh=float(pos.min()))
    else:
        ax.set_yscale("log")
    # Fixed 1-2-5 or decade ticks, thinned to fit, labelled in plain text: the default log
    # locators label every decade (unreadable over 12 of them) and mathtext costs time.
    ax.yaxis.set_major_locator(FixedLocator(_log_ticks(float(pos.min()), float(pos.max()), zeros)))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: _log_label(v)))
    return True


def _constant(finite: Any) -> bool:
    """Whether the finite values are one value (to a part in a million: a float32 LR read back varies by less)."""
    lo, hi = float(finite.min()), float(finite.max())
    return hi - lo <= 1e-6 * max(abs(hi), abs(lo), 1e-300)


class _TickFormatter(Formatter):
    """Tick labels that need no offset text above the axis (it would collide with the panel above):
    "2.85" for ordinary values, "2.85e-4" for very small or large ones, with as many decimals as
    the ticks need to read distinctly and exactly."""

    def __call__(self, x: float, pos: int | None = None) -> str:
        return self.format_ticks([x])[0]

    def format_ticks(self, values: Any) -> list[str]:
        vals = [float(v) for v in values]
        big = max((abs(v) for v in vals), default=0.0)
        if big == 0.0 or not math.isfinite(big):
            return [f"{v:g}" for v in vals]
        exp = math.floor(math.log10(big))
        exp = exp if exp <= -3 or exp >= 5 else 0
        scaled = [v / 10.0**exp for v in vals]
        diffs = [abs(b - a) for a, b in zip(scaled, scaled[1:], strict=False) if b != a]
        tol = 1e-6 * (min(diffs) if diffs else big / 10.0**exp)
        decimals = next((d for d in range(10) if all(abs(round(v, d) - v) <= tol for v in scaled)), 9)
        out = []
        for v in scaled:
            text = f"{v:.{decimals}f}"
            if float(text) == 0.0:
                text = "0"
            out.append(text if exp == 0 or text == "0" else f"{text}e{exp}")
        return out


def _log_ticks(lo: float, hi: float, zero: bool, most: int = 6) -> list[float]:
    """Ticks for a log axis from `lo` to `hi` (> 0): 1-2-5 over a short range, else powers of ten,
    every k-th so that at most `most` remain (plus 0 for a symlog axis)."""
    first, last = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    if hi / lo < 150:
        ticks = [m * 10.0**k for k in range(first, last + 1) for m in (1, 2, 5)]
        ticks = [t for t in ticks if lo / 2 <= t <= hi * 2]
    else:
        stride = max(1, math.ceil((last - first + 1) / most))
        ticks = [10.0**k for k in range(last, first - 1, -stride)]
    return ([0.0] if zero else []) + sorted(ticks)


def _log_label(v: float) -> str:
    """ "0.02", "50", "1e-8": plain text, no mathtext."""
    if v == 0 or 1e-3 <= abs(v) < 1e5:
        return f"{v:g}"
    mantissa, exp = f"{v:.0e}".split("e")
    return f"{mantissa}e{int(exp)}"


def _rank_lines(ax: Any, ranks: Mapping[str, RankSeries], label: str, g: _Geometry) -> None:
    """One thin line per rank over the panel's own line (the slowest `MAX_RANK_LINES` at their last value)."""
    def last(series: RankSeries) -> float:
        vals = [v for v in series[1] if v is not None and math.isfinite(v)]
        return vals[-1] if vals else math.inf

    shown = sorted(ranks, key=lambda dev: last(ranks[dev]))[:MAX_RANK_LINES]
    for i, dev in enumerate(sorted(shown)):
        xs, vs = ranks[dev]
        y = np.array([v if _finite(v) else np.nan for v in vs], dtype=float)
        ax.plot(np.asarray(xs, dtype=float), y, color=RANK_COLOURS[i % len(RANK_COLOURS)], linewidth=g.pt(1.0),
                alpha=0.9, zorder=2, label=f"rank {dev} {label}")
    if len(ranks) > len(shown):
        ax.text(0.99, 0.04, f"{len(shown)} slowest of {len(ranks)} ranks", transform=ax.transAxes, ha="right",
                va="bottom", fontsize=g.pt(9), color=MUTED_COLOUR)


def _rule_lines(ax: Any, event: Event, g: _Geometry, colour: str) -> None:
    """Threshold / baseline lines, only where they are in the panel's metric units."""
    for line in threshold_lines(event):
        if line.kind == "trend" and line.x0 is not None and line.x1 is not None and line.y0:
            xs = np.linspace(line.x0, line.x1, 50)
            ratio = line.y / line.y0
            ax.plot(xs, line.y0 * ratio ** ((xs - xs[0]) / (xs[-1] - xs[0])), color=colour, linewidth=g.pt(2.2),
                    linestyle="--", zorder=3, label=line.label)
        else:
            ax.axhline(line.y, color=BASELINE_COLOUR if line.kind == "baseline" else colour, linewidth=g.pt(1.6),
                       linestyle="--" if line.kind == "baseline" else "-.", zorder=3, label=line.label)


def _png(canvas: Any) -> bytes:
    buf = io.BytesIO()
    canvas.print_png(buf)
    return buf.getvalue()
