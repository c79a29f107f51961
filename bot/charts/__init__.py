"""The metric chart posted with an alert (draw.py: matplotlib's Agg canvas, off the event loop; the rule's own lines
on it from lines.py) and the signed, expiring links that serve it to robots that cannot take an image (links.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bot.charts.draw import AlertStart, RankSeries
    from msmon.contract.wire import Event


async def render_chart_off_loop(event: Event, ranks: Mapping[str, RankSeries] | None = None,
                                starts: Sequence[AlertStart] = (),
                                timed: Callable[[str], object] | None = None) -> bytes:
    """`draw.render_chart` in the default executor: a chart takes tens of milliseconds the event loop must not,
    and matplotlib's first import takes seconds (imported in the thread: the loop never waits for it; on the loop
    the module's import lock would hold it until the thread's import is done). `timed`: called in the thread
    with "chart_start" and "chart_end" (bot/delivery/trace.py)."""
    def draw() -> bytes:
        if timed is not None:
            timed("chart_start")
        from bot.charts.draw import render_chart

        png = render_chart(event, ranks=ranks, starts=starts)
        if timed is not None:
            timed("chart_end")
        return png

    return await asyncio.get_running_loop().run_in_executor(None, draw)
