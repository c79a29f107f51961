"""When each outbox row is tried again, and when it is given up: the delivery schedule as pure code.

No SQLite, no sockets, no clock of its own: `Scheduler` takes typed rows (`OutboxRow`), the time and
what the receiver did (an `Outcome`), and answers a `Verdict` that the store writes back. The outbox
worker (bot/delivery/worker.py) is the edge that reads rows, calls receivers and applies verdicts.

- Every failure belongs to its row group only: it is counted (attempts, last error, next try) and
  retried after a jittered exponential backoff, `[d/2, d]` with `d = base * 2**(attempts-1)` capped at
  `cap`, so delays grow and stay bounded.
- A `Retry-After` (Slack's 429, a 503 page) is honoured for the row and paces its lane (receiver and
  channel): no other row goes to that channel before it has passed. Due order: rows never tried
  first, then retries, each oldest first.
- After `max_attempts` failed tries (`max_error_attempts` when the receiver raised something that is
  not a delivery error: a bug or data it cannot handle; at once for a payload that cannot be decoded
  and for a refusal the platform documents as permanent: a bad signature, a removed robot)
  the group is a dead letter: kept, reported once, never tried again by this process.
- An outage is not a poison row: while a lane is down (another group failed on it too since its
  last success, or nothing got through on it since the row was queued, for up to `max_hold`) a
  delivery error does not bring a row nearer its dead-letter bound; the rows keep retrying at the longest backoff they
  reached (at most `cap`, 30 s by default) and all go when the receiver is back (a missing token
  fixed by a restart, Slack down for an hour). A lane that looks down is probed by one group a
  round (a new message tries once, the retries wait for the probe); the first success on it makes
  its other waiting rows due at once (`Verdict.reopened`), so a recovered receiver has the
  still-firing alerts within a probe interval, as Alertmanager's next flush would send them.
- A group whose message is already out (`posted_ref`) only has its follow-up left (the chart in the
  thread): a retry never posts the text again. When the follow-up is hopeless the text stands: the
  rows are delivered with the error kept.
"""

from __future__ import annotations

import dataclasses
import math
import random as _random
from collections.abc import Callable, Iterable
from typing import Literal

import msgspec

GroupKey = tuple[str, str, str, str]  # receiver, channel, key, kind: rows sent together as one message
Lane = tuple[str, str]  # receiver, channel: what a Retry-After paces

FailureKind = Literal["transient", "rate_limited", "error", "undecodable", "permanent"]


class OutboxRow(msgspec.Struct):
    """One row of the outbox table (the store's columns, typed)."""

    id: int
    created_at: float
    receiver: str
    channel: str
    kind: str  # alert | repeat | resolve | note
    key: str
    run_id: str
    payload: str
    attempts: int = 0
    next_at: float = 0.0
    delivered_at: float | None = None
    error: str | None = None
    dead_at: float | None = None
    posted_ref: str | None = None  # the message is out (its ts); only the follow-up steps are left

    @property
    def group(self) -> GroupKey:
        return (self.receiver, self.channel, self.key, self.kind)

    @property
    def lane(self) -> Lane:
        return (self.receiver, self.channel)

    @property
    def pending(self) -> bool:
        return self.delivered_at is None and self.dead_at is None


@dataclasses.dataclass(frozen=True)
class Sent:
    """The receiver said OK to every step."""


@dataclasses.dataclass(frozen=True)
class Failed:
    """A step failed. `posted_ref`: the message itself went out (its reference) before the failure."""

    kind: FailureKind
    error: str
    retry_after: float | None = None
    posted_ref: str | None = None


@dataclasses.dataclass(frozen=True)
class Deferred:
    """The bot's own rate limiter said wait: not an attempt, no error."""

    wait: float


Outcome = Sent | Failed | Deferred


@dataclasses.dataclass(frozen=True)
class Policy:
    base: float = 1.0  # seconds before the first retry (at most; at least half of it)
    cap: float = 30.0  # longest backoff: how long a recovered receiver may wait for the next probe
    max_attempts: int = 10  # tries before a delivery error makes a dead letter (about 3 min at the defaults)
    max_error_attempts: int = 3  # tries when the receiver raised something else (a bug, data it cannot take)
    max_retry_after: float = 900.0  # longest Retry-After honoured
    max_hold: float = 6 * 3600.0  # longest a message waits for a lane where nothing got through since it was queued

    def bounds(self, attempts: int) -> tuple[float, float]:
        """The (shortest, longest) backoff after the `attempts`-th failed try (1 = the first)."""
        d = min(self.base * 2.0 ** min(max(attempts, 1) - 1, 60), self.cap)
        return d / 2.0, d

    def backoff(self, attempts: int, u: float) -> float:
        """The backoff after the `attempts`-th failed try, `u` uniform in [0, 1) (equal jitter)."""
        lo, hi = self.bounds(attempts)
        return lo + (hi - lo) * min(max(u, 0.0), 1.0)

    def limit(self, kind: FailureKind) -> int:
        if kind in ("undecodable", "permanent"):
            return 1
        return self.max_error_attempts if kind == "error" else self.max_attempts

    @property
    def longest_delay(self) -> float:
        return max(self.cap, self.max_retry_after)


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What becomes of a row group after an outcome; the store writes these fields to each row."""

    state: Literal["delivered", "retry", "dead", "deferred"]
    attempts: int
    next_at: float
    delay: float = 0.0
    error: str | None = None
    posted_ref: str | None = None
    reopened: bool = False  # delivered on a lane that was down: its other waiting rows may go now

    def applied(self, row: OutboxRow, now: float) -> OutboxRow:
        """`row` as it stands after this verdict (what the store's UPDATE does)."""
        return msgspec.structs.replace(
            row, attempts=self.attempts, next_at=self.next_at, error=self.error, posted_ref=self.posted_ref,
            delivered_at=now if self.state == "delivered" else row.delivered_at,
            dead_at=now if self.state == "dead" else row.dead_at)


@dataclasses.dataclass(frozen=True)
class Plan:
    """The steps a group's next try runs: post the message (and then its follow-ups), or, when the
    message is already out as `ref`, only the follow-ups."""

    post: bool
    ref: str | None = None


class Scheduler:
    """Due order, backoff, Retry-After pacing per lane and dead letters. `random`: uniform [0, 1)."""

    def __init__(self, policy: Policy | None = None, random: Callable[[], float] = _random.random) -> None:
        self.policy = policy or Policy()
        self.random = random
        self._paced: dict[Lane, float] = {}  # lane -> not before (a Retry-After)
        self._failing: dict[Lane, set[GroupKey]] = {}  # groups failed on the lane since its last success (<= 2)
        self._ok: dict[Lane, float] = {}  # lane -> its last success (this process)

    def paced_until(self, lane: Lane, now: float) -> float:
        """When `lane` may be sent to again (<= now: at once)."""
        until = self._paced.get(lane, now)
        if until <= now:
            self._paced.pop(lane, None)
            return now
        return until

    def groups(self, due: Iterable[OutboxRow], now: float) -> list[GroupKey]:
        """The groups to try now: pending rows due by `now` whose lane is not paced; rows never tried
        first, then the retries, each oldest first (a row that keeps failing, and keeps re-pacing its
        lane with a Retry-After, never holds back the fresh alerts behind it)."""
        order: dict[GroupKey, None] = {}
        probed: set[Lane] = set()  # lanes that look down and have a group in this round: their retries wait
        for row in sorted(due, key=lambda r: (r.attempts > 0, r.id)):
            if row.pending and row.next_at <= now and self.paced_until(row.lane, now) <= now:
                if row.group in order or (row.attempts > 0 and row.lane in probed):
                    continue
                order[row.group] = None
                if self._failing.get(row.lane):
                    probed.add(row.lane)
        return list(order)

    def down(self, lane: Lane) -> bool:
        """Whether `lane` failed since its last success (its groups go one at a time)."""
        return bool(self._failing.get(lane))

    def plan(self, rows: Iterable[OutboxRow]) -> Plan:
        ref = next((r.posted_ref for r in rows if r.posted_ref is not None), None)
        return Plan(post=ref is None, ref=ref)

    def after(self, rows: list[OutboxRow], outcome: Outcome, now: float) -> Verdict:
        """The verdict for a group (its rows share one fate) after `outcome` at `now`."""
        attempts = max((r.attempts for r in rows), default=0)
        ref = self.plan(rows).ref
        lane, group = rows[0].lane, rows[0].group
        if isinstance(outcome, Sent):
            reopened = bool(self._failing.pop(lane, None))
            self._ok[lane] = now
            return Verdict("delivered", attempts, now, posted_ref=ref, reopened=reopened)
        if isinstance(outcome, Deferred):
            wait = min(max(outcome.wait, 0.0), self.policy.longest_delay)
            return Verdict("deferred", attempts, now + wait, wait, "rate limited (bot)", ref)
        attempts += 1
        ref = outcome.posted_ref or ref
        error = outcome.error[:500]
        limit = self.policy.limit(outcome.kind)
        if outcome.kind in ("transient", "rate_limited"):
            failing = self._failing.setdefault(lane, set())
            since = min(r.created_at for r in rows)
            if failing - {group} or (self._ok.get(lane, -math.inf) < since and now - since < self.policy.max_hold):
                # the lane is down (others fail too, or nothing got through since this was queued, for up to
                # max_hold: a lone message that never goes anywhere ends as a dead letter): not this row's
                # fault, no nearer to a dead letter
                attempts = min(attempts, limit - 1)
            if len(failing) < 2:
                failing.add(group)
        if attempts >= limit:
            if ref is not None:  # the text is out; what failed is only its follow-up: keep the message
                return Verdict("delivered", attempts, now, error=f"gave up after {attempts} tries: {error}",
                               posted_ref=ref)
            self._failing.get(lane, set()).discard(group)  # gone: no longer a sign the lane is down
            return Verdict("dead", attempts, now, error=error, posted_ref=ref)
        delay = self.policy.backoff(attempts, self.random())
        if outcome.retry_after is not None and outcome.retry_after > 0:
            wait = min(outcome.retry_after, self.policy.max_retry_after)
            delay = max(delay, wait)
            self._paced[lane] = max(self._paced.get(lane, now), now + wait)
        return Verdict("retry", attempts, now + delay, delay, error, ref)
