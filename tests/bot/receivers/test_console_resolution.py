"""The console receiver prints a resolution once (issue 19: RESOLVED twice, the reply and the firing message
rewritten as resolved, with different steps); a message that more devices joined is still printed again."""

from __future__ import annotations

import asyncio
import io

import pytest

pytest.importorskip("aiohttp")

from bot.receivers import Message  # noqa: E402
from bot.receivers.console import ConsoleReceiver  # noqa: E402
from msmon.contract.wire import Event, Severity, Status  # noqa: E402


def _msg(status: Status, step: int, devices: tuple[str, ...] = ("0",)) -> Message:
    events = [Event(run_id="r", device=d, step=step, time=0.0, rule="loss_spike", severity=Severity.ERROR,
                    status=status, value=9.0, threshold=6.0, message="loss is up") for d in devices]
    return Message(key="k", run_id="r", project="p", rule="loss_spike", severity=Severity.ERROR, status=status,
                   events=events)


def test_a_resolution_is_printed_once() -> None:
    out = io.StringIO()
    rx = ConsoleReceiver(None, out=out)

    async def story() -> None:
        ref = await rx.post("c", _msg(Status.FIRING, 662))
        await rx.reply("c", ref, _msg(Status.RESOLVED, 699))  # what the outbox sends for a resolution ...
        await rx.update("c", ref, _msg(Status.RESOLVED, 662))  # ... and the firing message marked resolved
        await rx.update("c", ref, _msg(Status.FIRING, 662, ("0", "1")))  # a device joined: printed again

    asyncio.run(story())
    text = out.getvalue()
    assert text.count("RESOLVED loss_spike") == 1 and "step 699" in text and "update: ERROR" in text


def test_a_chart_drawn_after_its_post_is_written_by_attach_and_none_twice(tmp_path) -> None:
    """The outbox posts a new alert's text after at most a second without its chart (a busy bot draws slowly)
    and attaches the chart when drawn: the console writes it then, under the alert; a chart that went with its
    post is not written again by the attach."""
    out = io.StringIO()
    rx = ConsoleReceiver(str(tmp_path), out=out)
    png = b"\x89PNG\r\n\x1a\n" + b"0" * 16

    async def story() -> None:
        late = _msg(Status.FIRING, 100)
        ref = await rx.post("c", late)  # the text, no chart yet
        late.chart = png
        await rx.attach("c", ref, late)  # the chart follows
        early = _msg(Status.FIRING, 200)
        early.chart = png
        ref2 = await rx.post("c", early)
        await rx.attach("c", ref2, early)

    asyncio.run(story())
    written = sorted(p.name for p in tmp_path.glob("*.png"))
    assert len(written) == 2 and "step100" in written[0] and "step200" in written[1]
    assert out.getvalue().count("chart: ") == 2
