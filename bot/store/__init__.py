"""The bot's durable state behind one contract (contract.py), two implementations:

    sqlite      bot/store/sqlite.py: one file, one process; the embedded default (bot.state_path)
    postgresql  postgres.py: one database, several `msmon serve` replicas (bot.store.url)

`open_store(cfg)` opens the one bot.yaml asks for; the schema migrations (bot/store/migrations) run there.
"""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING

from bot.store.sqlite import Store
from bot.store.url import is_postgresql, redact, sqlite_path

if TYPE_CHECKING:
    from bot.config import BotConfig

__all__ = ["Store", "StoreUnavailable", "open_store", "redact"]


class StoreUnavailable(RuntimeError):
    """The configured store cannot be opened (the database does not answer, refuses us, or its schema is
    newer than this msmon): the message says which (never the password) and what to check."""


def open_store(cfg: BotConfig) -> Store:
    """The store of `cfg`: bot.store.url when set (sqlite:///path or postgresql://...), else the SQLite file
    bot.state_path."""
    url = cfg.store.url
    path = cfg.state_path if url is None else sqlite_path(url)
    if path is not None:
        try:
            return Store(path)
        except (sqlite3.Error, ValueError) as exc:
            raise StoreUnavailable(f"cannot open the SQLite store {path}: {exc}; check the file, its folder's "
                                   "permissions and bot.state_path (or bot.store.url)") from exc
    assert url is not None
    if not is_postgresql(url):
        raise ValueError(f"bot.store.url {redact(url)!r}: expected sqlite:///path or postgresql://...")
    try:
        from bot.store.postgres import PostgresStore  # psycopg only when it is used
    except ImportError as exc:
        raise StoreUnavailable(f"bot.store.url is PostgreSQL but psycopg is not installed ({exc}); "
                               "pip install 'msmon[bot]'") from None
    try:
        return PostgresStore(url, cfg.store.schema, cfg.store.lease)
    except Exception as exc:  # psycopg.Error, a bad conninfo: one clear line, not a traceback
        raise StoreUnavailable(f"cannot open the PostgreSQL store {redact(url)}: {redact(str(exc)).strip()}; check "
                               "that the server answers, the user may connect and bot.store in bot.yaml") from exc
