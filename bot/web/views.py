"""What the console shows, as plain JSON-able data read from the bot's shared state: runs with their
state and progress, a run's metric series per rank, its alerts and commands. Read-only; the pages
(pages.py), the JSON API and the live stream (routes.py) all take their data from here, so the page a
browser loads and the updates it gets later cannot disagree.
"""

from __future__ import annotations

import math
from typing import Any

from bot.shared import BotState
from bot.store.rows import RunRow
from msmon.contract.wire import tag_nonfinite

# The curves a run page draws: (series key, title, the sample fields that feed it, first found wins).
CHARTS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("loss", "loss", ("loss",)),
    ("learning_rate", "learning rate", ("learning_rate",)),
    ("grad_norm", "grad norm", ("grad_norm",)),
    ("throughput", "throughput", ("tokens_per_s", "samples_per_s")),
)
_FIELDS = ("loss", "learning_rate", "grad_norm", "tokens_per_s", "samples_per_s", "step_time")
MAX_COMMANDS = 20
WHOLE = "whole run"  # the series of a run's whole curve, downsampled (bot/runs/curve.py), beside its devices'


def _num(v: Any) -> float | str | None:
    """A value for JSON: a finite float, None when it is missing, or the wire's string for NaN and Inf
    ("NaN", "Infinity", "-Infinity"): the page draws both as a gap, and says where the values were not finite."""
    if v is None:
        return None
    f = float(v)
    return f if math.isfinite(f) else tag_nonfinite(f)


def visible(project: str, run: RunRow) -> bool:
    """An operator ("*") sees every run; anyone else only their project's."""
    return project in ("*", run["project"])


def run_state(run: RunRow) -> str:
    """The run lifecycle's phase as the store gives it (bot/store/sqlite.py: ended, gone, paused, running)."""
    return str(run.get("state") or ("gone" if run["gone"] else "paused" if run["paused"] else "running"))


def run_summary(state: BotState, run: RunRow) -> dict[str, Any]:
    """One row of the runs table: state, step, progress towards the planned steps, alerts firing."""
    total, _target = state.windows.plans.get(run["run_id"], (None, None))
    step = int(run["last_step"] or 0)
    firing = state.store.alerts(run["run_id"], "firing")
    pace = state.windows.pace(run["run_id"])
    curve = state.windows.curves.get(run["run_id"])
    return {"run_id": run["run_id"], "project": run["project"], "state": run_state(run), "step": step,
            "attempt": run.get("attempt", 1),
            "total_steps": total, "progress": (min(step / total, 1.0) if total else None),
            "steps_per_s": pace[0] if pace else None, "devices": list(run["devices"]),
            "last_seen": run["last_seen"], "seen_ago": max(state.clock() - (run["last_seen"] or 0.0), 0.0),
            "firing": len(firing),
            "errors": sum(1 for a in firing if a["severity"] == "ERROR"),
            "end_reason": run.get("end_reason"), "last_finite": curve.last_finite() if curve is not None else {}}


def runs(state: BotState, project: str) -> list[dict[str, Any]]:
    state.flush()
    return [run_summary(state, r) for r in state.store.runs() if visible(project, r)]


def series(state: BotState, run_id: str, after: dict[str, int] | None = None, whole: bool = False
           ) -> dict[str, dict[str, list[Any]]]:
    """Per device (rank), the samples kept in the bot's window (newer than `after[device]` when given):
    {device: {"steps": [...], "loss": [...], "learning_rate": [...], ..., "throughput": [...]}}. `whole`: and the
    run's whole curve, downsampled, as the series `WHOLE` (a run that ended or died: its window may hold only its
    last, NaN, samples)."""
    out: dict[str, dict[str, list[Any]]] = {}
    curve = state.windows.curves.get(run_id) if whole and not after else None
    if curve is not None:
        out[WHOLE] = {k: v if k == "steps" else [_num(x) for x in v] for k, v in curve.columns().items()}
    devices = sorted(state.windows.runs.get(run_id, {}), key=lambda d: (len(d), d))
    for dev in devices:
        since = (after or {}).get(dev)
        samples = [s for s in state.windows.history(run_id, dev) if since is None or s.step > since]
        if not samples:
            continue
        cols: dict[str, list[Any]] = {"steps": [s.step for s in samples], "time": [s.time for s in samples]}
        for f in _FIELDS:
            cols[f] = [_num(getattr(s, f, None)) for s in samples]
        # throughput: tokens/s where the job reports it, else samples/s (the unit says which)
        unit = "tokens_per_s" if any(v is not None for v in cols["tokens_per_s"]) else "samples_per_s"
        cols["throughput"] = cols[unit]
        cols["throughput_unit"] = [unit]
        out[dev] = cols
    return out


def alerts(state: BotState, project: str, run_id: str | None = None, firing_only: bool = False
           ) -> list[dict[str, Any]]:
    state.flush()
    allowed = {r["run_id"] for r in state.store.runs() if visible(project, r)}
    rows = state.store.alerts(run_id, "firing" if firing_only else None)
    keys = ("run_id", "rule", "device", "severity", "status", "first_step", "last_step", "updated_at", "acked_by")
    return [{k: v for k, v in a.items() if k in keys} for a in rows if a["run_id"] in allowed][:500]


def commands(state: BotState, run_id: str) -> list[dict[str, Any]]:
    keys = ("id", "created_at", "user", "source", "text", "status", "detail", "apply_step")
    return [{k: v for k, v in c.items() if k in keys} for c in state.store.commands.recent(MAX_COMMANDS, run_id=run_id)]


def run_detail(state: BotState, run: RunRow) -> dict[str, Any]:
    """Everything a run page shows but the series."""
    return {"run": run_summary(state, run), "alerts": alerts(state, "*", run["run_id"]),
            "commands": commands(state, run["run_id"]),
            "dropped": state.drops.totals(run["run_id"])}  # what its job dropped unsent (bot/runs/dropped.py)
