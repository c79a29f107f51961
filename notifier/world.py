"""Which process of a job this is: its rank in the world, the world's size, the local device id, the host.

Read once at start-up, never per step. MindSpore's own answer is taken when the program has already
initialised communication (`mindspore.communication.init()`: `get_rank()` / `get_group_size()`); else the
environment that the launchers set: msrun (RANK_ID, MS_NODE_ID, MS_WORKER_NUM, DEVICE_ID), MindFormers'
scripts and rank tables (RANK_ID, RANK_SIZE, DEVICE_ID), torchrun-style launchers (RANK, WORLD_SIZE,
LOCAL_RANK) and Open MPI's mpirun (OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK). Nothing here imports
MindSpore: a program that has not imported it has not initialised its communication either.

Standard library only.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import sys
from collections.abc import Mapping
from types import ModuleType

RANK_VARS = ("RANK_ID", "RANK", "OMPI_COMM_WORLD_RANK", "MS_NODE_ID")
SIZE_VARS = ("RANK_SIZE", "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "MS_WORKER_NUM")
DEVICE_VARS = ("DEVICE_ID", "LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK")
_MAX = 2**31 - 1  # the wire's bound on a rank (msmon.contract.wire.Envelope.rank)


@dataclasses.dataclass(frozen=True)
class World:
    """This process's place in its job. `rank` None: a single process, or a launcher msmon does not know."""

    rank: int | None = None
    size: int = 1
    device_id: int | None = None
    host: str = ""
    source: str = "default"  # where rank and size came from: "mindspore", an environment variable, "default"

    @property
    def multi(self) -> bool:
        """More than one rank: what one rank does alone can leave the others blocked in a collective."""
        return self.size > 1

    def describe(self) -> str:
        if not self.multi:
            return f"a single process on {self.host or 'this host'}"
        device = f", device {self.device_id}" if self.device_id is not None else ""
        return f"rank {self.rank} of {self.size}{device} on {self.host or 'this host'} (from {self.source})"


def _int(value: object) -> int | None:
    text = str(value).strip()
    if text.isascii() and text.isdigit() and len(text) <= 10:
        n = int(text)
        return n if n <= _MAX else None
    return None


def _first(environ: Mapping[str, str], names: tuple[str, ...]) -> tuple[int | None, str]:
    for name in names:
        n = _int(environ.get(name, ""))
        if n is not None:
            return n, name
    return None, ""


def _mindspore(modules: Mapping[str, ModuleType]) -> tuple[int, int] | None:
    """(rank, size) from MindSpore when its communication is initialised; None otherwise (never raises)."""
    comm = modules.get("mindspore.communication")
    if comm is None:
        return None
    inited = getattr(getattr(comm, "GlobalComm", None), "INITED", False)
    if inited is not True:  # without init() get_rank() answers 0 and get_group_size() 1, not the launcher's world
        return None
    try:
        rank, size = int(comm.get_rank()), int(comm.get_group_size())
    except Exception:  # noqa: BLE001 - not initialised (RuntimeError), or a build without it
        return None
    return (rank, size) if 0 <= rank < max(size, 1) <= _MAX else None


def detect(environ: Mapping[str, str] | None = None, modules: Mapping[str, ModuleType] | None = None,
           hostname: str | None = None) -> World:
    """This process's World (see the module's docstring for what is read, in which order)."""
    env = os.environ if environ is None else environ
    host = socket.gethostname() if hostname is None else hostname
    device, _ = _first(env, DEVICE_VARS)
    ms = _mindspore(sys.modules if modules is None else modules)
    if ms is not None:
        return World(rank=ms[0], size=ms[1], device_id=device, host=host, source="mindspore")
    rank, rank_var = _first(env, RANK_VARS)
    size, size_var = _first(env, SIZE_VARS)
    if size is None or size < 1:
        size = 1 if rank is None else rank + 1  # a rank says there is a world at least that big
    if rank is not None and rank >= size:
        size = rank + 1
    source = " and ".join(dict.fromkeys(v for v in (rank_var, size_var) if v)) or "default"
    return World(rank=rank, size=size, device_id=device, host=host, source=source)



def refuse_lone_actions(actions: list[tuple[str, str]], world: World, bot: str | None, commands: bool) -> None:
    """A ConfigError when a multi-rank run would apply configured actions on one rank alone.

    `actions`: (key path, action) of each `monitor_config.actions` entry; `bot`: bot.url (None or empty: no
    bot); `commands`: bot.commands. In a run of many ranks every action that changes the job goes through the
    bot, which has every rank apply it at the same step: without a bot that takes commands, a pause on the
    rank whose rule fired would leave the others blocked in the next collective (and a stop, a checkpoint or
    an LR change on one rank would split the run)."""
    if not world.multi or not actions or (bot and commands):
        return
    from msmon.config.errors import ConfigError, Issue

    why = ("no bot.url is set" if not bot else "bot.commands is false, so the ranks take no commands from the bot")
    issues = [Issue(path, f"{action} cannot run in this {world.size}-rank run ({world.describe()}): {why}. A "
                          f"configured action applies on every rank at the same step through the bot's commands; on "
                          f"the one rank whose rule fired it would leave the others blocked in the next collective "
                          f"(or split the run). Set bot.url (and keep bot.commands on), or remove the action "
                          f"for multi-rank runs") for path, action in actions]
    raise ConfigError(issues)


__all__ = ["DEVICE_VARS", "RANK_VARS", "SIZE_VARS", "World", "detect", "refuse_lone_actions"]
