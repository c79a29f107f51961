"""The configured actions a multi-rank run's rule asks the bot to apply on every rank: queued by the training
thread, sent by a thread of their own (`POST /v1/actions/request`), retried with backoff until the bot
answers; what it answers is the command every rank then polls.
"""

from __future__ import annotations

import logging
import random
import threading
from collections import deque
from collections.abc import Callable

import msgspec

from msmon.common.retry import retry_after
from msmon.contract.wire import ActionRequest, encode

from ..sendq.faults import Fault
from .link import ADVICE, Link, Origin
from .timing import Timing

log = logging.getLogger("msmon")

_ASKS = 64  # configured actions waiting for the bot at most (a rule's actions fire once per alert)


class Asks:
    """The requests waiting for the bot, the thread that sends them (started by the first), and how many were lost."""

    def __init__(self, link: Link, origin: Origin, timing: Timing, stop: threading.Event, rng: random.Random,
                 clock: Callable[[], float]) -> None:
        self._link, self._origin, self._timing, self._stop, self._rng = link, origin, timing, stop, rng
        self._clock = clock
        self._asks: deque[ActionRequest] = deque()  # configured actions for the bot to apply on every rank
        self._asked = threading.Event()
        self.thread: threading.Thread | None = None
        self.lost = 0  # requests refused by the bot, or still unsent at close (each logged)

    def ask(self, req: ActionRequest) -> None:
        """Queue a request (O(1), on the training thread); the thread starts the first time."""
        if len(self._asks) >= _ASKS:
            self.lost += 1
            self._link.complain("asks-full", f"msmon: run {self._origin.run_id} device {self._origin.device}: "
                                             f"{_ASKS} configured actions wait for the bot already; newer ones are "
                                             "dropped (is the bot down?)")
            return
        self._asks.append(req if req.project is not None else
                          msgspec.structs.replace(req, project=self._origin.project))
        if self.thread is None:
            self.thread = threading.Thread(target=self._loop, name="msmon-asks", daemon=True)
            self.thread.start()
        self._asked.set()

    def _loop(self) -> None:
        failures = 0
        while not self._stop.is_set():
            if not self._asks:
                self._asked.wait(1.0)
                self._asked.clear()
                continue
            try:
                wait = self._once(self._asks[0])
            except Exception:  # noqa: BLE001 - a bug must not end the requests
                self._link.complain("ask-bug",
                                    "msmon: the action request thread hit a bug (please report it); it goes on")
                wait = None
            if wait == 0.0:
                failures = 0
                continue
            failures += 1
            delay = self._timing.retry_delay(failures, self._rng)
            self._stop.wait(min(wait if wait is not None else delay, self._timing.backoff[1] * 2))

    def _once(self, req: ActionRequest) -> float | None:
        """Send the oldest request; 0.0 once the bot answered it (taken, or refused and logged)."""
        reply = self._link.exchange("/v1/actions/request", encode(req), self._timing.timeout)
        where = f"run {self._origin.run_id} step {req.step} device {self._origin.device}"
        if reply.fault is None:
            self._asks.popleft()
            try:
                answer = msgspec.json.decode(reply.body)
                cmd = answer["command"]
                log.warning("msmon: [%s] %s (rule %s %s): the bot queued it as %s; every rank applies it at step %s",
                            where, req.action, req.rule, req.severity.value, cmd["id"], cmd["apply_step"])
            except (msgspec.DecodeError, KeyError, TypeError):
                log.warning("msmon: [%s] %s (rule %s): the bot took the request", where, req.action, req.rule)
            return 0.0
        if reply.status == 409:  # the run's first report has not reached the bot yet: ask again
            self._link.note("action request", reply)
            return retry_after(reply.retry_after, self._clock(), self._timing.backoff[1])
        if reply.fault.refuses_data or reply.fault is Fault.AUTH:  # an older bot without the route: 404, rejected
            self._asks.popleft()
            self.lost += 1
            log.error("msmon: [%s] the bot at %s refused the configured action %s of rule %s (HTTP %s: %s); it is NOT "
                      "applied on any rank. %s", where, self._link.public_url, req.action, req.rule, reply.status,
                      reply.detail, ADVICE[reply.fault])
            return 0.0
        self._link.note("action request", reply)
        return retry_after(reply.retry_after, self._clock(), self._timing.backoff[1])

    def close(self) -> None:
        """The requests still unsent at close are lost: counted, and said."""
        if self._asks:
            self.lost += len(self._asks)
            log.error("msmon: run %s device %s: %d configured action(s) never reached the bot at %s (%s) and are not "
                      "applied", self._origin.run_id, self._origin.device, len(self._asks), self._link.public_url,
                      ", ".join(f"{r.action} of rule {r.rule} at step {r.step}" for r in self._asks))


__all__ = ["Asks"]
