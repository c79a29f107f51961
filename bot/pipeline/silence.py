"""Silences: matchers (run, rule, device, severity; empty = any) with an expiry."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import TypeVar

from bot.pipeline.flow import Context, Matcher, Notification
from msmon.contract.wire import Event

M = TypeVar("M", bound=Matcher)


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


def silenced_by(ev: Event, silences: Iterable[M], now: float) -> M | None:
    for s in silences:
        if s.matches(ev, now):
            return s
    return None


def stage(ctx: Context, n: Notification) -> Notification | None:
    return n if silenced_by(n.event, ctx.silences, ctx.now) is None else None
