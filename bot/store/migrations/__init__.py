"""Versioned schema migrations: numbered SQL files per store, applied in order on start.

    bot/store/migrations/sqlite/0001_initial.sql, 0002_...      bot/store/migrations/postgresql/0001_initial.sql, ...

Each store keeps the versions applied in a `schema_version` table (version, name, applied_at) and applies
the files above its highest one, each in one transaction with its row, so a migration is all there or
not at all and a restart resumes where it stopped. A file is never edited once released: a change is a
new file. The store runs `pending()` and its own transaction (SQLite: one script; PostgreSQL: under an
advisory lock, so replicas starting together migrate once). Plain SQL files instead of alembic: two
dialects of a dozen tables need no ORM, no autogeneration and no extra dependency, and the SQL a user's
DBA reviews is the SQL that runs.
"""

from __future__ import annotations

import dataclasses
import re
from importlib import resources
from typing import Literal

Dialect = Literal["sqlite", "postgresql"]

VERSION_TABLE = "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY, name TEXT, applied_at {real})"
_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclasses.dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


def migrations(dialect: Dialect) -> list[Migration]:
    """Every migration of `dialect`, in order (a file whose name is not NNNN_name.sql is an error: a typo
    must not skip a migration silently)."""
    out = []
    for f in resources.files(__name__).joinpath(dialect).iterdir():
        if not f.name.endswith(".sql"):
            continue
        m = _NAME.match(f.name)
        if m is None:
            raise ValueError(f"bot/store/migrations/{dialect}/{f.name}: a migration is named NNNN_name.sql")
        out.append(Migration(int(m.group(1)), m.group(2), f.read_text(encoding="utf-8")))
    out.sort(key=lambda m: m.version)
    versions = [m.version for m in out]
    if versions != list(range(1, len(out) + 1)):
        raise ValueError(f"migrations/{dialect}: versions must run 1, 2, 3 ... without a gap; found {versions}")
    return out


def pending(dialect: Dialect, applied: int) -> list[Migration]:
    """The migrations after version `applied` (the store's highest schema_version). A schema newer than
    this msmon's is refused: an older replica must not write to tables it does not know."""
    known = migrations(dialect)
    if applied > len(known):
        raise ValueError(f"the {dialect} schema is at version {applied}, newer than this msmon's {len(known)}: "
                         "run the newer msmon (upgrade every replica)")
    return [m for m in known if m.version > applied]


def latest(dialect: Dialect) -> int:
    return len(migrations(dialect))
