"""`msmon replay --plot out.png`: the replayed curves in four panels, with the alerts marked.

matplotlib is imported here only (it is in the `bot` extra, not a notifier dependency), through its
object API with the Agg canvas: a `Figure` of its own, no pyplot state.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from msmon.contract.wire import Event, Severity, Status

if TYPE_CHECKING:
    from msmon.offline.replay import Curves, Replayed

SEVERITY_COLOURS = {Severity.ERROR: "#d62728", Severity.WARNING: "#ff7f0e"}
LINE_COLOURS = ("#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
LOG_SPAN = 20.0  # the grad norm panel goes to a log scale when its values span more than this factor
MAX_LABELS = 25  # rule names written beside the alert lines; more would be unreadable
LABEL_ROWS = 3  # alert labels close together are staggered down over this many rows ...
LABEL_GAP = 0.025  # ... when nearer than this fraction of the x range; a label with no free row is left out
TICK = 0.012  # half the width of an alert's threshold bar, as a fraction of the x range

# (Curves attribute, panel label, Event.metric values marked on this panel)
PANELS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("loss", "loss", ("loss",)),
    ("grad_norm", "grad norm", ("grad_norm",)),
    ("lr", "learning rate", ("learning_rate",)),
    ("throughput", "throughput", ("throughput", "step_time")),  # its label: throughput_label(the log's format)
)


def _load() -> tuple[Any, Any]:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise RuntimeError("--plot needs matplotlib: pip install 'msmon[bot]' (or pip install matplotlib)") from exc
    return Figure, FigureCanvasAgg


def _plottable(values: Sequence[float | None]) -> list[float]:
    """A curve as matplotlib draws it: gaps (not logged, NaN, Inf) as NaN, which it leaves blank."""
    return [v if v is not None and math.isfinite(v) else math.nan for v in values]


def _draw_panel(ax: Any, attr: str, label: str, curves: dict[str, Curves]) -> None:
    drawn = False
    positive: list[float] = []
    for i, (device, c) in enumerate(curves.items()):
        ys = _plottable(getattr(c, attr))
        if all(math.isnan(y) for y in ys):
            continue
        drawn = True
        ax.plot(c.steps, ys, color=LINE_COLOURS[i % len(LINE_COLOURS)], linewidth=0.8,
                label=f"device {device}" if len(curves) > 1 else None)
        positive += [y for y in ys if y > 0]
    ax.set_ylabel(label)
    ax.grid(True, alpha=0.3)
    if not drawn:
        ax.text(0.5, 0.5, "not in the log", transform=ax.transAxes, ha="center", va="center", color="#888888")
        ax.set_yticks([])
    elif attr == "grad_norm" and positive and max(positive) / min(positive) > LOG_SPAN:
        ax.set_yscale("log")
        ax.set_ylabel(f"{label} (log scale)")


def label_rows(steps: Sequence[int], span: float, rows: int = LABEL_ROWS, gap: float = LABEL_GAP) -> list[int | None]:
    """For alert labels at `steps` (in order): the row each is written in (0: the top), so that labels nearer
    than `gap` x `span` go down a row instead of over each other; None where every row is taken nearby."""
    last: list[float] = [-math.inf] * rows
    out: list[int | None] = []
    for s in steps:
        row = next((r for r in range(rows) if s - last[r] >= gap * span), None)
        if row is not None:
            last[row] = s
        out.append(row)
    return out


def _mark(ax: Any, events: list[Event], labelled: bool, span: float) -> int:
    """The alert lines, and their rule names staggered (`label_rows`); how many names were left out. Where the
    rule has a level in the metric's units (bot/charts/lines.py's `threshold_lines`), a short horizontal tick at the
    alert says it (a creep's fitted trend is drawn over its span)."""
    events = sorted(events, key=lambda e: e.step)
    rows = label_rows([e.step for e in events], span) if labelled else [None] * len(events)
    for e, row in zip(events, rows, strict=True):
        colour = SEVERITY_COLOURS[e.severity]
        ax.axvline(e.step, color=colour, linewidth=1.2, alpha=0.8,
                   linestyle="-" if e.severity is Severity.ERROR else "--")
        for line in _levels(e):
            if line.kind == "trend" and line.x0 is not None and line.y0:
                ax.plot([line.x0, e.step], [line.y0, line.y], color=colour, linewidth=1.6, linestyle=":")
            elif line.kind == "threshold":
                ax.plot([e.step - TICK * span, e.step + TICK * span], [line.y, line.y], color=colour, linewidth=2.0)
        if row is not None:
            ax.text(e.step, 1.0 - row / LABEL_ROWS, f" {e.rule}", transform=ax.get_xaxis_transform(), rotation=90,
                    va="top", ha="right", fontsize=7, color=SEVERITY_COLOURS[e.severity])
    return sum(r is None for r in rows) if labelled else 0


def _levels(e: Event) -> list[Any]:
    """The alert's lines in its metric's units (none without the bot's charts installed)."""
    try:
        from bot.charts.lines import threshold_lines
    except ImportError:
        return []
    return threshold_lines(e)


def throughput_label(fmt: str) -> str:
    """What the log's throughput is: MindFormers logs samples/s per device; other logs say no unit."""
    return "samples/s per device" if fmt == "mindformers" else "throughput (as logged)"


def plot_replay(result: Replayed, path: str, *, title: str = "", width_px: int = 1400) -> None:
    """Write a PNG of the replay's curves to `path`, each new alert a line on its metric's panel
    (ERROR solid red, WARNING dashed orange)."""
    replay_figure(result, title=title, width_px=width_px).savefig(path, dpi=100)


def replay_figure(result: Replayed, *, title: str = "", width_px: int = 1400) -> Any:
    """The matplotlib `Figure` that `plot_replay` saves (with its Agg canvas)."""
    figure_cls, canvas_cls = _load()
    dpi = 100
    fig = figure_cls(figsize=(width_px / dpi, width_px * 0.7 / dpi), dpi=dpi, facecolor="white")
    canvas_cls(fig)
    axes = fig.subplots(len(PANELS), 1, sharex=True)
    firing = [e for e in result.events if e.status is Status.FIRING and not e.repeat]
    labelled = len(firing) <= MAX_LABELS
    steps = [s for c in result.curves.values() for s in c.steps]
    span = float(max(steps) - min(steps)) if steps else 1.0
    left_out = 0
    for ax, (attr, label, metrics) in zip(axes, PANELS, strict=True):
        _draw_panel(ax, attr, throughput_label(result.format) if attr == "throughput" else label, result.curves)
        left_out += _mark(ax, [e for e in firing if e.metric in metrics], labelled, span or 1.0)
    unlabelled = ("" if labelled else f"; {len(firing)} alerts: too many to name") + \
        (f"; {left_out} names left out where alerts crowd" if left_out else "")
    axes[-1].set_xlabel("step")
    if len(result.curves) > 1:
        axes[0].legend(loc="upper right", fontsize=8)
    counts = {s: sum(e.severity is s for e in firing) for s in (Severity.ERROR, Severity.WARNING)}
    fig.suptitle(f"{title}\n{counts[Severity.ERROR]} ERROR (red, solid), {counts[Severity.WARNING]} WARNING "
                 f"(orange, dashed){unlabelled}; a short bar: the alert's threshold, dotted: a creep's trend",
                 fontsize=10)
    fig.subplots_adjust(left=0.07, right=0.98, top=0.92, bottom=0.06, hspace=0.08)
    return fig
