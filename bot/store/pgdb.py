"""One PostgreSQL connection that takes the SQLite store's SQL: `PgDb` (its `?` placeholders translated, NUL in text
kept as U+FFFD, reconnecting after the server went away, a deadline on every statement), and `Row`, a result row read
by name or position like sqlite3.Row. bot/store/postgres.py is the store built on it."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from bot.store.url import redact

log = logging.getLogger("msmon.bot")

_NUMBERED = re.compile(r"\?(\d+)")
STATEMENT_TIMEOUT_MS = 3_000  # the server cancels a statement after this (a lock wait, a slow plan)
# When the database host is gone without a reset (a dead host, a blackholing network), nothing answers: the
# client gives up by itself, so that the bot answers 503 with Retry-After within seconds instead of hanging
# until TCP gives up (~15 min). A connection attempt gets CONNECT_TIMEOUT_S; a statement the server does not
# answer at all gets DEADLINE_S (then its connection is shut: the call raises); TCP keepalives and
# tcp_user_timeout find a dead peer under an idle or a sending connection; after a statement or a connection
# attempt nothing answered, statements fail at once for RETRY_CONNECT_S before the next attempt.
CONNECT_TIMEOUT_S = 3
DEADLINE_S = 4.0
RETRY_CONNECT_S = 2.0


class Row:
    """A result row read both ways, like sqlite3.Row: by column name, by position, unpacked, dict()."""

    __slots__ = ("_values", "_index")

    def __init__(self, values: Sequence[Any], index: dict[str, int]) -> None:
        self._values, self._index = values, index

    def __getitem__(self, key: int | str) -> Any:
        return self._values[self._index[key]] if isinstance(key, str) else self._values[key]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def keys(self) -> list[str]:
        return list(self._index)


def _rows(cursor: Any) -> Callable[[Sequence[Any]], Row]:
    index = {c.name: i for i, c in enumerate(cursor.description or ())}
    return lambda values: Row(values, index)


@functools.lru_cache(maxsize=512)
def translate(sql: str) -> tuple[str, bool]:
    """SQLite's placeholders as psycopg's: `?` -> `%s`, `?3` -> `%(p3)s` (then the parameters go as a
    mapping: True), a literal `%` doubled; `AS REAL)` (a cast that types a parameter that may be NULL) as
    PostgreSQL's 8-byte float (its REAL has 4)."""
    sql = sql.replace("%", "%%").replace(" AS REAL)", " AS DOUBLE PRECISION)")
    if _NUMBERED.search(sql):
        return _NUMBERED.sub(lambda m: f"%(p{m.group(1)})s", sql), True
    return sql.replace("?", "%s"), False


def _text(v: Any) -> Any:
    """PostgreSQL's text cannot hold NUL: a job's string with one is kept with U+FFFD in its place (the
    same for a lookup, so the run is found again) instead of failing its envelope."""
    return v.replace("\x00", "\ufffd") if isinstance(v, str) and "\x00" in v else v


def _params(args: Sequence[Any], named: bool) -> Sequence[Any] | dict[str, Any]:
    if named:
        return {f"p{i}": _text(v) for i, v in enumerate(args, 1)}
    return [_text(v) for v in args]


def lock_key(text: str) -> int:
    """A signed 64-bit advisory lock key for `text` (stable across processes, unlike hash())."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big", signed=True)


class PgDb:
    """One psycopg connection that takes the SQLite store's SQL (`execute`, `executemany`) or its own
    (`raw`), reconnecting on the next statement after the server went away (the statement that saw it
    go raises: the caller's retry or error path handles it)."""

    def __init__(self, url: str, schema: str | None, extra: str = "") -> None:
        self.url, self.schema = url, schema
        # For every connection (a reconnection, the listener's): the schema as the search_path, and a bound on
        # any statement (the calls are synchronous: a stuck lock or server holds the event loop at most this).
        # The URL's own `options` (e.g. ?options=-c%20synchronous_commit%3Doff) come after ours: they win.
        options = f"-c statement_timeout={STATEMENT_TIMEOUT_MS}" + (f" -c search_path={schema}" if schema else "") + \
            (f" {extra}" if extra else "")
        own = conninfo_to_dict(url).get("options")
        self.conninfo = make_conninfo(url, options=f"{options} {own}" if own else options, keepalives=1,
                                      keepalives_idle=5, keepalives_interval=2, keepalives_count=2,
                                      tcp_user_timeout=int(DEADLINE_S * 1000))
        self.deadline: float | None = None  # armed once the store is open (migrations may take longer)
        self._busy: float | None = None  # monotonic time the statement in flight started
        self._down_until = 0.0
        self._closed = threading.Event()
        self.conn = self._connect()
        self.in_tx = False
        threading.Thread(target=self._watch, name="msmon-pg-deadline", daemon=True).start()

    def _connect(self) -> psycopg.Connection[Any]:
        t0 = time.monotonic()
        try:
            return psycopg.connect(self.conninfo, autocommit=True, row_factory=_rows,
                                   connect_timeout=CONNECT_TIMEOUT_S)
        except psycopg.OperationalError:
            if time.monotonic() - t0 > 1.0:  # no answer (not a refusal): the next calls fail at once for a while
                self._down_until = time.monotonic() + RETRY_CONNECT_S
            raise

    def _live(self) -> psycopg.Connection[Any]:
        if self.conn.closed and not self.in_tx:
            wait = self._down_until - time.monotonic()
            if wait > 0:
                raise psycopg.OperationalError(f"PostgreSQL at {redact(self.url)} did not answer; the next connection "
                                               f"attempt in {wait:.1f} s")
            log.warning("msmon bot: the PostgreSQL connection was lost; reconnecting to %s", redact(self.url))
            self.conn = self._connect()
        return self.conn

    def _watch(self) -> None:
        """Shut the connection of a statement the server has not answered within the deadline: the blocked
        call raises (a dead host sends no reset; the server's statement_timeout cannot reach us)."""
        while not self._closed.wait(0.25):
            busy, deadline = self._busy, self.deadline
            if busy is None or deadline is None or time.monotonic() - busy < deadline:
                continue
            with contextlib.suppress(OSError, psycopg.Error):
                fd = self.conn.pgconn.socket
                with socket.socket(fileno=os.dup(fd)) as s:
                    s.shutdown(socket.SHUT_RDWR)
                log.error("msmon bot: PostgreSQL at %s has not answered a statement for %.0f s; its connection is "
                          "closed (requests are answered 503 until it is back)", redact(self.url), deadline)
            self._down_until = time.monotonic() + RETRY_CONNECT_S
            self._busy = None

    @contextlib.contextmanager
    def _timed(self) -> Iterator[None]:
        self._busy = time.monotonic()
        try:
            yield
        finally:
            self._busy = None

    def execute(self, sql: str, args: Sequence[Any] = ()) -> psycopg.Cursor[Any]:
        text, named = translate(sql)
        conn = self._live()
        with self._timed():
            return conn.execute(text, _params(args, named))

    def executemany(self, sql: str, seq: Iterable[Sequence[Any]]) -> psycopg.Cursor[Any]:
        text, named = translate(sql)
        cur = self._live().cursor()
        with self._timed():
            cur.executemany(text, [_params(a, named) for a in seq])
        return cur

    def raw(self, query: Any, args: Sequence[Any] | dict[str, Any] | None = None) -> psycopg.Cursor[Any]:
        if isinstance(args, dict):
            args = {k: _text(v) for k, v in args.items()}
        elif args is not None:
            args = [_text(v) for v in args]
        conn = self._live()
        with self._timed():
            return conn.execute(query, args)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[PgDb]:
        """One transaction (BEGIN ... COMMIT, ROLLBACK on an exception), its BEGIN and its end under the
        deadline as any statement. Not in psycopg's pipeline mode: measured slower here than plain round
        trips for transactions of a few statements."""
        conn = self._live()
        self.in_tx = True
        tx = conn.transaction()
        try:
            with self._timed():
                tx.__enter__()
            try:
                yield self
            except BaseException as exc:
                with self._timed():
                    if not tx.__exit__(type(exc), exc, exc.__traceback__):
                        raise
            else:
                with self._timed():
                    tx.__exit__(None, None, None)
        finally:
            self.in_tx = False

    def close(self) -> None:
        self._closed.set()
        self.conn.close()


__all__ = ["CONNECT_TIMEOUT_S", "DEADLINE_S", "PgDb", "Row", "lock_key", "translate"]
