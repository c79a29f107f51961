"""What every chat platform's way in shares: one signed request counts once (Slack's signature, Feishu's
and DingTalk's event ids), in memory and in the store, within each platform's timestamp window."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

WINDOW = 300.0  # seconds: Slack's timestamp window, the default for every platform


class ReplayGuard:
    """The signatures (or event ids) of the chat requests taken inside the timestamp window, so that one signed
    request counts once (a replay of `/msmon scale-lr run 0.5` would otherwise scale the LR again).

    Bounded: at most `capacity` in memory, each forgotten once its timestamp is outside the window (the
    verifier refuses it as stale from then on). `persist(key, forget_after, now)` (the Store's, optional)
    keeps them in the store too and returns False for one already there, so a restart inside the window
    still refuses a replay, and one evicted from memory is still caught; each key carries its own time to
    be forgotten (the Feishu and DingTalk event ids are kept far longer than Slack's 5 minutes, in the
    same table). Pure otherwise: the clock is injected.
    """

    def __init__(self, clock: Callable[[], float] = time.time, window: float = WINDOW, capacity: int = 100_000,
                 persist: Callable[[str, int, float], bool] | None = None) -> None:
        self.clock, self.window, self.capacity, self.persist = clock, window, capacity, persist
        self._seen: OrderedDict[str, int] = OrderedDict()  # signature -> its request timestamp, in arrival order

    def __len__(self) -> int:
        return len(self._seen)

    def first(self, signature: str, ts: int) -> bool:
        """Whether this is the first time this signature is seen (and remember it)."""
        now = self.clock()
        while self._seen:
            oldest_sig, oldest_ts = next(iter(self._seen.items()))
            if oldest_ts + self.window >= now and len(self._seen) < self.capacity:
                break
            del self._seen[oldest_sig]
        if signature in self._seen:
            return False
        self._seen[signature] = ts
        return self.persist is None or self.persist(signature, int(ts + self.window), now)
