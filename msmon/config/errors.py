"""Config errors that name the key path, say what was wrong and what to write instead."""

from __future__ import annotations

import difflib
import reprlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

# Names users reach for that difflib would not match to the right key.
_SYNONYMS = {
    "lr": "learning_rate",
    "learningrate": "learning_rate",
    "gradnorm": "grad_norm",
    "grad-norm": "grad_norm",
    "enabled": "enable",
    "on": "enable",
    "interval": "step_interval",
    "logdir": "log_dir",
    "warn": "warning",
    "err": "error",
    "threshold": "warning",
}


class _Short(reprlib.Repr):
    """reprlib's short repr, also of an int too long for repr() (10**5000 raises ValueError there)."""

    def __init__(self) -> None:
        super().__init__()
        self.maxstring = self.maxother = 80
        self.maxlist = self.maxdict = 6
        self.maxlevel = 3

    def repr_int(self, x: int, level: int) -> str:
        return f"<an integer of {x.bit_length()} bits>" if x.bit_length() > 200 else super().repr_int(x, level)


_REPR = _Short()


def shown(value: Any, limit: int = 80) -> str:
    """`value` as a message shows it: its repr, cut short (a list of a million, 10**5000 and a page of text too)."""
    text = _REPR.repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def closest(word: str, candidates: Iterable[str]) -> str | None:
    """The valid name a mistyped `word` most likely meant, or None."""
    options = list(candidates)
    syn = _SYNONYMS.get(word.lower().replace("_", "")) or _SYNONYMS.get(word.lower())
    if syn in options:
        return syn
    match = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    if match:
        return match[0]
    lowered = {o.lower(): o for o in options}
    return lowered.get(word.lower())


@dataclass(frozen=True)
class Issue:
    """One problem in a config: where it is and what is wrong."""

    path: str
    message: str
    location: str | None = None  # "train.yaml:14"

    def __str__(self) -> str:
        text = f"{self.path}: {self.message}"
        return f"{text}  ({self.location})" if self.location else text


class ConfigError(ValueError):
    """Raised for every config that would not do what its author meant; lists every issue found."""

    def __init__(self, issues: list[Issue], source: str | None = None, what: str = "monitor config") -> None:
        self.issues = list(issues)
        self.source = source
        self.what = what
        super().__init__(str(self))

    def __str__(self) -> str:
        head = f"invalid {self.what} in {self.source}" if self.source else f"invalid {self.what}"
        if len(self.issues) == 1:
            return f"{head}: {self.issues[0]}"
        return head + ":\n" + "\n".join(f"  - {i}" for i in self.issues)
