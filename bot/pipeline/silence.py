"""Silences: matchers (run, rule, device, severity; empty = any) with an expiry."""

from __future__ import annotations

import dataclasses

from msmon.contract.wire import Event


@dataclasses.dataclass
class Silence:
    id: int
    expires_at: float
    run_id: str | None = None
    rule: str | None = None
    device: str | None = None
    severity: str | None = None
    created_by: str = ""
    comment: str = ""

    def matches(self, ev: Event, now: float) -> bool:
        if now >= self.expires_at:
            return False
        return all(want is None or want == got for want, got in (
            (self.run_id, ev.run_id), (self.rule, ev.rule), (self.device, ev.device),
            (self.severity, ev.severity.value)))


def silenced_by(ev: Event, silences: list[Silence], now: float) -> Silence | None:
    for s in silences:
        if s.matches(ev, now):
            return s
    return None
