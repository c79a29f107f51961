"""The demo's console: one place where the bot's console receiver (on the bot's thread) and the demo's own
lines (the commands and their answers) are printed, so the transcript reads in order.

While a command runs its output is printed as one piece: what the receiver delivers meanwhile is held and
printed after the answer (`held`). Between commands the demo waits until the bot has delivered what it
queued and the receiver has been quiet for a moment (`settle`), so a command's reported result comes right
after the command, before anything later.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO


class Story:
    """A text stream for `ConsoleReceiver(out=...)` that the demo also prints through (`say`)."""

    def __init__(self, out: TextIO | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.out = out if out is not None else sys.stdout
        self.clock = clock
        self._lock = threading.Lock()
        self._held: list[str] | None = None
        self.last_write = clock()

    def write(self, text: str) -> int:
        """The receiver's lines: printed now, or held while a command runs."""
        with self._lock:
            self.last_write = self.clock()
            if self._held is not None:
                self._held.append(text)
            else:
                self.out.write(text)
                self.out.flush()
        return len(text)

    def flush(self) -> None:
        """Nothing: `write` flushes what it prints; held lines wait for `held` to end."""

    def say(self, text: str) -> None:
        """The demo's own line(s), printed at once."""
        with self._lock:
            self.out.write(text + "\n")
            self.out.flush()

    @contextmanager
    def held(self) -> Iterator[None]:
        """Hold the receiver's lines while the block runs; print them after it."""
        with self._lock:
            self._held = []
        try:
            yield
        finally:
            with self._lock:
                text, self._held = "".join(self._held or []), None
                self.out.write(text)
                self.out.flush()

    def settle(self, pending: Callable[[], int], quiet: float = 0.5, timeout: float = 10.0) -> bool:
        """Wait until `pending()` (the bot's outbox depth) is 0 and nothing was written for `quiet` seconds;
        False if that did not happen within `timeout`."""
        deadline = self.clock() + timeout
        while self.clock() < deadline:
            if not pending() and self.clock() - self.last_write >= quiet:
                return True
            time.sleep(0.05)
        return False
