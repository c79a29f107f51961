"""What the ingest sheds when the bot falls behind: ERRORs go first.

The signal is measured, not guessed: how late the event loop runs a timer (its lag; bot/app.py samples it).
A level is entered at once when the lag reaches its threshold, and left one level at a time only after the
lag stayed under half that threshold for `cool` seconds (hysteresis: a bot on the edge does not flap).

    level      entered at lag >=    left after `cool` s under   sheds (counted, never an ERROR)
    NORMAL     -                    -                           nothing
    SAMPLES    samples_lag          samples_lag / 2             metric samples (their steps, liveness and events
                                                                still kept), and charts (a picture of samples: an
                                                                ERROR's text goes at once and says why)
    WARNINGS   warnings_lag         warnings_lag / 2            + WARNING events

Pure: an injected clock, no I/O; what was shed is counted here (`ShedCount`) and said by the caller once per
change of level (`Overload.say`), never per request.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import statistics
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
ERROR_MARK = b'"severity":"ERROR"'  # an ERROR event in an envelope as the wire encodes it (msmon/contract/wire.py)

WINDOW = 60.0  # seconds of "shed in the last minute"


class Level(enum.IntEnum):
    NORMAL = 0
    SAMPLES = 1
    WARNINGS = 2

    @property
    def sheds(self) -> str:
        return ("nothing", "samples", "samples and WARNINGs")[self]


@dataclasses.dataclass(frozen=True)
class Step:
    """One row of the table: `level` is entered when the lag reaches `enter`, left when under `leave`."""

    level: Level
    enter: float
    leave: float


def table(samples_lag: float, warnings_lag: float) -> tuple[Step, ...]:
    """The levels above NORMAL, lowest first."""
    return (Step(Level.SAMPLES, samples_lag, samples_lag / 2),
            Step(Level.WARNINGS, max(warnings_lag, samples_lag), max(warnings_lag, samples_lag) / 2))


class ShedCount:
    """What was shed, by kind ("samples", "warnings"): in total and over the last WINDOW seconds."""

    def __init__(self) -> None:
        self.total: dict[str, int] = {"samples": 0, "warnings": 0}
        self._recent: collections.deque[tuple[float, str, int]] = collections.deque()

    def add(self, kind: str, n: int, now: float) -> None:
        if n:
            self.total[kind] += n
            self._recent.append((now, kind, n))

    def last_minute(self, now: float) -> dict[str, int]:
        while self._recent and self._recent[0][0] <= now - WINDOW:
            self._recent.popleft()
        out = {"samples": 0, "warnings": 0}
        for _, kind, n in self._recent:
            out[kind] += n
        return out


class Median:
    """The median of the last `n` lags sampled: a loop busy for a while, not one slow request (a big page, a prune)
    nor the bot's own start (the window starts full of zeros)."""

    def __init__(self, n: int) -> None:
        self._last: collections.deque[float] = collections.deque([0.0] * n, maxlen=n)

    def __call__(self, lag: float) -> float:
        self._last.append(lag)
        return statistics.median(self._last)


class Overload:
    """The level from the lag observed; `observe` answers the new level on a change, else None."""

    def __init__(self, steps: tuple[Step, ...], cool: float, clock: Callable[[], float]) -> None:
        self.steps, self.cool, self.clock = steps, cool, clock
        self.level = Level.NORMAL
        self.lag = 0.0  # the last observed
        self.shed = ShedCount()
        self._calm_since: float | None = None  # since when the lag is under the current level's `leave`

    def observe(self, lag: float) -> Level | None:
        now, self.lag = self.clock(), lag
        target = max((s.level for s in self.steps if lag >= s.enter), default=Level.NORMAL)
        if target > self.level:  # up at once, as far as the lag says
            self.level, self._calm_since = target, None
            return target
        if self.level == Level.NORMAL or lag >= self.steps[self.level - 1].leave:
            self._calm_since = None
            return None
        if self._calm_since is None:
            self._calm_since = now
            return None
        if now - self._calm_since < self.cool:
            return None
        self.level = Level(self.level - 1)  # down one level; the next one waits its own `cool`
        self._calm_since = now if self.level > Level.NORMAL else None
        return self.level

    def count(self, kind: str, n: int) -> None:
        self.shed.add(kind, n, self.clock())

    def say(self) -> str:
        """The line for the log at a change of level."""
        last = self.shed.last_minute(self.clock())
        figures = f"{last['samples']} samples and {last['warnings']} WARNINGs shed in the last minute"
        if self.level == Level.NORMAL:
            return f"ingest no longer overloaded: shedding nothing ({figures})"
        return (f"ingest overloaded (the event loop runs late): shedding {self.level.sheds} ({figures}); "
                "ERRORs go first")

    def status(self) -> dict[str, object]:
        """For /healthz: the level, and what was shed in total and in the last minute."""
        return {"level": self.level.name.lower(), "sheds": self.level.sheds, "lag": round(self.lag, 4),
                "shed_total": dict(self.shed.total),
                "shed_last_minute": self.shed.last_minute(self.clock())}


def errors_first(batch: list[T], run_of: Callable[[T], str], data_of: Callable[[T], bytes]) -> list[T]:
    """A batch of messages taken together (NATS's fetch), those carrying an ERROR first; the rest in order. A run's
    own messages keep their order: an ERROR goes ahead only of other runs' messages (a WARNING of the same alert
    before it stays before it)."""
    first: list[T] = []
    rest: list[T] = []
    waiting: set[str] = set()  # runs with a message left in `rest`
    for item in batch:
        run = run_of(item)
        if run not in waiting and ERROR_MARK in data_of(item):
            first.append(item)
        else:
            rest.append(item)
            waiting.add(run)
    return first + rest
