"""Replay a recorded metrics log through the same `Monitor` that runs live.

`replay(rows, monitor)` is the core: every row goes to `Monitor.step` as a live job would send it,
the log's timestamps as the clock.
`run_replay(path, config)` adds what `msmon replay` needs around it: any log format (`readers.py`),
a Monitor that writes no files and sends nothing to a bot, the curves kept for the trend and the
plot, an optional progress callback, and the run's live threshold changes (`X.levels.jsonl` next to
`X.csv`, written by the job: `notifier.levels_effect`) applied at the steps the job applied them.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from msmon.contract.wire import Event, Severity, Status
from msmon.core.trend import TrendSummary, summarize
from msmon.core.whatif import LevelChange
from msmon.offline.readers import ReplayError, Row, read_log
from msmon.offline.robust import Despiked, despike
from notifier.config import load_config
from notifier.levels_effect import LEVELS_SUFFIX, read_level_changes
from notifier.monitor import Monitor
from notifier.world import World

__all__ = ["replay", "replay_monitor", "run_replay", "Curves", "Replayed", "alert_line", "alert_json", "Progress",
           "apply_level_change", "find_levels", "load_levels"]


def apply_level_change(monitor: Monitor, c: LevelChange) -> None:
    """Set the levels a live change left (each one the job recorded; a level it left derived stays derived)."""
    for level, value in (("warning", c.warning), ("error", c.error)):
        if value is not None:
            monitor.set_threshold(c.rule, float(value), level)


def replay(rows: Iterable[Row], monitor: Monitor, on_row: Callable[[Row], None] | None = None,
           levels: Sequence[LevelChange] = ()) -> list[Event]:
    """Feed every row to `monitor` as a live job would; all events raised, in order.

    The log is the clock: a row without a timestamp is stepped at the previous row's (0.0 before the
    first), so the timing rules never read this machine's clock and a replay raises the same alerts
    every time. `on_row` sees each row after the Monitor did. `levels` (in step order): each change is
    applied before the first row after its step, as JobControl applied it at that step's boundary."""
    events: list[Event] = []
    step = monitor.step
    now = 0.0
    pending = sorted(levels, key=lambda c: c.step)
    i = 0
    for r in rows:
        while i < len(pending) and pending[i].step < r.step:
            apply_level_change(monitor, pending[i])
            i += 1
        if r.time is not None:
            now = r.time
        # a rank's own loss, where the log has it, is its device's loss (the printed one may be the reduced one)
        events.extend(step(r.step, loss=r.loss if r.local_loss is None else r.local_loss, lr=r.lr,
                           grad_norm=r.grad_norm, throughput=r.throughput, time=now, device=r.device,
                           local_grad_norm=r.local_grad_norm, overflow=r.overflow, loss_scale=r.loss_scale))
        if on_row is not None:
            on_row(r)
    events.extend(monitor.settle())  # rows held while the log's accumulation was being inferred
    monitor.close()
    return events


@dataclass
class Curves:
    """One device's metrics as read from the log, for the trend and the plot."""

    steps: list[int] = field(default_factory=list)
    loss: list[float | None] = field(default_factory=list)
    lr: list[float | None] = field(default_factory=list)
    grad_norm: list[float | None] = field(default_factory=list)
    throughput: list[float | None] = field(default_factory=list)

    def add(self, r: Row) -> None:
        self.steps.append(r.step)
        self.loss.append(r.loss)
        self.lr.append(r.lr)
        self.grad_norm.append(r.grad_norm)
        self.throughput.append(r.throughput)


@dataclass
class Replayed:
    events: list[Event]
    curves: dict[str, Curves]  # device -> its curves, in the order devices appeared
    rows: int
    format: str
    monitor: Monitor
    levels: list[LevelChange] = field(default_factory=list)  # the live threshold changes applied
    levels_file: str | None = None

    def firing(self) -> list[Event]:
        """New alerts (not resolutions, not repeats)."""
        return [e for e in self.events if e.status is Status.FIRING and not e.repeat]

    def counts(self) -> str:
        f = self.firing()
        return (f"{len(f)} alert(s): {sum(e.severity is Severity.ERROR for e in f)} ERROR, "
                f"{sum(e.severity is Severity.WARNING for e in f)} WARNING")

    def trend(self, total_steps: int | None = None, target_loss: float | None = None,
              window_steps: int | None = None, robust: bool = True) -> tuple[TrendSummary | None, Despiked | None]:
        """The loss trend of the first device (training facts from the config unless given), and with `robust`
        what the robust fit set aside: blocks of steps whose median is a spike off a Theil-Sen line are put on
        that line before the fit (msmon/offline/robust.py), so a spike cannot tilt the summary."""
        if not self.curves:
            return None, None
        c = next(iter(self.curves.values()))
        training = self.monitor.config.training
        facts: dict[str, Any] = {"total_steps": total_steps or training.total_steps,
                                 "target_loss": training.target_loss if target_loss is None else target_loss}
        plain = summarize(c.steps, c.loss, window_steps=window_steps, **facts)
        if not robust or plain is None:
            return plain, None
        cleaned = despike(c.steps, c.loss, plain.window_steps)  # the blocks the plain fit used
        if not cleaned.set_aside:
            return plain, cleaned
        robust_fit = summarize(c.steps, cleaned.losses, window_steps=plain.window_steps, **facts)
        if robust_fit is not None and plain.shift is not None:  # a shift at the end is the headline, not an outlier
            robust_fit = dataclasses.replace(robust_fit, shift=plain.shift)
        return robust_fit, cleaned


def replay_monitor(config: Any, run_id: str, devices: int = 1) -> Monitor:
    """A Monitor for analysis: the config's detectors and levels, but no CSV / TensorBoard files and no bot.
    `replay` gives it every row's time, so its own clock is never read. `devices` > 1 (a folder of per-rank
    logs): each rank is a device of its own (per_device_metrics), whatever the config says."""
    cfg = load_config(config)
    cfg.bot.url = None
    if devices > 1 and not cfg.per_device_metrics:
        cfg = dataclasses.replace(cfg, per_device_metrics=True)  # a copy: a config shared by many replays stays
    return Monitor(cfg, run_id, sinks=[], world=World())


def find_levels(path: str) -> str | None:
    """The level changes a job wrote beside the CSV `path` (`run-42.levels.jsonl` for `run-42.csv`), if any."""
    if not os.path.isfile(path):
        return None
    candidate = os.path.splitext(path)[0] + LEVELS_SUFFIX
    return candidate if os.path.isfile(candidate) else None


def load_levels(path: str) -> list[LevelChange]:
    """A level-changes file; a ReplayError naming its line when it cannot be read as one."""
    try:
        return read_level_changes(path)
    except ValueError as exc:
        raise ReplayError(f"{exc}; a line is one JSON object as the job writes it: step, rule, warning, error "
                          "(docs: README, 'Threshold changes and their effect')") from exc


def run_replay(path: str, config: Any, run_id: str = "replay", *, columns: Mapping[str, str] | None = None,
               fmt: str | None = None, progress: Progress | None = None, levels: str | None = None,
               find: bool = True) -> Replayed:
    """Read `path` (any supported format) and replay it through a Monitor built from `config`. `levels`: a
    level-changes file to apply; else (`find`) the one the job wrote beside `path`, if there is one."""
    source = read_log(path, columns, fmt)
    levels_file = levels if levels is not None else (find_levels(path) if find else None)
    changes = load_levels(levels_file) if levels_file is not None else []
    mon = replay_monitor(config, run_id, len(source.devices))
    curves: dict[str, Curves] = {}
    n = [0]

    def on_row(r: Row) -> None:
        dev = r.device or mon.default_device
        c = curves.get(dev)
        if c is None:
            c = curves[dev] = Curves()
        c.add(r)
        n[0] += 1
        if progress is not None:
            progress.update(n[0], source.fraction)

    events = replay(source, mon, on_row, changes)
    if progress is not None:
        progress.done(n[0])
    return Replayed(events, curves, n[0], source.format, mon, changes, levels_file)


class Progress:
    """A one-line progress bar on a terminal stream (stderr): redrawn at most every `every` seconds."""

    WIDTH = 30

    def __init__(self, label: str, stream: IO[str] | None = None, every: float = 0.2,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.every = every
        self.clock = clock
        self.next_at = 0.0
        self.drawn = False

    def update(self, rows: int, fraction: Callable[[], float]) -> None:
        if rows & 255:
            return  # a clock read per 256 rows, not per row
        now = self.clock()
        if now < self.next_at:
            return
        self.next_at = now + self.every
        self._draw(rows, fraction())

    def _draw(self, rows: int, frac: float) -> None:
        filled = int(frac * self.WIDTH)
        bar = "#" * filled + "-" * (self.WIDTH - filled)
        self.stream.write(f"\r{self.label} [{bar}] {frac:4.0%} {rows:,} rows")
        self.stream.flush()
        self.drawn = True

    def done(self, rows: int) -> None:
        self._draw(rows, 1.0)
        self.stream.write("\n")
        self.stream.flush()


def alert_line(e: Event) -> str:
    """Text mode: one alert (two lines when firing: the numbers, then the message)."""
    state = "RESOLVED" if e.status is Status.RESOLVED else e.severity.value
    if e.status is Status.RESOLVED:
        return f"step {e.step:>7}  {state:<8} {e.rule:<16} device {e.device}"
    again = " (still firing)" if e.repeat else ""
    return (f"step {e.step:>7}  {state:<8} {e.rule:<16} device {e.device}  value {e.value:.4g} "
            f"threshold {e.threshold:.4g}{again}\n{'':>15}{e.message}")


def _json_number(x: float) -> float | None:
    return x if math.isfinite(x) else None  # JSON has no NaN / Inf; the message says what the value was


def alert_json(e: Event) -> str:
    """JSON mode: one alert as one line of strict JSON (non-finite numbers are null)."""
    return json.dumps({
        "step": e.step, "rule": e.rule, "severity": e.severity.value, "status": e.status.value,
        "value": _json_number(e.value), "threshold": _json_number(e.threshold), "message": e.message,
        "device": e.device, "phase": e.phase, "repeat": e.repeat, "metric": e.metric, "run_id": e.run_id,
    }, allow_nan=False)
