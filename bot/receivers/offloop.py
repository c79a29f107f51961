"""A receiver's HTTP on an event loop of its own, in a thread: what a chat message waits for is the platform's
answer, not its turn on a bot loop that the ingest keeps busy.

On the bot's loop each step of an HTTP request (connect, write, read the status, read the body, close) waits
for everything else ready on that loop. With a thousand ranks posting, a step waits behind hundreds of
envelopes: the bench (bench/bench_error_latency.py) measured 1.6 s p50 from the start of Slack's
chat.postMessage until the local Slack API got it, and as long again until the answer was read, when the
same request takes 20 ms on an idle bot. On this loop a step waits only for the GIL (handed over every
5 ms, sys.getswitchinterval) and for the other receivers' requests. The caller's loop takes one step, when the
answer is in.

`await off_loop(coro)` runs `coro` there and returns its result or raises its exception; cancelling the
caller cancels it there. `coro` must not touch objects of the caller's loop (its futures, events, sessions):
a client that opens its HTTP session per request (slack-sdk's AsyncWebClient without a session) qualifies.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None


def _io_loop() -> asyncio.AbstractEventLoop:
    """The loop of the receivers' HTTP thread, started on first use (one per process, a daemon thread)."""
    global _loop
    with _lock:
        if _loop is None or _loop.is_closed():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="msmon-receivers-http", daemon=True).start()
            _loop = loop
        return _loop


async def off_loop(coro: Coroutine[Any, Any, T]) -> T:
    """`await coro` on the receivers' HTTP loop (see the module's docstring)."""
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, _io_loop()))
