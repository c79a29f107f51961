"""The delivery trace (bot/delivery/trace.py, MSMON_DELIVERY_TRACE): a line per settled message, and a file that
cannot be written never reaches the delivery that calls it."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from bot.delivery.trace import Trace


def test_a_settled_message_writes_its_stages(tmp_path: Any) -> None:
    path = tmp_path / "trace.jsonl"
    t = Trace(str(path))
    t.mark([1, 2], "turn")
    t.mark([1, 2], "planned")
    t.settled([1, 2], "run-1", "alert", "delivered", time.time())
    line = json.loads(path.read_text())
    assert line["run"] == "run-1" and line["state"] == "delivered"
    assert {"turn", "planned", "settled", "received"} <= set(line["stages"])


def test_a_trace_that_cannot_be_written_turns_itself_off_and_says_so_once(tmp_path: Any, caplog: Any) -> None:
    t = Trace(str(tmp_path))  # a directory: opening it to append fails
    with caplog.at_level(logging.WARNING, logger="msmon.bot"):
        for i in range(3):
            t.mark([i], "turn")
            t.settled([i], "run-1", "alert", "delivered", None)  # raises nothing
    assert not t.on
    said = [r for r in caplog.records if "delivery trace cannot be written" in r.getMessage()]
    assert len(said) == 1 and "MSMON_DELIVERY_TRACE" in said[0].getMessage()
