"""Who may do what: read-only commands for everyone; the ones that change a job only for the users
and groups that `commands.allow` lists for the run's project. Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from bot.config import Permission


def allowed(user: str, project: str, allow: Sequence[Permission], groups: Mapping[str, Sequence[str]]) -> bool:
    """May `user` change jobs of `project`?"""
    for p in allow:
        if p.project not in ("*", project):
            continue
        if user in p.users or any(user in groups.get(g, ()) for g in p.groups):
            return True
    return False


def who_may(project: str, allow: Sequence[Permission]) -> str:
    """For a refusal: whom to ask."""
    names: list[str] = []
    for p in allow:
        if p.project in ("*", project):
            names += p.users + [f"group {g}" for g in p.groups]
    return ", ".join(dict.fromkeys(names)) or "nobody is allowed yet (commands.allow in bot.yaml is empty)"
