"""Inhibit: while a run has an ERROR firing, its WARNINGs are held back (they are noise next to it)."""

from __future__ import annotations

from bot.pipeline.flow import Context, Notification
from msmon.contract.wire import Event, Severity, Status


def inhibited(ev: Event, run_has_error_firing: bool, enabled: bool = True) -> bool:
    return (enabled and run_has_error_firing and ev.severity is Severity.WARNING
            and ev.status is Status.FIRING)


def stage(ctx: Context, n: Notification) -> Notification | None:
    """Also marks the run for the rest of the batch when `n` is a firing ERROR (it reached this stage:
    neither a repeat nor acknowledged), so the WARNINGs after it in the same envelope are held too."""
    ev = n.event
    if ev.severity is Severity.ERROR and ev.status is Status.FIRING:
        ctx.error_firing = True
    return None if inhibited(ev, ctx.error_firing, ctx.settings.inhibit_warnings) else n
