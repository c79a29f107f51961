"""The embedded default receiver: readable lines on stdout, chart PNGs written to a folder.

Job data never reaches the terminal raw (control characters are shown as `\\x1b`-style text) and
never names a path: chart files are `msmon.common.safenames.slug`s checked to stay in `charts_dir`.
"""

from __future__ import annotations

import itertools
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TextIO

from bot.receivers import Message, Note
from bot.receivers.render import escape_console, text
from msmon.common.safenames import inside, slug
from msmon.contract.wire import Event, Status

if TYPE_CHECKING:
    from bot.store.windows import Windows

log = logging.getLogger("msmon.bot")


def save_png(directory: str, name: str, png: bytes) -> str:
    """Write a chart into the charts folder; its path. `name` may carry job data (a run id): the file is
    its safe slug (plus `.png`) inside `directory`, whatever it says (OSError when the disk refuses)."""
    stem = name[:-4] if name.endswith(".png") else name
    os.makedirs(directory, exist_ok=True)
    path = inside(directory, slug(stem, max_len=120) + ".png")
    with open(path, "wb") as f:
        f.write(png)
    return path


async def save_status_chart(directory: str, event: Event, windows: Windows | None = None,
                            firing: Sequence[Mapping[str, Any]] = ()) -> str | None:
    """`msmon cmd status`'s chart, drawn off the event loop into the charts folder; its path, or None when
    matplotlib or the disk refuses (logged: a chart never fails the command). `windows`: the bot's per-device
    rings, for one throughput line per rank; `firing`: the run's firing alerts, marked where they began."""
    from bot.charts import render_chart_off_loop
    from bot.charts.draw import alert_starts, rank_throughput  # matplotlib only when drawn

    ranks = rank_throughput(windows, event.run_id) if windows is not None else None
    try:  # the file is a slug of the run id inside the folder (save_png)
        png = await render_chart_off_loop(event, ranks, alert_starts(firing))
        return save_png(directory, f"status-{event.run_id}-step{event.step}.png", png)
    except Exception as exc:  # noqa: BLE001 - matplotlib or the disk: the answer goes without its chart
        log.warning("msmon bot: status chart of run %r step %d not drawn or written to %s: %s: %s", event.run_id,
                    event.step, directory, type(exc).__name__, str(exc).strip().splitlines()[:1])
        return None


def _lines(body: str) -> list[str]:
    return [escape_console(line) for line in body.split("\n")]


class ConsoleReceiver:
    name = "console"

    def __init__(self, charts_dir: str | None, out: TextIO | None = None) -> None:
        self.charts_dir = charts_dir
        self.charts = charts_dir is not None
        self.out = out or sys.stdout
        self._ids = itertools.count(1)
        self._charted: set[str] = set()  # posts whose chart went with them (attach has nothing left to write)

    def _save(self, name: str, png: bytes) -> str:
        """The chart's path, or a line saying why it is not there (a full disk never blocks the text)."""
        assert self.charts_dir is not None
        try:
            return save_png(self.charts_dir, name, png)
        except (OSError, ValueError) as exc:
            log.warning("msmon bot: console chart %r not written to %s: %s; the alert is printed without it",
                        name, self.charts_dir, exc)
            return f"not written ({type(exc).__name__}: {exc})"

    def _write(self, prefix: str, lines: list[str]) -> None:
        """`lines`, the first after `prefix` and the others indented under it (a reply reads as one piece)."""
        pad = " " * len(prefix)
        self.out.write("".join(f"[msmon] {prefix if i == 0 else pad}{line}\n" for i, line in enumerate(lines)))
        self.out.flush()

    async def post(self, channel: str, msg: Message) -> str:
        ref = f"console-{next(self._ids)}"
        lines = text(msg, escape_console).split("\n")
        if msg.chart is not None and self.charts_dir is not None:
            lines.append("chart: " + self._chart(ref, msg, msg.chart))
        self._write("", lines)
        return ref

    def _chart(self, ref: str, msg: Message, png: bytes) -> str:
        self._charted.add(ref)
        return escape_console(self._save(f"{msg.run_id}-{msg.rule}-step{msg.lead.step}-{ref}", png))

    async def attach(self, channel: str, ref: str, msg: Message) -> None:
        """The chart of a post that went before its chart was drawn (the outbox waits for it at most a second):
        written now and named under the alert. A chart written with its post is not written twice."""
        if ref in self._charted:
            self._charted.discard(ref)
            return
        if msg.chart is not None and self.charts_dir is not None:
            self._write("  chart: ", [self._chart(ref, msg, msg.chart)])
            self._charted.discard(ref)

    async def update(self, channel: str, ref: str, msg: Message) -> None:
        """A chat message is edited in place; a terminal cannot edit a line it printed. So a resolution's update
        (the firing message marked resolved) is not printed again: the reply before it said RESOLVED."""
        if msg.status is Status.RESOLVED:
            return
        self._write("update: ", text(msg, escape_console).split("\n"))  # the same alert, more devices or a rise

    async def reply(self, channel: str, ref: str, msg: Message) -> None:
        self._write("  re: ", text(msg, escape_console).split("\n"))  # in its alert's thread, as in a chat

    async def note(self, note: Note) -> None:
        """Printed, whatever its reply address: the console has one place to write to."""
        lines = _lines(note.text)
        if note.chart is not None and self.charts_dir is not None:
            lines.append("chart: " + escape_console(self._save(f"status-{note.command_id or next(self._ids)}",
                                                               note.chart)))
        self._write("", lines)
