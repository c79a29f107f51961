"""What the local Feishu, DingTalk and WeCom robot servers share: an aiohttp app on loopback (in the
test's event loop), an injected clock, every request recorded with the answer given, and the robots'
per-minute rate limit with its throttle (a robot over its limit is refused for `throttle` seconds).
Each platform's server (feishu_api.py, dingtalk_api.py, wecom_api.py) checks requests as its docs say.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer


@dataclasses.dataclass
class Call:
    path: str
    query: dict[str, str]
    body: Any  # the JSON body (None when it did not parse)
    raw: bytes
    at: float
    answer: dict[str, Any]
    status: int = 200

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.answer.get("errcode", self.answer.get("code")) == 0


class RateWindow:
    """`limit` requests in any `window` seconds; the one over it starts a `throttle` of refusals."""

    def __init__(self, limit: int, window: float, throttle: float) -> None:
        self.limit, self.window, self.throttle = limit, window, throttle
        self.accepted: list[float] = []
        self.throttled_until = float("-inf")

    def admit(self, now: float) -> bool:
        if now < self.throttled_until:
            return False
        recent = [t for t in self.accepted if t > now - self.window]
        if len(recent) >= self.limit:
            self.throttled_until = now + self.throttle
            return False
        self.accepted = [*recent, now]
        return True


class FakeRobot:
    """Subclasses implement `answer(path, query, raw, body, now) -> (HTTP status, JSON answer)`."""

    routes: tuple[str, ...] = ("/",)

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.calls: list[Call] = []

    def answer(self, path: str, query: dict[str, str], raw: bytes, body: Any, now: float) -> tuple[int, dict[str, Any]]:
        raise NotImplementedError

    async def _handle(self, request: web.Request) -> web.Response:
        raw = await request.read()
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        now = self.clock()
        status, answer = self.answer(request.path, dict(request.query), raw, body, now)
        self.calls.append(Call(request.path, dict(request.query), body, raw, now, answer, status))
        return web.json_response(answer, status=status)

    def more_routes(self, app: web.Application) -> None:
        """A platform's other endpoints (Feishu: the app's token and image upload)."""

    @property
    def delivered(self) -> list[Call]:
        return [c for c in self.calls if c.ok]

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[str]:
        """Serve on 127.0.0.1 (a free port); yields the base URL."""
        app = web.Application(client_max_size=8 << 20)
        for route in self.routes:
            app.router.add_post(route, self._handle)
        self.more_routes(app)
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        try:
            yield str(server.make_url("")).rstrip("/")
        finally:
            await server.close()
