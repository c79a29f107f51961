"""The command long-poll: a thread of its own asks the bot for the chat commands to this run and device and
hands each answer's commands to the job (at-least-once: its cursor moves only once an answer arrived).
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable

import msgspec

from msmon.common.retry import retry_after
from msmon.contract.wire import Command, Poll, PollAnswer, decode, encode

from ..sendq.faults import Fault
from .link import Link, Origin
from .timing import Timing

log = logging.getLogger("msmon")

_AGAIN = 0.25  # the least time between two command polls that brought nothing


class CommandPoller:
    """The cursor, the poll's wait, the job's handler and the thread (started by `listen`)."""

    def __init__(self, link: Link, origin: Origin, timing: Timing, stop: threading.Event, rng: random.Random,
                 clock: Callable[[], float], monotonic: Callable[[], float],
                 on_commands: Callable[[list[Command]], None] | None) -> None:
        self._link, self._origin, self._timing, self._stop, self._rng = link, origin, timing, stop, rng
        self._clock, self._mono = clock, monotonic
        self.on_commands = on_commands
        self.wait = timing.poll_wait  # how long the bot may hold a poll
        self._cursor = 0  # the bot's command sequence number this job has seen up to
        self.thread: threading.Thread | None = None

    def listen(self, on_commands: Callable[[list[Command]], None]) -> None:
        """Hand the commands to `on_commands` from now on; the thread starts the first time."""
        self.on_commands = on_commands
        if self.thread is None:
            self.thread = threading.Thread(target=self._loop, name="msmon-commands", daemon=True)
            self.thread.start()

    def set_wait(self, seconds: float) -> None:
        """How long the bot may hold the next polls."""
        self.wait = seconds

    def _loop(self) -> None:
        """Long-polls the bot for chat commands to this run (at-least-once: the cursor only moves
        once an answer arrived)."""
        failures = 0
        while not self._stop.is_set():
            try:
                wait = self._once()
            except Exception:  # noqa: BLE001 - a bug must not end the command poll
                self._link.complain("poll-bug", "msmon: the command poll hit a bug (please report it); it goes on")
                wait = None
            if wait == 0.0:
                failures = 0
                continue
            if wait == _AGAIN:
                failures = 0
                self._stop.wait(_AGAIN)
                continue
            failures += 1
            delay = self._timing.retry_delay(failures, self._rng)
            self._stop.wait(min(wait if wait is not None else delay, self._timing.backoff[1] * 2))

    def _once(self) -> float | None:
        """One long poll; 0.0 when it worked, else the seconds to wait (None: the usual backoff)."""
        o = self._origin
        poll = Poll(run_id=o.run_id, device=o.device, after=self._cursor, wait=self.wait, project=o.project)
        start = self._mono()
        reply = self._link.exchange("/v1/commands/poll", encode(poll), self.wait + 10.0)
        if reply.fault is not None:
            if reply.fault in (Fault.AUTH, Fault.REJECTED):
                self._link.complain("poll-rejected", f"msmon: run {o.run_id}: the bot refused the command poll "
                                                     f"(HTTP {reply.status}: {reply.detail}); chat commands will not "
                                                     "reach this job. Check the job's token and the bot's version.")
                return 60.0
            self._link.note("command poll", reply)
            return retry_after(reply.retry_after, self._clock(), self._timing.backoff[1])
        try:
            answer = decode(reply.body, PollAnswer)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            self._link.complain("bad-poll", f"msmon: run {o.run_id}: the bot's answer to the command poll cannot be "
                                            f"read ({exc}); is the bot newer than the job's msmon? Commands ignored.")
            return None
        self._cursor = max(self._cursor, answer.cursor)
        self._hand(answer.commands)
        if not answer.commands and self._mono() - start < _AGAIN:
            return _AGAIN  # an empty answer at once: the peer does not long-poll; do not hammer it
        return 0.0

    def _hand(self, cmds: list[Command]) -> None:
        """Hand commands from the bot (a poll's answer) to the job; duplicates are
        expected (at-least-once delivery) and dropped by id where they are applied."""
        if not cmds or self.on_commands is None:
            return
        try:
            self.on_commands(cmds)
        except Exception:  # noqa: BLE001 - the job's handler must not end the thread
            log.exception("msmon: on_commands hook failed")


__all__ = ["CommandPoller"]
