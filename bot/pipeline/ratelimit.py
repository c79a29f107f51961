"""Rate limits: token buckets per channel (Slack allows about 1 message/s), per run and in all."""

from __future__ import annotations

import msgspec

from bot.pipeline.flow import Due, Round


class TokenBucket:
    __slots__ = ("rate", "burst", "tokens", "at")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate, self.burst, self.tokens, self.at = rate, burst, burst, now

    def _refill(self, now: float) -> None:
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now

    def wait(self, now: float) -> float:
        """Seconds until a token is free (0: now)."""
        self._refill(now)
        return 0.0 if self.tokens >= 1.0 else (1.0 - self.tokens) / self.rate

    def take(self, now: float) -> None:
        self._refill(now)
        self.tokens -= 1.0


class RateLimiter:
    """A message may go when its channel's, its run's and the global bucket all have a token."""

    def __init__(self, per_channel: float, per_run: float, global_rate: float, burst: int,
                 max_keys: int = 10_000) -> None:
        self.per_channel, self.per_run, self.global_rate, self.burst = per_channel, per_run, global_rate, burst
        self.max_keys = max_keys
        self._buckets: dict[tuple[str, str], TokenBucket] = {}

    def _bucket(self, kind: str, key: str, rate: float, now: float) -> TokenBucket:
        b = self._buckets.get((kind, key))
        if b is None:
            if len(self._buckets) >= self.max_keys:  # bounded: forget the fullest (idlest) buckets
                for k in [k for k, v in self._buckets.items() if v.wait(now) == 0.0][: self.max_keys // 10 or 1]:
                    del self._buckets[k]
            b = self._buckets[(kind, key)] = TokenBucket(rate, self.burst, now)
        return b

    def wait(self, channel: str, run_id: str, now: float) -> float:
        """Seconds to wait before sending; 0 means send now (and the tokens are taken)."""
        buckets = (self._bucket("channel", channel, self.per_channel, now),
                   self._bucket("run", run_id, self.per_run, now),
                   self._bucket("global", "", self.global_rate, now))
        delay = max(b.wait(now) for b in buckets)
        if delay == 0.0:
            for b in buckets:
                b.take(now)
        return delay


def stage(rnd: Round, d: Due) -> Due:
    """The delivery stage: how long the group waits. Until its lane's Retry-After has passed (a 429
    earlier in this round paces the rest of its lane), else until its channel's, its run's and the
    global bucket have a token (taken when it may go now). A receiver that keeps its platform's rate
    itself (a group robot: its budget holds a message for its next summary without posting) takes no
    token: a held message's retry would spend the bucket that its summary needs."""
    head = d.rows[0]
    paced = rnd.scheduler.paced_until(head.lane, d.at) - d.at
    if paced <= 0.0 and head.receiver in rnd.self_paced:
        return d
    wait = paced if paced > 0.0 else rnd.limiter.wait(head.channel, head.run_id, d.at)
    return msgspec.structs.replace(d, wait=wait) if wait > 0.0 else d
