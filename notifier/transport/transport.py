"""Job -> bot transport: `BotTransport`, the façade the Monitor and job control call, which builds the parts
of the flow and hands each call to the part that does it; nothing here decides anything, and nothing
the training thread calls blocks on the network or raises.

The flow, one module each:

* `sender.py`: the training thread's inbox, the pure send queue (`notifier.sendq`) under one lock,
  and the sender thread that POSTs envelopes, applies each answer, reports faults and keeps the spool;
* `spool.py`: the spool file (one JSONL file per run and device, one `SpoolRecord` a line), sent
  first by a job that starts with the same run id and device;
* `heartbeat.py`: what a heartbeat says, and the thread that sends one when no envelope did;
* `poller.py`: the command long-poll and its cursor; `asks.py`: a multi-rank run's
  configured actions for the bot to apply on every rank;
* `link.py`: every request as a `Reply` (over `notifier.http`, or a `Backend` such as NATS), each
  kind of trouble said once; `timing.py`: every wait, bounded.

Standard library and msgspec only: nothing heavy on the notifier's import path.
"""

from __future__ import annotations

import atexit
import random
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from msmon.contract.wire import ActionRequest, ActionResult, Command, Event, RingCheckpoint, Sample

from ..sendq import Limits, SendQueue
from .asks import Asks
from .heartbeat import Heartbeats
from .link import Backend, Link, Origin, Reply, check_url
from .poller import CommandPoller
from .sender import Sender, batch_key, envelope_body
from .spool import SPOOL_MAX_AGE, Spool, SpoolRecord, open_spool
from .timing import Timing


def _close_at_exit(ref: weakref.ReferenceType[BotTransport]) -> None:
    """A job that ends without close() (an exception out of the training loop) still spools what
    the bot has not taken: the daemon threads would just vanish with it."""
    t = ref()
    if t is not None and not t._sending.closed:
        t.close(timeout=2.0)


class BotTransport:
    """Delivers a job's events, samples, action results and heartbeats to the msmon bot."""

    def __init__(self, url: str, run_id: str, device: str = "0", token: str | None = None, *,
                 project: str = "default", labels: dict[str, str] | None = None, spool_dir: str = "./msmon_spool",
                 spool_max_bytes: int = 64 << 20, max_queue: int = 10_000, max_errors: int = 10_000,
                 batch_max: int = 500, batch_max_bytes: int = 1 << 20, flush_interval: float = 1.0,
                 heartbeat_interval: float = 5.0, timeout: float = 5.0, backoff: tuple[float, float] = (0.5, 30.0),
                 probe_interval: float = 1.0, rank: int | None = None, world: int | None = None,
                 host: str | None = None, on_commands: Callable[[list[Command]], None] | None = None,
                 poll_wait: float = 20.0, clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic, rng: random.Random | None = None,
                 backend: Backend | None = None) -> None:
        # `backend`: where requests go instead of HTTP to `url` (notifier/nats_transport.py); it checks its URL
        self._link = Link(url, token, backend, run_id)
        self.origin = o = Origin.of(run_id, device, project, labels, rank, world, host)
        self.url, self.run_id, self.device = self._link.url, o.run_id, o.device
        self.project, self.labels, self.rank, self.world, self.host = o.project, o.labels, o.rank, o.world, o.host
        self.timing = t = Timing.bounded(heartbeat_interval, timeout, flush_interval, probe_interval, poll_wait,
                                         backoff)
        self.limits = Limits(max_queue=max_queue, max_bytes=spool_max_bytes, max_high=max_errors,
                             batch_max=batch_max, batch_max_bytes=batch_max_bytes, flush_interval=t.flush_interval,
                             backoff=t.backoff, probe_interval=t.probe_interval)
        rng = rng or random.Random()
        self._stop = threading.Event()  # close(): the sender, the poll and the requests end
        self._beats = Heartbeats(self._link, o, t, clock, monotonic)
        self.spool = open_spool(spool_dir, run_id, o.device)
        self._sending = Sender(self._link, o, t, self.limits, rng, self._beats, self.spool, self._stop, clock,
                               monotonic)
        self._commands = CommandPoller(self._link, o, t, self._stop, rng, clock, monotonic, on_commands)
        self._asks = Asks(self._link, o, t, self._stop, rng, clock)
        self._mono = monotonic
        self._sending.start(self)
        self._beats.start()
        atexit.register(_close_at_exit, weakref.ref(self))

    # -- what tests and the status line read ----------------------------------------------------

    @property
    def dropped(self) -> dict[str, int]:
        """Items dropped since start, by class (errors, actions, resolutions, warnings, samples)."""
        return self._sending.dropped

    @property
    def delivered(self) -> int:
        return self._sending.queue.delivered

    @property
    def connected(self) -> bool | None:
        return self._sending.queue.connected

    def stats(self) -> dict[str, Any]:
        return self._sending.stats()

    @property
    def asks_lost(self) -> int:
        """Configured actions refused by the bot, or still unsent at close (each logged)."""
        return self._asks.lost

    # The heartbeat's state, as the heartbeat (its one owner) has it
    @property
    def proc(self) -> str:
        return self._beats.proc

    @property
    def last_step(self) -> int | None:
        return self._beats.last_step

    @property
    def paused(self) -> bool:
        return self._beats.paused

    @property
    def total_steps(self) -> int | None:
        return self._beats.total_steps

    @property
    def target_loss(self) -> float | None:
        return self._beats.target_loss

    @property
    def checkpoints(self) -> list[RingCheckpoint] | None:
        return self._beats.checkpoints

    @property
    def attempt(self) -> int | None:
        return self._beats.attempt

    # The bounded timings
    @property
    def heartbeat_interval(self) -> float:
        return self.timing.heartbeat_interval

    @property
    def timeout(self) -> float:
        return self.timing.timeout

    @property
    def backoff(self) -> tuple[float, float]:
        return self.timing.backoff

    @property
    def poll_wait(self) -> float:
        """How long the bot may hold a command poll (set: the next polls')."""
        return self._commands.wait

    @poll_wait.setter
    def poll_wait(self, seconds: float) -> None:  # tests/bot/runs/test_runs_and_attempts.py: no config key has it
        self._commands.set_wait(seconds)

    @property
    def on_commands(self) -> Callable[[list[Command]], None] | None:
        return self._commands.on_commands

    # The parts' threads and the sender's queue, for tests
    @property
    def _sender(self) -> threading.Thread | None:
        return self._sending.thread

    @property
    def _beater(self) -> threading.Thread:
        return self._beats.thread

    @property
    def _poller(self) -> threading.Thread | None:
        return self._commands.thread

    @property
    def _q(self) -> SendQueue:
        return self._sending.queue

    def _persist(self) -> None:
        self._sending.persist()

    def listen(self, on_commands: Callable[[list[Command]], None]) -> None:
        """Take chat commands: long-poll the bot for them from a thread of their own and hand each
        batch to `on_commands` (which must only queue them: it runs on that thread)."""
        self._commands.listen(on_commands)

    # -- the training thread: O(1), never blocks on the network, never raises --------------------

    def event(self, ev: Event) -> None:
        self._sending.put(ev)

    def sample(self, s: Sample) -> None:
        """A sampled step's metrics, and the step the next heartbeat reports."""
        self._beats.step(s.step)
        self._sending.put(s)

    def plan(self, total_steps: int | None, target_loss: float | None) -> None:
        """The run's plan from its config, sent with every heartbeat (the bot's forecast and progress)."""
        self._beats.plan(total_steps, target_loss)

    def ring(self, checkpoints: list[RingCheckpoint], attempt: int) -> None:
        """The job's health checkpoints and its attempt, sent with every heartbeat (the bot's `checkpoints`)."""
        self._beats.ring(checkpoints, attempt)

    def new_attempt(self) -> None:
        """A rewind: the bot sees a new attempt of the same run from here on (a fresh process nonce)."""
        self._beats.new_attempt()

    def action(self, r: ActionResult) -> None:
        self._sending.put(r)

    def ask(self, req: ActionRequest) -> None:
        """Ask the bot to have every rank of the run apply a configured action (a multi-rank run's rule
        fired here). O(1) on the training thread; a thread of its own sends it, retrying with backoff
        until the bot answers; what it answers is the command every rank then polls."""
        self._asks.ask(req)

    def progress(self, step: int, paused: bool = False) -> None:
        self._beats.progress(step, paused)

    # -- the end --------------------------------------------------------------------------------

    def flush(self, timeout: float = 10.0) -> bool:
        """Deliver everything now (the sender does, this waits); True if all went out in time."""
        return self._sending.flush(timeout)

    def close(self, timeout: float = 5.0, final: bool = False) -> None:
        """Deliver what is left within `timeout` seconds, or keep it in the spool for the next start;
        returns in time even when the bot hangs (a request in flight is left to its daemon thread).
        `final`: the job ended normally; a last heartbeat says so (the bot then raises no job_gone)."""
        start = self._mono()
        margin = min(0.25, timeout / 4)
        ok = self.flush(max(timeout - margin, 0.0))
        # The heartbeats end first (one in flight is waited for), so the final one is the last this process sends
        # (its number is the highest too: one overtaken in flight never makes the bot think the rank went on).
        self._beats.stop()
        self._beats.join(max(min(self.timing.timeout, timeout - (self._mono() - start)), 0.0))
        if final and ok:
            hb = self._beats.final()
            self._link.exchange("/v1/heartbeat", hb, max(min(self.timing.timeout, timeout - (self._mono() - start)),
                                                         0.1))
        self._sending.close()
        self._stop.set()
        self._sending.wake()

        def left() -> float:
            return max(timeout - margin / 2 - (self._mono() - start), 0.0)

        self._sending.join(left())
        self._beats.join(min(left(), 1.0))
        self._asks.close()
        if self._link.has_backend:
            self._link.close(min(left(), 1.0))
        self._sending.spool_at_exit(ok)


__all__ = ["SPOOL_MAX_AGE", "Backend", "BotTransport", "Reply", "Spool", "SpoolRecord", "batch_key", "check_url",
           "envelope_body"]
