"""The bot's live state: one object the ingest path and the command service share.

Built once at start-up (bot/assembly.py) and handed to both, so neither reaches into the other: ingest
records samples into `windows` and alerts into `index`, the command service reads them for `status`
and `ack`; the jobs' resume times (`resumed_at`) are kept here for both; `wake_outbox()` rings the outbox
workers (each joins the `Doorbell` when it is built) whoever queued a message.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator

from bot.config import BotConfig
from bot.metrics import BotMetrics
from bot.ranks import RankViews
from bot.runs.dropped import JobDrops
from bot.store.alertindex import AlertIndex
from bot.store.rows import AlertView
from bot.store.sqlite import Store
from bot.store.windows import Windows


class Waiters:
    """Jobs' long polls, one asyncio.Event per run, set when a command for it is queued."""

    def __init__(self) -> None:
        self.events: dict[str, asyncio.Event] = {}

    def event(self, run_id: str) -> asyncio.Event:
        ev = self.events.get(run_id)
        if ev is None:
            ev = self.events[run_id] = asyncio.Event()
        return ev

    def wake(self, run_id: str) -> None:
        ev = self.events.pop(run_id, None)
        if ev is not None:
            ev.set()


class Doorbell:
    """Rung when rows were queued: wakes every delivery worker that joined it (bot/delivery/worker.py), in the
    order they joined."""

    def __init__(self) -> None:
        self._wakes: tuple[Callable[[], None], ...] = ()

    def join(self, wake: Callable[[], None]) -> None:
        self._wakes += (wake,)

    def ring(self) -> None:
        for wake in self._wakes:
            wake()


class BotState:
    def __init__(self, cfg: BotConfig, store: Store, metrics: BotMetrics,
                 clock: Callable[[], float] = time.time) -> None:
        self.cfg, self.store, self.metrics, self.clock = cfg, store, metrics, clock
        self.windows = Windows(cfg.window_samples, cfg.max_runs)
        self.ranks = RankViews(cfg.ranks.max_runs, cfg.ranks.max_ranks, cfg.ranks.history)  # across ranks (bot/ranks)
        self.index = AlertIndex(store)
        self.resumed_at: dict[str, float] = {}  # run -> job clock at its last resume (its progress restarts then)
        self.waiters = Waiters()  # the jobs' long polls
        self.drops = JobDrops()  # what jobs reported they dropped, said in chat and status (bot/runs/dropped.py)
        self.doorbell = Doorbell()  # the outbox workers join it when built

    def wake_outbox(self) -> None:
        self.doorbell.ring()

    def command_queued(self, run_id: str | None) -> None:
        """A command for `run_id` was queued, here or on another replica (store.listen): its long polls
        answer now. None: the listener (re)connected and may have missed some: every open run is looked at."""
        if run_id is not None:
            self.waiters.wake(run_id)
            return
        waiting = {c["run_id"] for c in self.store.commands.open_all() if c["run_id"] is not None}
        for r in waiting & set(self.waiters.events):  # only polls with something to take: no spurious end
            self.waiters.wake(r)

    def firing(self, run_id: str) -> list[AlertView]:
        """The run's firing alerts as the store has them (a status chart marks where each began)."""
        return self.store.alerts(run_id, "firing")

    def owns(self, name: str) -> bool:
        """Whether this process holds (took or renewed) lease `name`: one owner at a time of the escalator,
        the digests and command expiry across replicas (bot.store.lease seconds, renewed by acting)."""
        return self.store.lease(name, self.store.owner, self.clock(), self.cfg.store.lease)

    @contextlib.contextmanager
    def tx(self) -> Iterator[None]:
        """One SQLite transaction; the in-memory alert index follows it (applied on commit, dropped on error)."""
        try:
            with self.store.tx():
                yield
        except BaseException:
            self.index.discard()
            raise
        self.index.commit()

    def flush(self) -> None:
        """Write the alerts' held last steps (see AlertIndex); before reading alert rows."""
        if self.index.touches:
            with self.store.tx():
                self.index.flush()
