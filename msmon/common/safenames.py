"""File names built from job data (run ids, devices, rules): a readable slug plus a short hash.

A run id is whatever a job says it is: `../../x`, `a/b`, a NUL, 300 characters, `CON`, an emoji.
Every file msmon names after job data (chart PNGs, spool files, CSV logs, TensorBoard folders,
checkpoints) goes through `slug` (one path component, never empty, never `.`/`..`, at most
`max_len` characters, distinct inputs give distinct names through the hash) and `inside`
(the joined path resolves under its folder, or ValueError). Standard library only: the job and
the bot both import it.
"""

from __future__ import annotations

import hashlib
import os
import re

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_SAFE_WHOLE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def slug(value: object, max_len: int = 64) -> str:
    """A safe file-name component for `value`.

    A short, plain value (letters, digits, `.`, `_`, `-`, not starting with a dot) is kept as it is,
    so `run-42` stays `run-42`; anything else becomes its safe characters plus 8 hex digits of its
    SHA-256, so two different run ids never share a file.
    """
    text = str(value)
    if len(text) <= max_len and _SAFE_WHOLE.fullmatch(text) and not text.endswith("."):
        return text
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    base = _UNSAFE.sub("_", text).strip("._-")[: max(max_len - 9, 1)] or "x"
    return f"{base}-{digest}"


def inside(directory: str, *parts: str) -> str:
    """`directory/part/...`, checked to stay under `directory` (ValueError otherwise)."""
    root = os.path.realpath(directory)
    path = os.path.realpath(os.path.join(root, *parts))
    if path != root and not path.startswith(root + os.sep):
        raise ValueError(f"refusing to write {path!r}: it is outside {root!r}")
    return path
