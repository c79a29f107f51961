"""A live threshold change, said with its effect and kept for the next replay (JobControl's set/loosen/restore).

`change_levels(monitor, step, rule, change, action)` copies the rule's levels, makes the change, and runs
`msmon.core.whatif.effect` on every device's last 600 samples (`whatif.Recent`, kept compact beside the chart's
120) with the run's own alert gate: the answer reads "over the last 600 samples (steps 10-6,000): 0 alerts at 15
instead of 14 at 10", and goes back to chat in the ActionResult's detail. The change is one JSON line
(`whatif.LevelChange`) in `levels_path()`, next to the run's CSV (`./msmon_logs/run-42.levels.jsonl` beside
`run-42.csv`), which `msmon replay` finds and applies at the same step. Never raises for its own work: a
failure to judge or to write is logged and said in the detail; the change itself stands.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from msmon.core.detectors import DetectorContext, RuleParams
from msmon.core.levels import DEFAULT
from msmon.core.whatif import LevelChange, combine, effect

from .outputs.csv_sink import CsvSink

if TYPE_CHECKING:
    from .monitor import Monitor

log = logging.getLogger("msmon")
T = TypeVar("T")
LEVELS_SUFFIX = ".levels.jsonl"


def levels_path(monitor: Monitor) -> str | None:
    """Where this rank's level changes go: its CSV's path with `.levels.jsonl` for `.csv`; None without a CSV."""
    cfg = monitor.config.csv
    if not cfg.enable:
        return None
    csv_path = CsvSink(cfg.path, monitor.run_id).path_for(monitor.default_device)
    return os.path.splitext(csv_path)[0] + LEVELS_SUFFIX


def _main_params(monitor: Monitor, rule: str) -> RuleParams:
    found = monitor.levels_of(rule)
    return next((p for name, p in found if name == DEFAULT), found[0][1])


def _effect_text(monitor: Monitor, rule: str, old: RuleParams, new: RuleParams) -> str:
    cfg = monitor.config.training
    effects = []
    for name, samples in monitor.whatif_samples().items():
        ctx = DetectorContext(device=name, total_steps=cfg.total_steps, warmup_steps=cfg.warmup_steps,
                              target_loss=cfg.target_loss)
        effects.append(effect(samples, rule, old, new, ctx=ctx, gate=monitor.gate))
    total = combine(effects)
    return total.describe() if total is not None else "no recent samples to judge the change on"


def change_levels(monitor: Monitor, step: int, rule: str, change: Callable[[], T], action: str,
                  source: str = "") -> tuple[T, str]:
    """Make `change` (which moves `rule`'s levels); returns its result and the effect's sentence. The change is
    appended to `levels_path()`."""
    try:
        before = dataclasses.replace(_main_params(monitor, rule))
    except KeyError:  # not a rule: the change itself refuses it, naming the closest rule
        change()
        raise
    result = change()
    after = _main_params(monitor, rule)
    try:
        said = _effect_text(monitor, rule, before, after)
    except Exception as exc:  # noqa: BLE001 - the effect is advice; the change stands without it
        log.exception("msmon: run %s step %d: could not judge the effect of the %s change", monitor.run_id, step, rule)
        said = f"effect not judged ({type(exc).__name__}: {exc})"
    rec = LevelChange(step=step, rule=rule, warning=after.warning, error=after.error, old_warning=before.warning,
                      old_error=before.error, time=time.time(), action=action, source=source, effect=said)
    _append(monitor, rec)
    return result, said


def _append(monitor: Monitor, rec: LevelChange) -> None:
    path = levels_path(monitor)
    if path is None:
        return
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(rec.to_dict(), allow_nan=False) + "\n")
    except (OSError, ValueError) as exc:
        log.warning("msmon: run %s step %d: the %s level change is not written to %s (%s); `msmon replay` of this "
                    "run will not apply it. Check that the CSV folder is writable.", monitor.run_id, rec.step,
                    rec.rule, path, exc)


def read_level_changes(path: str) -> list[LevelChange]:
    """A `.levels.jsonl` file's changes in step order; a ValueError naming the file and line for a bad one."""
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{n}"
            try:
                d: Any = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where}: not JSON ({exc.msg})") from exc
            if not isinstance(d, dict):
                raise ValueError(f"{where}: a level change is a JSON object, got {type(d).__name__}")
            out.append(LevelChange.from_dict(d, where))
    return sorted(out, key=lambda c: c.step)


__all__ = ["LEVELS_SUFFIX", "change_levels", "levels_path", "read_level_changes"]
