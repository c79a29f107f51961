"""Who sent a job's message and which run it may act on: one answer for HTTP (bot/app.py) and NATS (nats.py).

A token (HTTP's bearer token, NATS's Msmon-Token header) is compared in constant time with every configured one;
a run is the project's that the job states, else the token's own, and never another project's (`run_owner`).
"""

from __future__ import annotations

import hmac
import logging

from bot.config import BotConfig
from bot.store.sqlite import Store

log = logging.getLogger("msmon.bot")

Token = tuple[str, str, bytes]  # (project, operator name or "", token)


def configured_tokens(cfg: BotConfig) -> list[Token]:
    """(project, operator name or "", token) for every job and operator token configured."""
    out = []
    for secret, project, operator in [(t, t.project, "") for t in cfg.tokens] + \
            [(o, "*", o.user) for o in cfg.commands.operators]:
        value = secret.value()
        if value:
            out.append((project, operator, value.encode()))
        else:
            whose = f"operator {operator}" if operator else f"the jobs of project {project}"
            log.warning("msmon bot: the token of %s (%s) is empty or missing; it will be refused", whose,
                        f"env {secret.env}" if secret.env else f"file {secret.file}")
    return out


class JobAuth:
    """The configured tokens and the store's runs: whose a token is, and whose a run is."""

    def __init__(self, tokens: list[Token], store: Store) -> None:
        self.tokens, self.store = tokens, store

    def token_holder(self, given: bytes) -> tuple[str, str] | None:
        """(project, operator) of the token `given` (HTTP's bearer token, NATS's Msmon-Token header), or None.
        Compared with every configured token (no early exit that would time which one matched)."""
        found = None
        for project, operator, token in self.tokens:
            if hmac.compare_digest(given, token) and found is None:
                found = (project, operator)
        return found

    def run_owner(self, token: str, run_id: str, claimed: str | None = None) -> tuple[str | None, str, str | None]:
        """(project, key, None) when a token of project `token` may act on the job's run `run_id`, else (project,
        key, why not). (HTTP's `_own`, NATS's ingest.)

        The run is the project's: the one the job states (`claimed`), else the token's own; never a default. Run
        ids are the jobs' own, so two projects may use one: each has its own run, and a token of one project can
        never claim, move or read the other's (no squatting: whoever came first, the other's run is kept as
        "<run_id>@<project>", its `key` here). A token of every project (`*`) with a message that states no
        project (an older notifier) reaches the run of that id as it is; it creates none: (None, run_id, None)."""
        project = claimed if claimed is not None else token if token != "*" else None
        if token not in ("*", project):
            return project, run_id, f"this token is for project {token!r}, not {project!r} (run {run_id!r})"
        owner = self.store.project_of(run_id)
        if project is None:
            return owner, run_id, None
        if owner is None or owner == project:
            return project, run_id, None
        alias = f"{run_id}@{project}"
        other = self.store.project_of(alias)
        if other is None or other == project:
            return project, alias, None
        return project, alias, f"run ids {run_id!r} and {alias!r} both belong to other projects"
