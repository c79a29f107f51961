"""The transport's timings, each within its bounds whoever built the transport: Event.wait(1e12) raises
OverflowError in the thread that waits, and a poll wait the bot refuses would end chat commands.
"""

from __future__ import annotations

import logging
import math
import random
from dataclasses import dataclass

log = logging.getLogger("msmon")


def _bounded(name: str, value: float, lo: float, hi: float, default: float) -> float:
    """`value` within [lo, hi] (NaN: `default`), with a warning when it had to be changed."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        v = math.nan
    if v != v:
        log.warning("msmon: BotTransport %s %r is not a number; using %g", name, value, default)
        return default
    if not lo <= v <= hi:
        log.warning("msmon: BotTransport %s %g is outside [%g, %g]; using %g", name, v, lo, hi, min(max(v, lo), hi))
    return min(max(v, lo), hi)


@dataclass(frozen=True)
class Timing:
    """Every wait of the transport's threads, in seconds."""

    heartbeat_interval: float = 5.0
    timeout: float = 5.0  # one request's
    flush_interval: float = 1.0
    probe_interval: float = 1.0
    poll_wait: float = 20.0  # how long the bot may hold a command poll
    backoff: tuple[float, float] = (0.5, 30.0)  # the first retry's wait and the longest

    @classmethod
    def bounded(cls, heartbeat_interval: float, timeout: float, flush_interval: float, probe_interval: float,
                poll_wait: float, backoff: tuple[float, float]) -> Timing:
        """The timings given, each brought within its bounds (with a warning for each that had to be)."""
        return cls(heartbeat_interval=_bounded("heartbeat_interval", heartbeat_interval, 0.05, 3600.0, 5.0),
                   timeout=_bounded("timeout", timeout, 0.1, 600.0, 5.0),
                   flush_interval=_bounded("flush_interval", flush_interval, 0.001, 3600.0, 1.0),
                   probe_interval=_bounded("probe_interval", probe_interval, 0.05, 60.0, 1.0),
                   poll_wait=_bounded("poll_wait", poll_wait, 0.0, 3600.0, 20.0),
                   backoff=(_bounded("backoff[0]", backoff[0], 0.01, 3600.0, 0.5),
                            _bounded("backoff[1]", backoff[1], 0.01, 3600.0, 30.0)))

    def retry_delay(self, failures: int, rng: random.Random) -> float:
        """The wait after `failures` failures in a row of a request thread: exponential, bounded, jittered."""
        lo, hi = self.backoff
        return min(hi, lo * 2.0 ** min(failures - 1, 64)) * (0.5 + rng.random())


__all__ = ["Timing"]
