"""Where a message's time goes between the job's POST and the chat platform: the times its rows passed each
stage of delivery, written as one JSON line per message once it is settled, to the file MSMON_DELIVERY_TRACE
names (unset: nothing is kept, nothing is written). bench/bench_error_latency.py reads it and prints each
stage's p50 and p99.

The stages, in order (time.monotonic(), one clock for every process of the machine, as the local Slack
API records its requests):

    received     the ingest took the envelope (the payload's received_at, the bot's clock turned monotonic)
    ring         the doorbell rang for the round that took the rows (the ingest rings it after its commit)
    wake         the worker's loop ran again after that ring (its event loop was busy until then)
    pick         the round read the due rows (the store's query) and gave the group to its lane's task
    turn         the lane's task came to the group (the lanes before it in the round, the claim)
    planned      the group passed the delivery stages (rate limits; each deferral is counted, and its first
                 pick is kept as first_pick: a deferred group is picked again when it is due)
    chart_queued / chart_start / chart_end / chart_back
                 the chart was handed to the executor / a thread began drawing it / finished / the loop took
                 the PNG back (executor queue, drawing, the loop's delay)
    post_start   the text's HTTP request began (after the chart or CHART_WAIT)
    post_end     the platform's answer was read
    settled      the verdict was written
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterable

ENV = "MSMON_DELIVERY_TRACE"
log = logging.getLogger("msmon.bot")
KEPT = 10_000  # rows traced at once (a dead receiver's backlog is not kept without bound)


class Trace:
    """The stage times of the rows in delivery (row id -> stage -> monotonic time); off without a path."""

    def __init__(self, path: str | None) -> None:
        self.path = path or None
        self._rows: dict[int, dict[str, float]] = {}
        self._deferred: dict[int, int] = {}
        self.rang = 0.0  # the last ring of the doorbell
        self.woke = 0.0  # the worker's loop ran again after it
        self.woke_ring = 0.0  # ... the ring it woke on

    @classmethod
    def from_env(cls) -> Trace:
        return cls(os.environ.get(ENV))

    @property
    def on(self) -> bool:
        return self.path is not None

    def mark(self, ids: Iterable[int], stage: str, at: float | None = None, first: bool = False) -> None:
        """`stage` passed at `at` (now) by rows `ids`; `first`: keep the first time (a stage passed again)."""
        if self.path is None:
            return
        t = time.monotonic() if at is None else at
        for i in ids:
            stages = self._rows.get(i)
            if stages is None:
                if len(self._rows) >= KEPT:
                    continue
                stages = self._rows[i] = {}
            if not first or stage not in stages:
                stages[stage] = t

    def resumed(self) -> None:
        """The worker's loop runs again: on the ring since it last ran, or on its timeout (the ring is then now)."""
        if self.path is None:
            return
        now = time.monotonic()
        self.woke_ring = self.rang if self.rang > self.woke else now
        self.woke = now

    def picked(self, ids: Iterable[int]) -> None:
        """A round took the rows: the ring and the wake it followed, the pick, the first pick kept."""
        if self.path is None:
            return
        ids = list(ids)
        now = time.monotonic()
        self.mark(ids, "first_pick", now, first=True)
        self.mark(ids, "ring", self.woke_ring or self.woke)
        self.mark(ids, "wake", self.woke)
        self.mark(ids, "pick", now)

    def deferred(self, ids: Iterable[int]) -> None:
        if self.path is None:
            return
        for i in ids:
            self._deferred[i] = self._deferred.get(i, 0) + 1

    def settled(self, ids: list[int], run_id: str | None, kind: str, state: str, received_at: float | None) -> None:
        """The rows' verdict is written: one line for the message when it is delivered (or dead), the rows forgotten."""
        if self.path is None:
            return
        stages = self._rows.get(ids[0]) if ids else None
        if state not in ("delivered", "dead"):
            return
        for i in ids:
            self._rows.pop(i, None)
        deferred = sum(self._deferred.pop(i, 0) for i in ids)
        if stages is None:
            return
        now = time.monotonic()
        stages["settled"] = now
        if received_at is not None:  # the bot's wall clock, as monotonic
            stages["received"] = received_at - time.time() + now
        line = json.dumps({"run": run_id, "kind": kind, "state": state, "deferred": deferred, "stages": stages})
        try:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(line + "\n")
        except OSError as exc:  # a benchmark's file: never the delivery's trouble; tracing stops, said once
            log.warning("msmon bot: the delivery trace cannot be written to %s (%s); tracing is off until the bot "
                        "restarts (%s)", self.path, exc, ENV)
            self.path = None
            self._rows.clear()
