"""Slow requests are cut: a client that sends its headers or its body a byte at a time holds a
connection and a coroutine for as long as it likes unless something ends it.

* Headers: the connection's keep-alive timer (aiohttp's `keepalive_timeout`, started when the
  connection opens and after each answer) closes a connection that has not sent a whole request
  within `bot.read_timeout` seconds. `runner_args` gives it to the AppRunner.
* Bodies: `read_in_time` reads a request's body within `bot.read_timeout` before the handler sees it
  (408 otherwise; bot/app.py's one middleware calls it); the handler then reads it from memory. A multipart
  body is left to its handler.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

_timeout: Any = getattr(asyncio, "timeout", None)  # Python 3.11's asyncio.timeout


def runner_args(read_timeout: float) -> dict[str, Any]:
    """The AppRunner's arguments that cut slow headers (and idle keep-alive connections)."""
    return {"keepalive_timeout": read_timeout}


async def read_in_time(request: web.Request, read_timeout: float) -> None:
    """The request's body read within `read_timeout` seconds (HTTPRequestTimeout otherwise), kept for the handler."""
    if request.body_exists and not request.content_type.startswith("multipart/"):
        if request.content.is_eof():  # all of it came with the headers (a job's envelope, nearly always): no timer
            await request.read()
            return
        try:
            if _timeout is not None:
                async with _timeout(read_timeout):  # a timer, not wait_for's task per request
                    await request.read()
            else:  # pragma: no cover - Python 3.10
                await asyncio.wait_for(request.read(), read_timeout)
        except asyncio.TimeoutError:
            raise web.HTTPRequestTimeout(reason=f"the request body did not arrive within {read_timeout:g} s "
                                                "(bot.read_timeout)") from None

