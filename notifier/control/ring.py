"""The job's health checkpoints: `HealthRing` writes one when the ring says it is due, marks them by the alerts, deletes
what the ring lets go and tells the bot (with each heartbeat) what it holds. The ring's decisions are
notifier/checkpoints.py's `Ring`; the files are the backend's (RewindBackend.save_checkpoint)."""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from msmon.common.safenames import slug
from msmon.contract.wire import RingCheckpoint, Severity

from ..checkpoints import Entry, Ring, RingPolicy
from .backend import Backend, RewindBackend

if TYPE_CHECKING:
    from ..monitor import Monitor

log = logging.getLogger("msmon")


def rewinder(backend: Backend | None) -> RewindBackend | None:
    """The backend, if it can load checkpoints (RewindBackend)."""
    return cast(RewindBackend, backend) if backend is not None and hasattr(backend, "read_checkpoint") else None


def loss_curve(monitor: Monitor, upto: int) -> tuple[str, float | None, float | None]:
    """The pre-fault curve: the loss of the last samples at or before step `upto` (mean, noise as the standard
    deviation of its step-to-step changes), from the samples the monitor keeps."""
    xs = [(s.step, s.loss) for s in monitor.recent() if s.step <= upto and s.loss is not None
          and math.isfinite(s.loss)][-20:]
    if len(xs) < 3:
        return "", None, None
    vals = [v for _, v in xs]
    mean = sum(vals) / len(vals)
    diffs = [b - a for a, b in zip(vals, vals[1:], strict=False)]
    noise = math.sqrt(sum(d * d for d in diffs) / len(diffs) / 2) if diffs else 0.0
    return f"{mean:.4g} +- {noise:.2g} over steps {xs[0][0]:,}-{xs[-1][0]:,}", mean, noise


def data_position(backend: Backend | None, run_context: Any) -> int | None:
    """Batches the training has read so far, if the backend says (None: not known)."""
    pos = getattr(backend, "data_position", None)
    if pos is None:
        return None
    try:
        value = pos(run_context)
    except Exception:  # noqa: BLE001 - not known
        return None
    return None if value is None else int(value)


class HealthRing:
    """The health checkpoints of one rank (monitor_config `checkpoint_ring`, docs/rewind.md) and the attempt they
    belong to (rewinds applied so far: the same on every rank). `ring` is None when the run keeps none."""

    def __init__(self, monitor: Monitor, backend: Backend | None, clock: Callable[[], float]) -> None:
        self.monitor, self.backend, self._clock = monitor, backend, clock
        cfg = monitor.config.checkpoint_ring
        self.unhealthy_on = Severity(cfg.unhealthy_on)
        self.attempt = 0
        self.last_alert: int | None = None  # the step of the newest alert that marked the ring (`before-alert`)
        self.save_failures = 0
        self.ring: Ring | None = None
        self.dir = ""
        if cfg.enable:
            self._start()

    def _start(self) -> None:
        cfg, mon = self.monitor.config.checkpoint_ring, self.monitor
        every_s = None if cfg.every_minutes is None else cfg.every_minutes * 60.0
        every_steps = cfg.every_steps if cfg.every_steps is not None or every_s is not None else 100
        if mon.world.multi and every_s is not None and cfg.every_steps is None:
            log.warning("msmon: run %s: checkpoint_ring.every_minutes in a multi-rank run would save at a different "
                        "step on each rank, and a rewind needs the same checkpoint on all: saving every 100 steps "
                        "instead (set checkpoint_ring.every_steps)", mon.run_id)
            every_s, every_steps = None, 100
        elif mon.world.multi:
            every_s = None
        self.ring = Ring(RingPolicy(cfg.keep, every_steps, every_s, cfg.confirm_steps, cfg.suspect_steps),
                         self._clock())
        self.dir = cfg.dir.replace("{run_id}", slug(mon.run_id)).replace("{device}", slug(mon.default_device))

    def step_end(self, step: int, run_context: Any) -> None:
        """At a step boundary: confirm the pending checkpoints, write one when due. Never raises."""
        ring = self.ring
        if ring is None:
            return
        try:
            if ring.entries and ring.advance(step):
                self.publish()
            if ring.due(step, self._clock()):
                self._save(step, run_context)
        except Exception:  # noqa: BLE001 - a health checkpoint must never take training down
            log.exception("msmon: run %s: the health checkpoint of step %d failed; training goes on",
                          self.monitor.run_id, step)

    def _save(self, step: int, run_context: Any) -> None:
        ring, backend, mon = self.ring, rewinder(self.backend), self.monitor
        assert ring is not None
        if backend is None:
            self.ring = None
            log.warning("msmon: run %s: checkpoint_ring is on but the backend cannot load checkpoints "
                        "(read_checkpoint/restore, notifier.control.RewindBackend): no health checkpoints",
                        mon.run_id)
            return
        name = f"{slug(mon.run_id)}-device{slug(mon.default_device)}-a{self.attempt}-step{step}"
        started = time.perf_counter()
        try:
            os.makedirs(self.dir, exist_ok=True)
            path = backend.save_checkpoint(step, name, self.dir)
            self._write_state(path)
        except Exception as exc:  # noqa: BLE001 - reported, the ring keeps what it has
            self.save_failures += 1
            ring.restart_clock(self._clock())
            log.error("msmon: run %s step %d: health checkpoint not written (%s: %s); the ring keeps its %d "
                      "earlier ones, training goes on", mon.run_id, step, type(exc).__name__, exc, len(ring.entries))
            return
        gone = ring.saved(step, self._clock(), path, data_position(self.backend, run_context), self.attempt,
                          self._firing_text(), loss_curve(mon, step))
        self.delete(gone)
        log.debug("msmon: health checkpoint of step %d in %.1f ms: %s", step, 1e3 * (time.perf_counter() - started),
                  path)
        self.publish()

    def _write_state(self, checkpoint: str) -> None:
        """The monitor's state next to a health checkpoint (`<ckpt>.msmon.json`, atomically), unless the backend
        wrote it already (MonitorCallback's does)."""
        path = checkpoint + ".msmon.json"
        if os.path.exists(path):
            return
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            # one write: json.dump writes piecemeal, about 8x slower on a 60 KB state
            f.write(json.dumps(self.monitor.state_dict(), allow_nan=False, separators=(",", ":")))
        os.replace(tmp, path)

    def _firing_text(self) -> str | None:
        """The alerts of the marking severity firing now, named (None: none)."""
        firing = [f"{rule} {sev.value}" for _, rule, sev in self.monitor.firing()
                  if sev.rank >= self.unhealthy_on.rank]
        return ", ".join(dict.fromkeys(firing)) or None

    def marks(self, severity: Severity) -> bool:
        """Whether an alert of this severity marks the ring."""
        return self.ring is not None and severity.rank >= self.unhealthy_on.rank

    def mark(self, step: int, why: str) -> None:
        """An alert at `step`: the checkpoints it makes suspect are marked (and `before-alert` means this step)."""
        self.last_alert = step
        ring = self.ring
        if ring is not None and ring.alert(step, why):
            self.publish()

    def rewound(self, to_step: int) -> None:
        """A rewind to the checkpoint of `to_step` was applied: a new attempt, the later checkpoints dropped."""
        ring = self.ring
        assert ring is not None
        self.delete(ring.rewound(to_step))
        ring.restart_clock(self._clock())
        self.attempt += 1

    def delete(self, gone: list[Entry]) -> None:
        delete = getattr(self.backend, "delete_checkpoint", None)
        for e in gone:
            try:
                if delete is not None:
                    delete(e.path)
                if os.path.exists(e.path + ".msmon.json"):
                    os.remove(e.path + ".msmon.json")
            except OSError as exc:
                log.warning("msmon: the ring could not delete %s (%s); delete it by hand", e.path, exc)

    def publish(self) -> None:
        """What the bot knows of the ring: the heartbeat carries it (Heartbeat.checkpoints)."""
        tr, ring = self.monitor.transport, self.ring
        if tr is not None and ring is not None:
            tr.ring([RingCheckpoint(step=e.step, time=e.time, health=e.health.value, why=e.why[:512],
                                    attempt=e.attempt) for e in ring.entries[-64:]], self.attempt)


__all__ = ["HealthRing", "data_position", "loss_curve", "rewinder"]
