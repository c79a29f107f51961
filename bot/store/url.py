"""The store's address as written in bot.yaml, and as it may be shown (never with its password)."""

from __future__ import annotations

import re

_PASSWORD = re.compile(r"(?P<head>://[^/@:]*:)[^/@]*@")
_KEYWORD = re.compile(r"(?P<head>\bpassword\s*=\s*)(?:'[^']*'|\S+)", re.IGNORECASE)


def redact(url: str) -> str:
    """`postgresql://msmon:s3cret@db/msmon` -> `postgresql://msmon:***@db/msmon` (a URL's password, or a
    `password=...` key of a conninfo string or a query)."""
    url = _PASSWORD.sub(lambda m: f"{m.group('head')}***@", url)
    return _KEYWORD.sub(lambda m: f"{m.group('head')}***", url)


def sqlite_path(url: str) -> str | None:
    """The file of a `sqlite:///path` URL (`sqlite:///:memory:` too); None for another scheme."""
    if url.startswith("sqlite:///"):
        return url[len("sqlite:///"):] or ":memory:"
    if url.startswith("sqlite://"):
        return url[len("sqlite://"):] or ":memory:"
    return None


def is_postgresql(url: str) -> bool:
    return url.startswith(("postgresql://", "postgres://"))
