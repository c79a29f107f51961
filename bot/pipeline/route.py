"""Route: the first route whose project, severity and labels match decides receiver and channel."""

from __future__ import annotations

from msmon.contract.wire import Severity

from ..config import Route

CONSOLE = Route(receiver="console", channel="console")


def route_for(project: str, labels: dict[str, str], severity: Severity, routes: list[Route]) -> Route:
    for r in routes:
        if r.project is not None and r.project not in ("*", project):
            continue
        if r.severity is not None and r.severity != severity.value:
            continue
        if any(labels.get(k) != v for k, v in r.labels.items()):
            continue
        return r
    return CONSOLE
