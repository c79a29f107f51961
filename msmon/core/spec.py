"""Field specs: the metadata a dataclass field carries for the config validator (bounds, a parser, a
one-line description). Dependency-free, so the pure detectors can declare their parameters with it;
`msmon.config.validate` reads it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def spec(
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    parser: Callable[..., Any] | None = None,
    doc: str = "",
) -> dict[str, Any]:
    """Field metadata: numeric bounds, a custom parser `(value, path, ctx) -> value`, a one-line description."""
    return {"ge": ge, "gt": gt, "le": le, "parser": parser, "doc": doc}
