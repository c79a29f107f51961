"""Inhibit: while a run has an ERROR firing, its WARNINGs are held back (they are noise next to it)."""

from __future__ import annotations

from msmon.contract.wire import Event, Severity, Status


def inhibited(ev: Event, run_has_error_firing: bool, enabled: bool = True) -> bool:
    return (enabled and run_has_error_firing and ev.severity is Severity.WARNING
            and ev.status is Status.FIRING)
