"""The `store` fixture of the store tests: each test once on SQLite (a file in tmp) and once on PostgreSQL (the
machine's real server, a fresh schema; skipped with the reason when it does not answer)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from bot.store.sqlite import Store
from tests.fakes import postgres


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Store]:
    if request.param == "sqlite":
        s = Store(str(tmp_path / "s.sqlite"))
        yield s
        s.close()
        return
    postgres.required()
    from bot.store.postgres import PostgresStore

    with postgres.fresh_schema() as schema:
        s = PostgresStore(postgres.PG_URL, schema, lease=1.0)
        yield s
        s.close()


@pytest.fixture
def pg_pair() -> Iterator[tuple[Any, Any]]:
    """Two PostgreSQL stores on one schema: two replicas (lease 1 s)."""
    postgres.required()
    from bot.store.postgres import PostgresStore

    with postgres.fresh_schema() as schema:
        a, b = PostgresStore(postgres.PG_URL, schema, lease=1.0), PostgresStore(postgres.PG_URL, schema, lease=1.0)
        yield a, b
        a.close()
        b.close()
