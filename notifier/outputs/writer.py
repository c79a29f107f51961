"""A background thread that owns all file I/O, so a slow disk never stalls a training step."""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import Protocol

from msmon.contract.wire import Sample

log = logging.getLogger("msmon")


class Sink(Protocol):
    name: str

    def write(self, s: Sample) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


class BackgroundWriter:
    """`put` only appends to a bounded deque (no lock, no syscall); a daemon thread drains it.

    When the queue is full the sample is dropped and counted: training is never held up for
    a log file. A sink that raises is reported once in the log and kept for the next sample.
    """

    def __init__(self, sinks: list[Sink], capacity: int = 10_000, period: float = 0.5) -> None:
        self.sinks = sinks
        self.capacity = capacity
        self.period = period
        self.dropped = 0
        self._queue: deque[Sample] = deque()
        self._queued = 0  # samples accepted by put(); only the training thread writes it
        self._done = 0  # samples written and flushed; guarded by _cond
        self._cond = threading.Condition()
        self._wake = threading.Event()
        self._stop = False
        self._failed: set[str] = set()
        self._thread = threading.Thread(target=self._run, name="msmon-writer", daemon=True)
        self._thread.start()

    def put(self, s: Sample) -> None:
        if len(self._queue) >= self.capacity:
            self.dropped += 1
            return
        self._queue.append(s)
        self._queued += 1

    def _drain(self) -> None:
        with self._cond:
            q = self._queue
            n = 0
            while q:
                s = q.popleft()
                n += 1
                for sink in self.sinks:
                    try:
                        sink.write(s)
                    except Exception as exc:  # noqa: BLE001 - a sink must never take training down
                        self._report(sink, exc)
            if n:
                for sink in self.sinks:
                    try:
                        sink.flush()
                    except Exception as exc:  # noqa: BLE001
                        self._report(sink, exc)
            self._done += n
            self._cond.notify_all()

    def _report(self, sink: Sink, exc: Exception) -> None:
        if sink.name not in self._failed:
            self._failed.add(sink.name)
            log.error("msmon: writing %s failed (%s: %s); training continues, later rows may be missing. "
                      "Check the path and free disk space.", sink.name, type(exc).__name__, exc)

    def _run(self) -> None:
        while not self._stop:
            self._wake.wait(self.period)
            self._wake.clear()
            self._drain()

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until everything put so far is written and flushed; False on timeout."""
        target = self._queued
        self._wake.set()
        with self._cond:
            return self._cond.wait_for(lambda: self._done >= target, timeout)

    def close(self) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=10.0)
        self._drain()
        for sink in self.sinks:
            try:
                sink.close()
            except Exception as exc:  # noqa: BLE001
                self._report(sink, exc)
        if self.dropped:
            log.warning("msmon: %d samples were not written to CSV/TensorBoard because the writer fell behind",
                        self.dropped)
