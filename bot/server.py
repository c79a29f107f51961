"""`msmon serve --config config/bot.yaml`: run the bot until SIGINT/SIGTERM."""

from __future__ import annotations

import logging
import sys

from aiohttp import web

from notifier.config import ConfigError

from .app import create_app
from .config import load_bot_config


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
