"""Route: the first route whose project, severity and labels match decides receiver and channel.

Labels are the job's own word (any project's job can set `team: a`), so a route that matches labels
matches them within its project only: one without a project matches nothing (bot.yaml refuses it; '*'
says every project on purpose)."""

from __future__ import annotations

import msgspec

from bot.config import Route
from bot.pipeline.flow import Context, Notification
from msmon.contract.wire import Severity

CONSOLE = Route(receiver="console", channel="console")


def route_for(project: str, labels: dict[str, str], severity: Severity, routes: list[Route]) -> Route:
    for r in routes:
        if r.project is not None and r.project not in ("*", project):
            continue
        if r.labels and r.project is None:
            continue
        if r.severity is not None and r.severity != severity.value:
            continue
        if any(labels.get(k) != v for k, v in r.labels.items()):
            continue
        return r
    return CONSOLE


def stage(ctx: Context, n: Notification) -> Notification:
    """Where `n` goes; a WARNING of a route with `warnings: thread` goes under the run's first message."""
    r = route_for(ctx.project, ctx.labels, n.event.severity, ctx.routes)
    return msgspec.structs.replace(n, receiver=r.receiver, channel=r.channel,
                                   thread=n.event.severity is Severity.WARNING and r.warnings == "thread")
