"""The machine's real PostgreSQL for the tests (127.0.0.1:5432, trust auth, database `test`), one fresh
schema per test or per bot state, dropped afterwards. Tests skip with the reason when it does not answer.

MSMON_TEST_PG_URL overrides the address; MSMON_TEST_STORE=postgresql makes every BotServer whose config
names no store use PostgreSQL (tests/fakes/bot_server.py), so the bot's tests run against it.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

PG_URL = os.environ.get("MSMON_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
_created: set[str] = set()
_down: list[str] = []


def unavailable() -> str | None:
    """Why PostgreSQL cannot be used here (psycopg missing, the server not answering), or None."""
    if _down:
        return _down[0]
    try:
        import psycopg
    except ImportError as exc:
        _down.append(f"psycopg is not installed ({exc})")
        return _down[0]
    try:
        with psycopg.connect(PG_URL, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        _down.append(f"PostgreSQL at {PG_URL} does not answer ({str(exc).strip()}); .ci/run starts it")
        return _down[0]
    return None


def required() -> None:
    """Skip the calling test, with the reason, when PostgreSQL cannot be used here."""
    reason = unavailable()
    if reason is not None:
        import pytest

        pytest.skip(reason)


# pytest-xdist's worker ("gw0", "gw1"...; "main" without xdist) in every schema's name: workers running at once,
# and other sessions on the same database, never share a schema (nor drop another's at exit)
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "main")


def schema_for(key: str) -> str:
    """A schema name of its own for `key` (a bot's state path: the same after a restart)."""
    name = f"msmon_t_{WORKER}_" + hashlib.blake2b(f"{os.getpid()}:{key}".encode(), digest_size=8).hexdigest()
    _created.add(name)
    return name


def new_schema() -> str:
    name = f"msmon_t_{WORKER}_{uuid.uuid4().hex[:16]}"
    _created.add(name)
    return name


def drop(name: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(PG_URL, autocommit=True, connect_timeout=5) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))
    _created.discard(name)


@contextmanager
def fresh_schema() -> Iterator[str]:
    name = new_schema()
    try:
        yield name
    finally:
        drop(name)


@atexit.register
def _drop_all() -> None:
    for name in list(_created):
        with contextlib.suppress(Exception):  # the server went away: nothing left to clean on it
            drop(name)


def store_config(state_path: str) -> dict[str, str]:
    """bot.store for a BotServer whose state would be `state_path`: its own schema on the test database."""
    return {"url": PG_URL, "schema": schema_for(os.path.abspath(state_path))}
