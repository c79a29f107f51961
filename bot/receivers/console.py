"""The embedded default receiver: readable lines on stdout, chart PNGs written to a folder."""

from __future__ import annotations

import itertools
import os
import sys
from typing import TextIO

from notifier.wire import Severity, Status

from . import Message, Note
from .render import text


def save_png(directory: str, name: str, png: bytes) -> str:
    """Write a chart into the charts folder; its path."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, name)
    with open(path, "wb") as f:
        f.write(png)
    return path


class ConsoleReceiver:
    name = "console"

    def __init__(self, charts_dir: str | None, out: TextIO | None = None) -> None:
        self.charts_dir = charts_dir
        self.out = out or sys.stdout
        self._ids = itertools.count(1)

    async def _chart(self, msg: Message, ref: str) -> str | None:
        if self.charts_dir is None or msg.severity is not Severity.ERROR or msg.status is not Status.FIRING:
            return None
        from ..chart import render_chart_off_loop  # matplotlib only when a chart is drawn

        png = await render_chart_off_loop(msg.lead)
        return save_png(self.charts_dir, f"{msg.run_id}-{msg.rule}-step{msg.lead.step}-{ref}.png", png)

    def _write(self, prefix: str, body: str) -> None:
        self.out.write("\n".join(f"[msmon] {prefix}{line}" for line in body.splitlines()) + "\n")
        self.out.flush()

    async def post(self, channel: str, msg: Message) -> str:
        ref = f"console-{next(self._ids)}"
        chart = await self._chart(msg, ref)
        self._write("", text(msg) + (f"\nchart: {chart}" if chart else ""))
        return ref

    async def update(self, channel: str, ref: str, msg: Message) -> None:
        self._write(f"(update of {ref}) ", text(msg))

    async def reply(self, channel: str, ref: str, msg: Message) -> None:
        self._write(f"(in reply to {ref}) ", text(msg))

    async def note(self, channel: str, note: Note) -> None:
        path = None
        if note.chart is not None and self.charts_dir is not None:
            path = save_png(self.charts_dir, f"status-{note.command_id or next(self._ids)}.png", note.chart)
        self._write("", note.text + (f"\nchart: {path}" if path else ""))
