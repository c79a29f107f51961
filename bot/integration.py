"""What a chat platform gives the app: one object per platform, and the app assembles a list of them
(bot/integrations.py). Each platform lives in its own folder under bot/chat/ and imports no other one.

    name, section   the receiver's name in routes, and its bot.yaml section
    receiver(ctx)   the receiver alerts go out through, when routes use it (None: not used here)
    routes(app, ctx) its way in: the HTTP routes its platform calls (signed requests become commands)
    task(ctx)       a background task it runs while the bot runs (Slack's Socket Mode, Matrix's /sync loop),
                    started after the routes and stopped first at shutdown, or None

Adding a platform: a folder bot/chat/<name>/ with its inbound, its receiver and an `integration.py`
defining a subclass of `Integration`, a section in bot/config.py, and one entry in bot/integrations.py
(CONTRIBUTING.md walks through it).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Protocol

from aiohttp import web

from bot.commands.service import CommandService
from bot.config import BotConfig
from bot.receivers import Receiver


@dataclasses.dataclass(frozen=True)
class Context:
    """What an integration may use: the settings, the clock and, for its way in, the command service."""

    cfg: BotConfig
    clock: Callable[[], float] = time.time
    commands: CommandService | None = None  # set when routes and tasks are assembled

    def uses(self, receiver: str) -> bool:
        """Whether a route of bot.yaml sends to `receiver`."""
        return any(r.receiver == receiver for r in self.cfg.routes)

    @property
    def svc(self) -> CommandService:
        assert self.commands is not None, "routes and tasks are assembled with the command service"
        return self.commands


class Task(Protocol):
    """A background task an integration runs while the bot runs."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class Integration:
    """One chat platform, as the app assembles it; the defaults are no receiver, no way in, no background task,
    and a platform overrides what it has."""

    name = ""
    section = ""

    def receiver(self, ctx: Context) -> Receiver | None:
        return None

    def routes(self, app: web.Application, ctx: Context) -> None:
        return None

    def task(self, ctx: Context) -> Task | None:
        return None
