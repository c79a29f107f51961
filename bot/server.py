"""`msmon serve --config config/bot.yaml`: run the bot until SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
from typing import Any

from aiohttp import web

from msmon.config.errors import ConfigError

from .app import STORE, create_app
from .config import BotConfig, load_bot_config


def serve(config_path: str | None, host: str | None = None, port: int | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        cfg = load_bot_config(config_path)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    if host is not None:
        cfg.host = host
    if port is not None:
        cfg.port = port
    app = create_app(cfg)
    logging.getLogger("msmon.bot").info("msmon bot listening on http://%s:%d (state: %s)", cfg.host, cfg.port,
                                        cfg.state_path)
    web.run_app(app, host=cfg.host, port=cfg.port, print=None, handle_signals=True)
    return 0


class BotThread:
    """The bot served from a background thread with its own event loop (the demo; tests)."""

    def __init__(self, cfg: BotConfig, **app_kwargs: Any) -> None:
        self.cfg = cfg
        self.loop = asyncio.new_event_loop()
        self.app = create_app(cfg, **app_kwargs)
        self.port = 0
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="msmon-bot", daemon=True)
        self.thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the bot did not start within 30 s")
        if self._error is not None:
            raise RuntimeError(f"the bot did not start: {self._error}") from self._error

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.runner = web.AppRunner(self.app)
        try:
            self.loop.run_until_complete(self.runner.setup())
            site = web.TCPSite(self.runner, self.cfg.host, self.cfg.port)
            self.loop.run_until_complete(site.start())
            sockets = getattr(site._server, "sockets", None)
            self.port = int(sockets[0].getsockname()[1]) if sockets else self.cfg.port
        except BaseException as exc:  # noqa: BLE001 - reported to the starting thread
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        self.loop.run_forever()

    @property
    def url(self) -> str:
        return f"http://{self.cfg.host}:{self.port}"

    @property
    def store(self) -> Any:
        return self.app[STORE]

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
