"""The job's heartbeat: what a heartbeat says (the step, paused, the run's plan, the health checkpoints and
the attempt, this process's nonce and its heartbeats' numbers), kept here and nowhere else, and the thread
that sends one when no envelope carried one for `heartbeat_interval` (a paused or idle job).

A heartbeat due before the next flush rides in the envelope going now instead (`folded`); close() ends the
heartbeats before the final one goes, so the final one is the last this process sends.
"""

from __future__ import annotations

import itertools
import os
import threading
import uuid
from collections.abc import Callable

import msgspec

from msmon.contract.wire import Heartbeat, RingCheckpoint, encode

from .link import Link, Origin
from .timing import Timing


def _new_proc() -> str:
    return f"{os.getpid()}-{uuid.uuid4().hex[:12]}"


class Heartbeats:
    """The heartbeat's state, its numbers and its thread."""

    def __init__(self, link: Link, origin: Origin, timing: Timing, clock: Callable[[], float],
                 monotonic: Callable[[], float]) -> None:
        self._link, self._origin, self._timing = link, origin, timing
        self._clock, self._mono = clock, monotonic
        # This process's own start (a nonce) and its heartbeats' numbers: the bot tells a re-run (a new attempt)
        # from a late message of this one, and a heartbeat overtaken in flight from a newer one (bot/runs/lifecycle.py).
        self.proc = _new_proc()
        self._seq = itertools.count(1)
        # The health checkpoints and the attempt (`ring`, from notifier/control; a rewind renews `proc`: `new_attempt`)
        self.checkpoints: list[RingCheckpoint] | None = None
        self.attempt: int | None = None
        self.last_step: int | None = None
        self.paused = False
        self.total_steps: int | None = None  # the run's plan (`plan`, from the Monitor)
        self.target_loss: float | None = None
        # When a heartbeat last went, on its own or in an envelope: the thread sends one only when none did for an
        # interval.
        self._last_beat = monotonic()
        self._lock = threading.Lock()  # a folded heartbeat is numbered before the final one, never after
        self._stopped = threading.Event()  # close(): the heartbeats end before the final one goes
        self.thread = threading.Thread(target=self._loop, name="msmon-heartbeat", daemon=True)

    def start(self) -> None:
        self.thread.start()

    # -- what the job says (the training thread, the Monitor, job control) ---------------------------

    def step(self, step: int) -> None:
        """The step the next heartbeat reports."""
        self.last_step = step

    def progress(self, step: int, paused: bool) -> None:
        self.last_step = step
        self.paused = paused

    def plan(self, total_steps: int | None, target_loss: float | None) -> None:
        self.total_steps, self.target_loss = total_steps, target_loss

    def ring(self, checkpoints: list[RingCheckpoint], attempt: int) -> None:
        self.checkpoints, self.attempt = checkpoints, attempt

    def new_attempt(self) -> None:
        self.proc = _new_proc()

    # -- the heartbeats ------------------------------------------------------------------------------

    def beat(self) -> Heartbeat:
        """The next heartbeat, numbered."""
        o = self._origin
        return Heartbeat(run_id=o.run_id, device=o.device, time=self._clock(), step=self.last_step,
                         paused=self.paused, host=o.host, pid=os.getpid(),
                         total_steps=self.total_steps, target_loss=self.target_loss, project=o.project,
                         rank=o.rank, world=o.world, proc=self.proc, seq=next(self._seq),
                         checkpoints=self.checkpoints, attempt=self.attempt)

    def folded(self, now: float) -> list[Heartbeat]:
        """A heartbeat for the envelope going now, when one is due within two flushes anyway (an envelope goes about
        every flush_interval, so the next one may come too late), or half an interval has passed; none once close()
        has stopped the heartbeats: the final one is the last."""
        interval = self._timing.heartbeat_interval
        if now - self._last_beat < max(interval - 2 * self._timing.flush_interval, interval / 2):
            return []
        with self._lock:
            return [] if self._stopped.is_set() else [self.beat()]

    def carried(self, now: float) -> None:
        """An envelope took a folded heartbeat to the bot at `now`."""
        self._last_beat = now

    def _loop(self) -> None:
        interval = self._timing.heartbeat_interval
        while not self._stopped.wait(max(self._last_beat + interval - self._mono(), 0.05)):
            if self._mono() - self._last_beat < interval * 0.99:
                continue  # an envelope carried one meanwhile
            self._last_beat = self._mono()
            try:
                reply = self._link.exchange("/v1/heartbeat", encode(self.beat()), min(self._timing.timeout, interval))
                if reply.fault is not None:
                    self._link.note("heartbeat", reply)  # a missed heartbeat is what the bot watches for
            except Exception:  # noqa: BLE001 - a bug must not end the heartbeats
                self._link.complain("heartbeat-bug",
                                    "msmon: the heartbeat thread hit a bug (please report it); it goes on")

    # -- the end -------------------------------------------------------------------------------------

    def stop(self) -> None:
        """No heartbeat after this one (one in flight is waited for by `join`)."""
        with self._lock:
            self._stopped.set()

    def join(self, timeout: float) -> None:
        self.thread.join(timeout=timeout)

    def final(self) -> bytes:
        """The final heartbeat, encoded: the job ended normally (the bot then raises no job_gone)."""
        return encode(msgspec.structs.replace(self.beat(), final=True))


__all__ = ["Heartbeats"]
