"""Charts served by the bot behind signed, expiring links, for a chat that cannot take an image from
msmon (a Feishu custom bot, a DingTalk robot): `GET /charts/<token>`.

`ChartLinks.publish` writes the PNG under a content-addressed name (its SHA-256, so no job text reaches
the file system) and returns the link `<public_url>/charts/<sha>.<expires>.<hmac>`; `check` gives the
file back only while the link is unexpired and its HMAC (SHA-256, keyed from the environment) matches.
Files older than the links' lifetime are removed as new ones are written. The clock is injected.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import time
from collections.abc import Callable
from pathlib import Path

from aiohttp import web

from bot.config import BotConfig

log = logging.getLogger("msmon.bot")

ROUTE = "/charts/{token}"
_TOKEN = re.compile(r"([0-9a-f]{64})\.(\d{1,12})\.([0-9a-f]{32})")


class ChartLinks:
    def __init__(self, key: bytes, ttl: float, folder: str | os.PathLike[str], public_url: str,
                 clock: Callable[[], float] = time.time) -> None:
        self.key, self.ttl, self.folder, self.clock = key, ttl, Path(folder), clock
        self.public_url = public_url.rstrip("/")

    def _sig(self, body: str) -> str:
        return hmac.new(self.key, body.encode(), hashlib.sha256).hexdigest()[:32]

    def publish(self, png: bytes) -> str:
        """Store `png` and return its signed link (valid for `ttl` seconds from now)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256(png).hexdigest()
        path = self.folder / f"{digest}.png"
        if not path.exists():
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(png)
            tmp.replace(path)
        self._forget_old()
        body = f"{digest}.{int(self.clock() + self.ttl)}"
        return f"{self.public_url}/charts/{body}.{self._sig(body)}"

    def check(self, token: str) -> Path | str:
        """The chart file of a valid link, or why the link is refused."""
        m = _TOKEN.fullmatch(token)
        if m is None:
            return "not a chart link msmon made"
        digest, expires, sig = m.groups()
        if not hmac.compare_digest(sig, self._sig(f"{digest}.{expires}")):
            return "the link's signature does not match (edited, or made with another key)"
        if self.clock() > int(expires):
            return f"the link expired {int(self.clock() - int(expires))} s ago"
        path = self.folder / f"{digest}.png"
        return path if path.is_file() else "this chart is no longer kept"

    def _forget_old(self) -> None:
        horizon = self.clock() - self.ttl
        for old in self.folder.glob("*.png"):
            try:
                if old.stat().st_mtime < horizon:
                    old.unlink()
            except OSError:
                continue  # removed meanwhile, or not ours to remove: try again next time


def chart_links(cfg: BotConfig, clock: Callable[[], float] = time.time) -> ChartLinks | None:
    """The bot's chart links when bot.chart_links.public_url and the link key are set; else None (no links)."""
    cl = cfg.chart_links
    if not cl.public_url:
        return None
    key = os.environ.get(cl.secret_env, "")
    if not key:
        log.warning("msmon bot: Feishu and DingTalk alerts go without chart links: the environment variable %s (the "
                    "key that signs them) is empty", cl.secret_env)
        return None
    return ChartLinks(key.encode(), cl.ttl, Path(cfg.console.charts_dir) / "links", cl.public_url, clock)


def add_chart_route(app: web.Application, links: ChartLinks | None) -> None:
    """GET /charts/<token>: the PNG of a valid link; 403 with the reason otherwise."""
    if links is None:
        return

    async def chart(request: web.Request) -> web.StreamResponse:
        found = links.check(request.match_info["token"])
        if isinstance(found, str):
            raise web.HTTPForbidden(reason=found)
        return web.FileResponse(found, headers={"Content-Type": "image/png", "Cache-Control": "private, max-age=300",
                                                "X-Content-Type-Options": "nosniff"})

    app.router.add_get(ROUTE, chart)
