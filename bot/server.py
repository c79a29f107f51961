"""`msmon serve --config config/bot.yaml`: run the bot until SIGINT/SIGTERM.

It prints one line when it listens (the real port, also for `--port 0`) and one when it has stopped. Its log
is quiet by default (`setup_logging`): alerts (the console receiver), warnings and errors, and one line per
lifecycle change (a command queued, a run ended, an escalation step); the scheduler's ticks and the HTTP
access log only with `-v`. On a
signal it stops taking connections, answers the jobs' long polls at once (bot/assembly.py `Drain`; a job polls
again later) and gives the requests still running `SHUTDOWN_TIMEOUT` seconds, so it is gone in about a
second, not after the longest long poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from bot.app import STORE, TOKENS, create_app
from bot.config import BotConfig, load_bot_config
from bot.ingest.deadlines import runner_args
from bot.store import StoreUnavailable
from bot.web import announce_console
from msmon.config.errors import ConfigError

# Libraries whose INFO lines are per tick or per request: shown with -v only.
_CHATTY = ("apscheduler", "aiohttp.access", "aiohttp.server", "matplotlib", "nio", "nats", "urllib3")


class BadRequests(logging.Filter):
    """aiohttp logs a full traceback for every request it cannot parse (a request line over 8 KB, a bad header): any
    unauthenticated client could fill the log. Such a record becomes one line without its traceback, at most one a
    `period` seconds, saying how many were not logged since (the client got its 400 all the same)."""

    def __init__(self, period: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.period, self.clock = period, clock
        self.last: float | None = None
        self.quiet = 0  # not logged since the last line

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, HttpProcessingError):
            return True
        now = self.clock()
        if self.last is not None and now - self.last < self.period:
            self.quiet += 1
            return False
        said = str(exc.message) if getattr(exc, "message", None) else type(exc).__name__
        first_line = said.strip().splitlines()[0].split(": ", 1)[0] if said.strip() else type(exc).__name__
        record.msg = ("msmon bot: refused a malformed HTTP request (%s: %s), answered 400%s; such requests are logged "
                      "at most once a minute")
        record.args = (type(exc).__name__, first_line[:120],
                       f" ({self.quiet} more since the last line)" if self.quiet else "")
        record.exc_info, record.exc_text, record.levelno, record.levelname = None, None, logging.WARNING, "WARNING"
        self.last, self.quiet = now, 0
        return True


def setup_logging(verbose: int = 0) -> None:
    """0: msmon's INFO lines (lifecycle) and every library's warnings; 1 (-v): every library's INFO too,
    with the HTTP access log; 2 (-vv): DEBUG. A malformed request is one line a minute at most (`BadRequests`)."""
    logging.basicConfig(level=logging.DEBUG if verbose >= 2 else logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    for name in _CHATTY:
        logging.getLogger(name).setLevel(logging.NOTSET if verbose else logging.WARNING)
    server_log = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, BadRequests) for f in server_log.filters):
        server_log.addFilter(BadRequests())


def serve(config: str | BotConfig | None, host: str | None = None, port: int | None = None, *, verbose: int = 0,
          allow_no_tokens: bool = False) -> int:
    """`config`: a bot.yaml path, or the config already read (`msmon serve` reads it before importing the server)."""
    setup_logging(verbose)
    if isinstance(config, BotConfig):
        cfg = config
    else:
        try:
            cfg = load_bot_config(config)
        except ConfigError as exc:
            print(exc, file=sys.stderr)
            return 2
    if host is not None:
        cfg.host = host
    if port is not None:
        cfg.port = port
    try:
        app = create_app(cfg)
    except StoreUnavailable as exc:
        print(f"msmon serve: {exc}", file=sys.stderr, flush=True)
        return 2
    if not app[TOKENS] and not allow_no_tokens:
        app[STORE].close()
        print("msmon serve: no job token and no operator token is set, so this bot would refuse every job and every "
              "command. Set the variables that bot.tokens and commands.operators name (the warnings above say "
              "which), or start it with --allow-no-tokens if that is on purpose.", file=sys.stderr, flush=True)
        return 2
    try:
        why = asyncio.run(_serve(app, cfg, access_log=verbose > 0))
    except OSError as exc:  # the port is taken, the address is not this machine's
        print(f"msmon serve: cannot listen on {cfg.host}:{cfg.port}: {exc.strerror or exc} (--host, --port or "
              "bot.host, bot.port in bot.yaml)", file=sys.stderr, flush=True)
        return 2
    print(f"msmon bot: stopped ({why}); state kept in {app[STORE].where}", flush=True)
    return 0


SHUTDOWN_TIMEOUT = 3.0  # s the requests still running get once the long polls are answered


async def _serve(app: web.Application, cfg: BotConfig, access_log: bool = False) -> str:
    """Serve `app` until SIGINT or SIGTERM; what stopped it."""
    stop = asyncio.Event()
    why = ["stopped"]

    def stop_on(sig: signal.Signals) -> None:
        why[0] = sig.name
        stop.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):  # no signal handlers on Windows' event loop
            loop.add_signal_handler(sig, stop_on, sig)
    runner = web.AppRunner(app, shutdown_timeout=SHUTDOWN_TIMEOUT, **runner_args(cfg.read_timeout),
                           # -v: aiohttp's line per request
                           access_log=logging.getLogger("aiohttp.access") if access_log else None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, cfg.host, cfg.port)
        await site.start()
        port = _bound_port(site, cfg.port)
        print(f"msmon bot: listening on http://{cfg.host}:{port} (state {app[STORE].where}); "
              "Ctrl-C or SIGTERM stops it", flush=True)
        announce_console(app, port)
        await stop.wait()
        started = time.monotonic()
        print(f"msmon bot: {why[0]}: stopping (the jobs' long polls are answered now; they poll again later)",
              flush=True)
    finally:
        await runner.cleanup()
    return f"{why[0]}, in {time.monotonic() - started:.1f} s"


def _bound_port(site: web.TCPSite, configured: int) -> int:
    """The port `site` listens on (the one the OS chose for port 0)."""
    sockets = getattr(site._server, "sockets", None)
    return int(sockets[0].getsockname()[1]) if sockets else configured


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
        self.runner = web.AppRunner(self.app, **runner_args(self.cfg.read_timeout))
        try:
            self.loop.run_until_complete(self.runner.setup())
            site = web.TCPSite(self.runner, self.cfg.host, self.cfg.port)
            self.loop.run_until_complete(site.start())
            self.port = _bound_port(site, self.cfg.port)
            announce_console(self.app, self.port)
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
