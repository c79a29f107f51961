"""Straggler: one device's step time far above the other devices' median."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from msmon.contract.wire import Sample
from msmon.core.detectors.base import SKIP, DetectorContext, Finding, RuleParams, classify
from msmon.core.spec import spec


@dataclasses.dataclass
class StragglerParams(RuleParams):
    """Levels are a device's step time as a multiple of the median of the other devices' latest.

    It needs one Monitor to see several devices (per_device_metrics: true, with each device's
    samples passed in, or a replay of per-device logs). In synchronous data parallelism the wall
    step time is the same on every rank, so feed the time each rank spends outside the collective
    (data wait plus compute) as its step time.
    """

    warning: float | None = dataclasses.field(default=1.5, metadata=spec(gt=1, doc="x the other devices' median"))
    error: float | None = dataclasses.field(default=3.0, metadata=spec(gt=1, doc="x the other devices' median"))
    consecutive: int = dataclasses.field(default=3, metadata=spec(ge=1, doc="samples in a row"))


class Straggler:
    rule: ClassVar[str] = "straggler"
    summary: ClassVar[str] = "one device slower than the others"
    metric: ClassVar[str] = "step_time"
    requires: ClassVar[frozenset[str]] = frozenset()
    hint: ClassVar[str] = ("One device is slower than the rest and holds every step back: check that host's "
                           "data loader, its device health (temperature, ECC errors) and its network link.")

    def __init__(self, p: StragglerParams, ctx: DetectorContext) -> None:
        self.device = ctx.device
        self.peers = ctx.peers

    def update(self, s: Sample, p: RuleParams) -> Finding | None:
        t = s.step_time
        if not t:
            return SKIP
        peers = self.peers
        peers[self.device] = t
        if len(peers) < 2:
            return None
        others = sorted(v for d, v in peers.items() if d != self.device)
        n = len(others)
        med = others[n // 2] if n & 1 else 0.5 * (others[n // 2 - 1] + others[n // 2])
        if med <= 0.0:
            return None
        ratio = t / med
        level, thr = classify(ratio, p)
        if level is None:
            return None
        return Finding(level, ratio, thr,
                       f"device {self.device} takes {t:.3g} s per step, {ratio:.1f}x the other "
                       f"{n} devices' median {med:.3g} s (threshold {thr:g}x)", med)
