"""`msmon serve`: run the msmon bot service (the bot's dependencies load only here)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from msmon.cli.common import USAGE


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("serve", help="run the msmon bot service")
    p.add_argument("--config", default=None, help="bot.yaml (default: built-in defaults, console receiver)")
    p.add_argument("--host", default=None, help="address to listen on, instead of bot.host (default 127.0.0.1: this "
                   "machine only; 0.0.0.0: every interface, for jobs on other machines)")
    p.add_argument("--port", type=int, default=None, help="port to listen on, instead of bot.port (default 8080; "
                   "0: any free port, printed at start)")
    p.add_argument("-v", "--verbose", action="count", default=0, help="also the libraries' INFO lines: the "
                   "scheduler's ticks and one access-log line per HTTP request (-vv: DEBUG)")
    p.add_argument("--allow-no-tokens", action="store_true", help="start even when no job or operator token is "
                   "set (the bot then refuses every job and every command; without this it refuses to start)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """The config is read and checked first (bot.config: the settings only, a fraction of a second), then the server
    is imported (aiohttp, the store, the chat platforms: about a second of CPU): a bad bot.yaml is answered at once."""
    try:
        from bot.config import load_bot_config
        from msmon.config.errors import ConfigError
    except ImportError as exc:
        print(f"msmon serve needs the bot's dependencies: pip install 'msmon[bot]' ({exc})", file=sys.stderr)
        return USAGE
    try:
        cfg = load_bot_config(args.config)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return USAGE
    try:
        from bot.server import serve  # the [bot] extra: only when serving
    except ImportError as exc:
        print(f"msmon serve needs the bot's dependencies: pip install 'msmon[bot]' ({exc})", file=sys.stderr)
        return USAGE
    return serve(cfg, args.host, args.port, verbose=args.verbose, allow_no_tokens=args.allow_no_tokens)
