"""Recent metrics per run and device, in fixed-size numeric rings: memory is bounded by
configuration (runs x devices x samples x 9 numbers, 2 more for a run with fp16 loss scaling), never by how
long a run has been going."""

from __future__ import annotations

import math
from array import array
from collections import OrderedDict, deque
from typing import Any

import msgspec

from bot.runs.curve import Curve
from msmon.common.text import one_line
from msmon.contract.wire import ActionResult, Heartbeat, RingCheckpoint, Sample

FIELDS = ("loss", "learning_rate", "grad_norm", "samples_per_s", "tokens_per_s", "step_time", "max_step_time",
          "time")
# fp16 dynamic loss scaling: columns made on a device's first sample that has one (a run without it pays nothing)
SCALING = ("loss_scale", "skipped_steps")
RING_DEVICES = 16  # devices of a run whose health checkpoints the bot keeps (status shows one and how many agree)
RING_RUNS = 256  # runs whose health checkpoints the bot keeps, the least recently heard from forgotten first
RING_WHY = 120  # characters of a checkpoint's `why` kept (the wire allows 512)
# the health words a job's checkpoint ring uses (notifier/checkpoints.py's Health); anything else is kept as "unknown"
HEALTH = frozenset({"pending", "healthy", "doubted", "unhealthy"})
_NONE = math.nan  # a missing value; NaN that was measured is kept apart by the `missing` bit set
_BITS = {f: 1 << i for i, f in enumerate(FIELDS + SCALING + ("overflow",))}
_OVERFLOWED = 1 << len(_BITS)  # the sample's `overflow` is True (its `missing` bit clear)


def kept(c: RingCheckpoint) -> RingCheckpoint:
    """A checkpoint as the bot keeps it: its health one of HEALTH ("unknown" else), its `why` at most RING_WHY
    characters with control characters shown as text (a newline in it wrote its own line into `status`). So a full
    ring costs about 340 KB a run (16 devices x 64; 1 MB as sent), 87 MB at most (RING_RUNS runs): bench_bounds.py."""
    health = c.health if c.health in HEALTH else "unknown"
    why = one_line(c.why)[:RING_WHY]
    if health is c.health and why == c.why:
        return c
    return msgspec.structs.replace(c, health=health, why=why)


class Ring:
    """The last `size` samples of one device: one array per field (8 bytes a number)."""

    __slots__ = ("size", "n", "head", "steps", "cols", "scaling", "missing", "run_id", "device")

    def __init__(self, size: int, run_id: str, device: str) -> None:
        self.size, self.n, self.head = size, 0, 0
        self.run_id, self.device = run_id, device
        self.steps = array("q", bytes(8 * size))
        self.cols = {f: array("d", bytes(8 * size)) for f in FIELDS}
        self.scaling: dict[str, array[float]] | None = None  # SCALING's columns, once a sample has one
        self.missing = array("H", bytes(2 * size))  # which fields were None, one bit each (and _OVERFLOWED)

    def add(self, s: Sample) -> None:
        i = self.head
        self.steps[i] = s.step
        mask = 0
        for f in FIELDS:
            v = getattr(s, f)
            if v is None:
                mask |= _BITS[f]
                v = _NONE
            self.cols[f][i] = v
        for f in SCALING:
            v = getattr(s, f)
            if v is None:
                mask |= _BITS[f]
                continue
            if self.scaling is None:
                self.scaling = {g: array("d", bytes(8 * self.size)) for g in SCALING}
            self.scaling[f][i] = v
        mask |= _BITS["overflow"] if s.overflow is None else _OVERFLOWED if s.overflow else 0
        self.missing[i] = mask
        self.head = (i + 1) % self.size
        self.n = min(self.n + 1, self.size)

    def sample(self, back: int = 0) -> Sample:
        """The sample `back` places before the newest (0: the newest)."""
        i = (self.head - 1 - back) % self.size
        mask = self.missing[i]
        vals: dict[str, Any] = {f: None if mask & _BITS[f] else self.cols[f][i] for f in FIELDS}
        t = vals.pop("time")
        cols = self.scaling
        scale = None if cols is None or mask & _BITS["loss_scale"] else cols["loss_scale"][i]
        skipped = None if cols is None or mask & _BITS["skipped_steps"] else int(cols["skipped_steps"][i])
        overflow = None if mask & _BITS["overflow"] else bool(mask & _OVERFLOWED)
        return Sample(run_id=self.run_id, device=self.device, step=self.steps[i], time=t or 0.0, overflow=overflow,
                      loss_scale=scale, skipped_steps=skipped, **vals)

    def samples(self) -> list[Sample]:
        """Oldest first."""
        return [self.sample(k) for k in range(self.n - 1, -1, -1)]


class Windows:
    """Rings per run and device (the least recently seen runs forgotten past `max_runs`), and the
    last job actions of each run."""

    def __init__(self, per_device: int, max_runs: int) -> None:
        self.per_device, self.max_runs = per_device, max_runs
        self.runs: OrderedDict[str, dict[str, Ring]] = OrderedDict()
        self.actions: OrderedDict[str, deque[ActionResult]] = OrderedDict()
        self.plans: OrderedDict[str, tuple[int | None, float | None]] = OrderedDict()  # total_steps, target_loss
        # the health checkpoints each device's heartbeat lists (docs/rewind.md), at most RING_DEVICES devices a run
        self.checkpoints: OrderedDict[str, OrderedDict[str, list[RingCheckpoint]]] = OrderedDict()
        # each run's whole curve, downsampled (bot/runs/curve.py): what a run that ended or died went through
        self.curves: OrderedDict[str, Curve] = OrderedDict()

    def add_plan(self, hb: Heartbeat) -> None:
        if hb.checkpoints is not None:
            self._add_checkpoints(hb)
        if hb.total_steps is None and hb.target_loss is None:
            return
        self.plans[hb.run_id] = (hb.total_steps, hb.target_loss)
        self.plans.move_to_end(hb.run_id)
        while len(self.plans) > self.max_runs:
            self.plans.popitem(last=False)

    def _add_checkpoints(self, hb: Heartbeat) -> None:
        devices = self.checkpoints.get(hb.run_id)
        if devices is None:
            devices = self.checkpoints[hb.run_id] = OrderedDict()
            while len(self.checkpoints) > min(self.max_runs, RING_RUNS):
                self.checkpoints.popitem(last=False)
        else:
            self.checkpoints.move_to_end(hb.run_id)
        devices[hb.device] = [kept(c) for c in hb.checkpoints or ()]
        devices.move_to_end(hb.device)
        while len(devices) > RING_DEVICES:
            devices.popitem(last=False)

    def add(self, s: Sample) -> None:
        run = self.runs.get(s.run_id)
        if run is None:
            run = self.runs[s.run_id] = {}
            while len(self.runs) > self.max_runs:
                self.runs.popitem(last=False)
        else:
            self.runs.move_to_end(s.run_id)
        ring = run.get(s.device)
        if ring is None:
            ring = run[s.device] = Ring(self.per_device, s.run_id, s.device)
        ring.add(s)
        curve = self.curves.get(s.run_id)
        if curve is None:
            curve = self.curves[s.run_id] = Curve(s.device)
            while len(self.curves) > self.max_runs:
                self.curves.popitem(last=False)
        else:
            self.curves.move_to_end(s.run_id)
        curve.add(s)

    def add_action(self, a: ActionResult) -> None:
        q = self.actions.get(a.run_id)
        if q is None:
            q = self.actions[a.run_id] = deque(maxlen=50)
            while len(self.actions) > self.max_runs:
                self.actions.popitem(last=False)
        q.append(a)

    def latest(self, run_id: str) -> dict[str, Sample]:
        return {dev: ring.sample() for dev, ring in self.runs.get(run_id, {}).items() if ring.n}

    def pace(self, run_id: str, span: int = 20) -> tuple[float, float] | None:
        """(steps per second over a run's last `span` samples, the job's clock at its newest sample), from
        the fastest device; None when unknown."""
        best = None
        for ring in self.runs.get(run_id, {}).values():
            if ring.n < 2:
                continue
            new, old = ring.sample(), ring.sample(min(span, ring.n) - 1)
            dt = new.time - old.time
            if dt > 0 and new.step > old.step:
                rate = (new.step - old.step) / dt
                if best is None or rate > best[0]:
                    best = (rate, new.time)
        return best

    def history(self, run_id: str, device: str) -> list[Sample]:
        ring = self.runs.get(run_id, {}).get(device)
        return [] if ring is None else ring.samples()
