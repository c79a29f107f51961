"""What the ingest sheds when the bot falls behind its own work: ERRORs go first, and nothing but samples, charts and
WARNING firings is ever shed.

The signal is the bot's own backlog, measured, not the machine's contention: how long the oldest piece of work that
waits for the bot has waited (`Backlogs`): a job's ingest request in the bot (HTTP), a JetStream message since the
server stored it (NATS), a chart in the drawing executor. An idle bot on a busy host (its event loop 10 ms late on a
2-core machine at load 8) waits for nothing: it sheds nothing. The event loop's lag is a second signal, counted only
while something waits (a loop held by one handler makes every request wait behind it). Both are the median of the
last 40 samples (2 s): a backlog that lasts, not one slow moment. A level is entered at once when a signal reaches its
threshold, and left one level at a time only after both stayed under half their thresholds for `cool` seconds
(hysteresis: a bot on the edge does not flap).

    level      entered at wait >= (or lag >= with a backlog)     sheds (counted, said once a change of level)
    NORMAL     -                                                  nothing
    SAMPLES    samples_wait (samples_lag)                         metric samples (their steps, liveness and events
                                                                  still kept), and charts (a picture of samples: an
                                                                  ERROR's text goes at once and says why)
    WARNINGS   warnings_wait (warnings_lag)                       + WARNING firings

Never shed: an ERROR, and a resolution of any severity (a WARNING's resolution shed with the WARNINGs would leave its
alert firing for ever).

Pure: an injected clock, no I/O; what was shed is counted here (`ShedCount`) and said by the caller once per
change of level (`Overload.say`), never per request.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import math
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
    """One row of the table: `level` is entered when the wait reaches `enter` (or the lag, with a backlog, reaches
    `lag`), left when both are under half of them."""

    level: Level
    enter: float
    leave: float
    lag: float = math.inf

    def reached(self, wait: float, lag: float, depth: int) -> bool:
        return wait >= self.enter or (depth > 0 and lag >= self.lag)

    def calm(self, wait: float, lag: float) -> bool:
        return wait < self.leave and lag < self.lag / 2


def table(samples_wait: float, warnings_wait: float, samples_lag: float = math.inf, warnings_lag: float = math.inf
          ) -> tuple[Step, ...]:
    """The levels above NORMAL, lowest first."""
    w, lag = max(warnings_wait, samples_wait), max(warnings_lag, samples_lag)
    return (Step(Level.SAMPLES, samples_wait, samples_wait / 2, samples_lag), Step(Level.WARNINGS, w, w / 2, lag))


class Backlog:
    """Work of one kind that waits for the bot: each piece from when it began to wait until it is done."""

    def __init__(self) -> None:
        self._since: dict[int, float] = {}  # token -> since when it waits
        self._next = 0

    def enter(self, since: float) -> int:
        self._next += 1
        self._since[self._next] = since
        return self._next

    def leave(self, token: int) -> None:
        self._since.pop(token, None)

    @property
    def depth(self) -> int:
        return len(self._since)

    def age(self, now: float) -> float:
        """How long the oldest piece waits (0: none waits)."""
        if not self._since:
            return 0.0
        return max(0.0, now - min(self._since.values()))


class Backlogs:
    """The bot's own backlogs by kind ("ingest", "nats", "charts"): the overload's signal."""

    def __init__(self, *kinds: str) -> None:
        self.kinds = {k: Backlog() for k in kinds}

    def __getitem__(self, kind: str) -> Backlog:
        return self.kinds[kind]

    def age(self, now: float) -> float:
        return max((b.age(now) for b in self.kinds.values()), default=0.0)

    @property
    def depth(self) -> int:
        return sum(b.depth for b in self.kinds.values())

    def status(self, now: float) -> dict[str, dict[str, float]]:
        return {k: {"depth": b.depth, "oldest_s": round(b.age(now), 3)} for k, b in self.kinds.items()}


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
    """The median of the last `n` values sampled (lags, waits): a loop busy for a while, not one slow request (a big
    page, a prune) nor the bot's own start (the window starts full of zeros)."""

    def __init__(self, n: int) -> None:
        self._last: collections.deque[float] = collections.deque([0.0] * n, maxlen=n)

    def __call__(self, lag: float) -> float:
        self._last.append(lag)
        return statistics.median(self._last)


class Overload:
    """The level from the backlog observed; `observe` answers the new level on a change, else None."""

    def __init__(self, steps: tuple[Step, ...], cool: float, clock: Callable[[], float]) -> None:
        self.steps, self.cool, self.clock = steps, cool, clock
        self.level = Level.NORMAL
        self.wait, self.lag, self.depth = 0.0, 0.0, 0  # the last observed
        self.shed = ShedCount()
        self.backlogs = Backlogs("ingest", "nats", "charts")  # what waits (the callers enter and leave it)
        self._calm_since: float | None = None  # since when the signals are under the current level's `leave`

    def observe(self, wait: float, lag: float = 0.0, depth: int = 0) -> Level | None:
        """`wait`: how long the oldest waiting work waits (s); `lag`: how late the event loop runs; `depth`: how many
        pieces of work wait (the lag counts only while some do)."""
        now, self.wait, self.lag, self.depth = self.clock(), wait, lag, depth
        target = max((s.level for s in self.steps if s.reached(wait, lag, depth)), default=Level.NORMAL)
        if target > self.level:  # up at once, as far as the signals say
            self.level, self._calm_since = target, None
            return target
        if self.level == Level.NORMAL or not self.steps[self.level - 1].calm(wait, lag):
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
        return (f"ingest overloaded (its oldest waiting work waits {self.wait:.1f} s, {self.depth} waiting; the "
                f"event loop runs {self.lag * 1000:.0f} ms late): shedding {self.level.sheds} ({figures}); ERRORs and "
                "resolutions go first, never shed")

    def status(self) -> dict[str, object]:
        """For /healthz: the level, and what was shed in total and in the last minute."""
        now = self.clock()
        return {"level": self.level.name.lower(), "sheds": self.level.sheds, "lag": round(self.lag, 4),
                "wait": round(self.wait, 4), "backlog": self.backlogs.status(now),
                "shed_total": dict(self.shed.total),
                "shed_last_minute": self.shed.last_minute(now)}


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
