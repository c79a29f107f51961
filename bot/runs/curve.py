"""A whole run's curve in bounded memory, so that a run that ended (or died) still shows where it went after its
last `bot.window_samples` samples are gone (a run NaN for its last 600 steps showed empty loss and grad-norm panels).

    every sample of the run's lead device ─► kept when its number is a multiple of `every`; when `POINTS` are kept,
    every other one is dropped and `every` doubles: the curve covers the whole run, `POINTS / 2` to `POINTS` points
    ─► and each field's last finite value, with its step ("last finite loss 2.31 at step 1,199")

Pure, no I/O. One curve a run (`bot/store/windows.py` keeps them for the `max_runs` most recent runs): about
POINTS x (1 + len(FIELDS)) x 8 bytes = 8 KB a run, 8 MB at max_runs 1000 (docs/security.md's bounds table).
"""

from __future__ import annotations

import math
from array import array
from typing import Any

from msmon.contract.wire import Sample

POINTS = 256  # points a run's whole curve keeps at most
FIELDS = ("loss", "grad_norm", "learning_rate")


class Curve:
    """The whole run, downsampled, of one device (the run's first: its lead) and each field's last finite value."""

    __slots__ = ("device", "every", "seen", "steps", "cols", "last", "finite")

    def __init__(self, device: str) -> None:
        self.device = device
        self.every, self.seen = 1, 0
        self.steps = array("q")
        self.cols = {f: array("d") for f in FIELDS}
        self.last: tuple[int, tuple[float, ...]] | None = None  # the newest sample, kept so the curve reaches the end
        self.finite: dict[str, tuple[int, float]] = {}  # field -> (step, value) of its last finite value

    def add(self, s: Sample) -> None:
        if s.device != self.device:
            return
        vals = tuple(math.nan if (v := getattr(s, f)) is None else float(v) for f in FIELDS)
        for f, v in zip(FIELDS, vals, strict=True):
            if math.isfinite(v):
                self.finite[f] = (s.step, v)
        self.last = (s.step, vals)
        if self.seen % self.every == 0:
            if len(self.steps) >= POINTS:
                self.steps = self.steps[::2]
                self.cols = {f: c[::2] for f, c in self.cols.items()}
                self.every *= 2
            if self.seen % self.every == 0:
                self.steps.append(s.step)
                for f, v in zip(FIELDS, vals, strict=True):
                    self.cols[f].append(v)
        self.seen += 1

    def columns(self) -> dict[str, list[Any]]:
        """{"steps": [...], "loss": [...], ...}: the kept points, oldest first, and the newest sample last."""
        steps = list(self.steps)
        cols = {f: list(c) for f, c in self.cols.items()}
        if self.last is not None and (not steps or steps[-1] != self.last[0]):
            steps.append(self.last[0])
            for f, v in zip(FIELDS, self.last[1], strict=True):
                cols[f].append(v)
        return {"steps": steps, **cols}

    def last_finite(self) -> dict[str, dict[str, float | int]]:
        """field -> {"step", "value"} of its last finite value (a field never finite is absent)."""
        return {f: {"step": st, "value": v} for f, (st, v) in self.finite.items()}

    def said(self, field: str = "loss") -> str:
        """"last finite loss 2.31 at step 1,199", or "no finite loss was reported"."""
        if field not in self.finite:
            return f"no finite {field.replace('_', ' ')} was reported"
        st, v = self.finite[field]
        return f"last finite {field.replace('_', ' ')} {v:.4g} at step {st:,}"
