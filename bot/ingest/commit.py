"""The group commit of the runs' liveness: envelopes without events are answered 202 only once what they
changed is committed, in one transaction for every envelope that came within a few milliseconds.

    envelope (samples, heartbeats) ─► Ingest.envelope(defer=True): the run's row update held in the store,
        merged with the run's other held updates ─► `Commits.committed()` awaits ─► one transaction writes
        every run's held update (one statement per run, whatever the number of its envelopes) ─► 202

An envelope with events or job actions is not held: its own transaction commits it (and what was held before
it) before its answer, as before. A failed commit fails every envelope that waited for it (503: they are sent
again). Whichever path writes the held updates (this commit, an event envelope's transaction, the delivery
worker's, an escalation pass, a heartbeat, a read of the runs), a write that fails or a transaction that rolls
back puts them back in the store (bot/store: `flush_runs`), so the next commit writes them and no waiter is
answered 202 for what is not committed (tests/bot/store/test_accepted_is_stored.py). Measured:
bench/bench_ranks.py (one run of 1,000 ranks: one UPDATE per window instead of one per envelope).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

WINDOW = 0.005  # seconds the first held envelope waits for others to join its commit


class Flushes(Protocol):
    def flush_runs(self, now: float | None = None) -> int: ...


class Commits:
    """Who waits for the store's held updates to be committed, and the one commit they wait for."""

    def __init__(self, store: Flushes, clock: Callable[[], float], window: float = WINDOW) -> None:
        self.store, self.clock, self.window = store, clock, window
        self._waiting: list[asyncio.Future[None]] = []
        self._timer: asyncio.TimerHandle | None = None

    async def committed(self) -> None:
        """Returns once what was held so far is committed (at the end of this window); raises what the commit
        raised."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._waiting.append(fut)
        if self._timer is None:
            self._timer = loop.call_later(self.window, self.commit)
        await fut

    def commit(self) -> None:
        """Commit what is held now and answer whoever waited (an error: each of them raises it)."""
        self._timer = None
        waiting, self._waiting = self._waiting, []
        try:
            self.store.flush_runs(self.clock())
        except Exception as exc:  # noqa: BLE001 - each waiting request answers it (the store's error: 503)
            for fut in waiting:
                if not fut.done():  # a request whose client went away was cancelled
                    fut.set_exception(exc)
            return
        for fut in waiting:
            if not fut.done():
                fut.set_result(None)
