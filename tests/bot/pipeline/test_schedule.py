"""The outbox's schedule (bot/pipeline/schedule.py) as pure code: tables of outcomes and verdicts, and a
hypothesis state machine over any sequence of enqueues, receiver outcomes, clock jumps and restarts.

The verdicts are also written through the real SQLite store, so the model and the store agree.
"""

from __future__ import annotations

import random
import sqlite3
from collections import Counter

import msgspec
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from bot.pipeline.schedule import Deferred, Failed, OutboxRow, Policy, Scheduler, Sent
from bot.store.sqlite import OutboxEntry, Store

POLICY = Policy(base=1.0, cap=300.0, max_attempts=10, max_error_attempts=3, max_retry_after=900.0)
NOW = 1_000.0


def row(id: int = 1, attempts: int = 0, channel: str = "C1", key: str = "k", next_at: float = NOW,
        posted_ref: str | None = None, kind: str = "alert") -> OutboxRow:
    return OutboxRow(id=id, created_at=NOW - 10, receiver="slack", channel=channel, kind=kind, key=key,
                     run_id="run-42", payload="{}", attempts=attempts, next_at=next_at, posted_ref=posted_ref)


def half() -> float:
    return 0.5


@pytest.mark.parametrize(("attempts", "lo", "hi"), [
    (1, 0.5, 1.0), (2, 1.0, 2.0), (3, 2.0, 4.0), (9, 128.0, 256.0), (10, 150.0, 300.0), (60, 150.0, 300.0),
    (10_000, 150.0, 300.0),
])
def test_backoff_doubles_with_equal_jitter_up_to_the_cap(attempts, lo, hi):
    assert POLICY.bounds(attempts) == (lo, hi)
    assert POLICY.backoff(attempts, 0.0) == lo and POLICY.backoff(attempts, 0.999999) == pytest.approx(hi, rel=1e-5)


# (rows' attempts, posted_ref, outcome, state, attempts after, delay, error contains)
VERDICTS = [
    (0, None, Sent(), "delivered", 0, 0.0, None),
    (3, None, Sent(), "delivered", 3, 0.0, None),
    (0, None, Failed("transient", "Slack chat.postMessage failed: HTTP 502: Bad Gateway"), "retry", 1, 0.75, "502"),
    (4, None, Failed("transient", "boom"), "retry", 5, 12.0, "boom"),
    (8, None, Failed("transient", "boom"), "retry", 9, 192.0, "boom"),
    (9, None, Failed("transient", "still down"), "dead", 10, 0.0, "still down"),
    (0, None, Failed("error", "AttributeError: 'str' object has no attribute 'get'"), "retry", 1, 0.75, "Attribute"),
    (2, None, Failed("error", "ValueError: embedded null byte"), "dead", 3, 0.0, "null byte"),
    (0, None, Failed("undecodable", "payload does not decode"), "dead", 1, 0.0, "decode"),
    (0, None, Failed("rate_limited", "HTTP 429", retry_after=30.0), "retry", 1, 30.0, "429"),
    (0, None, Failed("rate_limited", "HTTP 429", retry_after=0.1), "retry", 1, 0.75, "429"),  # backoff is longer
    (0, None, Failed("rate_limited", "HTTP 429", retry_after=1e9), "retry", 1, 900.0, "429"),  # capped
    (0, None, Failed("transient", "upload failed", posted_ref="171.01"), "retry", 1, 0.75, "upload"),
    (9, "171.01", Failed("transient", "upload failed"), "delivered", 10, 0.0, "gave up after 10 tries"),
    (2, "171.01", Failed("error", "KeyError: 'file'"), "delivered", 3, 0.0, "gave up"),
    (2, None, Deferred(2.5), "deferred", 2, 2.5, "rate limited"),
]


@pytest.mark.parametrize(("attempts", "ref", "outcome", "state", "after", "delay", "error"), VERDICTS)
def test_verdicts(attempts, ref, outcome, state, after, delay, error):
    s = Scheduler(POLICY, half)
    s.after([row(99, key="other")], Sent(), NOW - 5)  # the lane works: what fails here is the row's own problem
    v = s.after([row(attempts=attempts, posted_ref=ref)], outcome, NOW)
    assert (v.state, v.attempts) == (state, after)
    assert v.delay == pytest.approx(delay) and v.next_at == pytest.approx(NOW + delay)
    assert (v.error is None) if error is None else (error in (v.error or ""))
    if isinstance(outcome, Failed) and outcome.posted_ref:
        assert v.posted_ref == outcome.posted_ref
    if ref:
        assert v.posted_ref == ref  # a retry of a posted group never posts again


def test_a_group_shares_one_fate_counted_from_its_most_tried_row():
    s = Scheduler(POLICY, half)
    s.after([row(99, key="other")], Sent(), NOW - 5)
    v = s.after([row(1, attempts=2), row(2, attempts=9)], Failed("transient", "x"), NOW)
    assert v.state == "dead" and v.attempts == 10


def test_a_retry_after_paces_its_lane_only_and_due_order_is_oldest_first():
    s = Scheduler(POLICY, half)
    s.after([row(1, channel="C1")], Failed("rate_limited", "HTTP 429", retry_after=30.0), NOW)
    due = [row(5, channel="C2", key="b"), row(2, channel="C1", key="a"), row(3, channel="C2", key="c"),
           row(4, channel="C2", key="b"), row(6, channel="C2", key="late", next_at=NOW + 1)]
    assert s.groups(due, NOW) == [("slack", "C2", "c", "alert"), ("slack", "C2", "b", "alert")]
    assert s.paced_until(("slack", "C1"), NOW + 10) == NOW + 30
    assert s.groups(due, NOW + 31)[0] == ("slack", "C1", "a", "alert")  # the pace is over
    assert s.paced_until(("slack", "C1"), NOW + 31) == NOW + 31


def test_done_rows_are_never_handed_out_and_a_posted_group_only_has_its_follow_up_left():
    s = Scheduler(POLICY, half)
    delivered = row(1)
    delivered.delivered_at = NOW
    dead = row(2, key="d")
    dead.dead_at = NOW
    assert s.groups([delivered, dead], NOW) == []
    assert s.plan([row(3), row(4, posted_ref="171.01")]).post is False
    assert s.plan([row(3)]).post is True


def test_verdicts_written_by_the_store_read_back_as_the_model_applies_them(tmp_path):
    store = Store(str(tmp_path / "bot.sqlite"))
    store.enqueue_many([OutboxEntry(NOW, "slack", "C1", "alert", "k", "run-42", "{}", NOW)] * 2)
    s = Scheduler(POLICY, half)
    for outcome, state in [(Failed("transient", "x", posted_ref="171.01"), "retry"),
                           (Failed("rate_limited", "429", retry_after=5.0), "retry"), (Sent(), "delivered")]:
        rows = store.pending("slack", "C1", "k", "alert")
        v = s.after(rows, outcome, NOW)
        assert v.state == state
        store.settle([r.id for r in rows], v, NOW)
        after = {r.id: r for r in store.delivered_since("slack", "C1", "k", "alert", 0.0)
                 + store.pending("slack", "C1", "k", "alert")}
        assert [after[r.id] for r in rows] == [v.applied(r, NOW) for r in rows]
    assert store.depth() == 0 and store.dead_count() == 0
    store.close()


def test_a_state_file_from_before_dead_letters_gains_their_columns(tmp_path):
    path = str(tmp_path / "old.sqlite")
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE outbox (id INTEGER PRIMARY KEY AUTOINCREMENT, created_at REAL, receiver TEXT,"
               " channel TEXT, kind TEXT, key TEXT, run_id TEXT, payload TEXT, attempts INTEGER DEFAULT 0,"
               " next_at REAL, delivered_at REAL, error TEXT)")
    db.execute("INSERT INTO outbox(created_at, receiver, channel, kind, key, run_id, payload, next_at)"
               " VALUES(1, 'slack', 'C1', 'alert', 'k', 'run-1', '{}', 1)")
    db.commit()
    db.close()
    store = Store(path)
    (r,) = store.due(NOW)
    assert r.run_id == "run-1" and r.dead_at is None and r.posted_ref is None and store.depth() == 1
    store.close()


# -- any sequence of events ------------------------------------------------------------------------

OUTCOMES = st.one_of(
    st.just(("ok", None)),
    st.tuples(st.just("delivery_error"), st.one_of(st.none(), st.floats(0.0, 5000.0, allow_nan=False))),
    st.just(("exception", None)),
    st.just(("posted_then_failed", None)),
)


class OutboxModel(RuleBasedStateMachine):
    """The scheduler driven like the outbox worker drives it, with the store's semantics in a dict."""

    @initialize(seed=st.integers(0, 2**32 - 1), small=st.booleans())
    def setup(self, seed: int, small: bool) -> None:
        self.policy = Policy(base=0.5, cap=20.0, max_attempts=5, max_error_attempts=2, max_retry_after=60.0) \
            if small else POLICY
        self.rand = random.Random(seed).random
        self.scheduler = Scheduler(self.policy, self.rand)
        self.now = NOW
        self.rows: dict[int, OutboxRow] = {}
        self.posts: Counter[int] = Counter()  # text posts per row
        self.dead_reports: Counter[int] = Counter()
        self.last_delay: dict[int, tuple[int, float]] = {}  # (attempts, backoff) of the last retry, per row
        self.refs = 0

    @rule(group=st.integers(0, 3), lane=st.integers(0, 1))
    def enqueue(self, group: int, lane: int) -> None:
        rid = len(self.rows) + 1
        self.rows[rid] = row(rid, channel=f"C{lane}", key=f"k{group}", next_at=self.now)

    @rule(dt=st.floats(0.0, 1000.0, allow_nan=False))
    def tick(self, dt: float) -> None:
        self.now += dt

    @rule()
    def restart(self) -> None:
        """A new process: the pacing is forgotten; what waited for a retry is due at once (Store.due_now)."""
        self.scheduler = Scheduler(self.policy, self.rand)
        for rid, r in self.rows.items():
            if r.pending and r.next_at > self.now and r.attempts > 0:
                r.next_at = self.now
                self.rows[rid] = r

    @rule(outcomes=st.lists(OUTCOMES, max_size=6))
    def deliver(self, outcomes: list[tuple[str, float | None]]) -> None:
        script = iter(outcomes)
        due = [r for r in self.rows.values() if r.pending and r.next_at <= self.now]
        for gk in self.scheduler.groups(due, self.now):
            group = [r for r in self.rows.values() if r.pending and r.group == gk]
            what, retry_after = next(script, ("ok", None))
            self._one(group, what, retry_after)

    @rule(down=st.integers(0, 1))
    def one_lane_down(self, down: int) -> None:
        """Per-destination independence: lane C<down> fails every try, the other works. Every group due on
        the working lane is delivered in this round whatever the other does (when it was down itself
        before, its probe goes and reopens it); nothing on the failing lane is delivered or nears a dead
        letter faster than its own tries."""
        up = f"C{1 - down}"
        was_down = self.scheduler.down(("slack", up))
        due = [r for r in self.rows.values() if r.pending and r.next_at <= self.now]
        groups = self.scheduler.groups(due, self.now)
        up_groups = [gk for gk in groups if gk[1] == up]
        for gk in groups:
            group = [r for r in self.rows.values() if r.pending and r.group == gk]
            self._one(group, "ok" if gk[1] == up else "delivery_error", None)
        for gk in up_groups:
            assert all(not r.pending for r in self.rows.values() if r.group == gk)
        if not was_down:
            assert {r.group for r in due if r.lane == ("slack", up)} == set(up_groups)
        else:  # a lane that was down: its new messages and at most one retry (the probe)
            assert len({r.group for r in due if r.group in up_groups and r.attempts > 0}) <= 1

    @rule(what=st.sampled_from(["delivery_error", "exception", "posted_then_failed"]))
    def outage(self, what: str) -> None:
        """The receiver is down: the clock runs to the next due row and every group due then fails."""
        pending = [r.next_at for r in self.rows.values() if r.pending]
        if pending:
            self.now = max(self.now, min(pending))
        self.deliver([(what, None)] * len(self.rows))

    def _one(self, group: list[OutboxRow], what: str, retry_after: float | None) -> None:
        plan = self.scheduler.plan(group)
        if what in ("ok", "posted_then_failed") and plan.post:
            for r in group:
                self.posts[r.id] += 1
        if what == "ok":
            outcome: Sent | Failed = Sent()
        elif what == "delivery_error":
            outcome = Failed("rate_limited" if retry_after else "transient", "HTTP 503", retry_after)
        elif what == "exception":
            outcome = Failed("error", "AttributeError: 'str' object has no attribute 'get'")
        else:
            self.refs += 1
            outcome = Failed("transient", "upload failed", posted_ref=f"ts{self.refs}" if plan.post else None)
        verdict = self.scheduler.after(group, outcome, self.now)
        if verdict.reopened:  # the outbox's Store.due_now_lane: the lane is back, its waiting rows go now
            for rid, r in self.rows.items():
                if r.pending and r.lane == group[0].lane and r.attempts > 0 and r.next_at > self.now:
                    self.rows[rid] = msgspec.structs.replace(r, next_at=self.now)
        if verdict.state == "retry":
            assert 0.0 < verdict.delay <= self.policy.longest_delay
            assert verdict.delay >= self.policy.bounds(verdict.attempts)[0]
        for r in group:
            if verdict.state == "dead":
                self.dead_reports[r.id] += 1
            if verdict.state == "retry" and not (isinstance(outcome, Failed) and outcome.retry_after):
                before = self.last_delay.get(r.id)
                if before is not None and verdict.attempts > before[0]:
                    # delays grow (equal jitter: each at least the last, up to the cap); in an outage the
                    # attempts, and so the level, are held
                    assert verdict.delay >= min(before[1], self.policy.cap / 2) - 1e-9
                self.last_delay[r.id] = (verdict.attempts, verdict.delay)
            self.rows[r.id] = verdict.applied(r, self.now)

    @invariant()
    def nothing_lost_nothing_twice(self) -> None:
        if not hasattr(self, "rows"):
            return
        for rid, r in self.rows.items():
            assert not (r.delivered_at is not None and r.dead_at is not None)
            assert self.posts[rid] <= 1, f"row {rid} posted {self.posts[rid]} times"
            assert self.dead_reports[rid] <= 1, f"row {rid} reported dead {self.dead_reports[rid]} times"
            assert r.attempts <= max(self.policy.max_attempts, self.policy.max_error_attempts)
            if r.pending:  # bounded: a row that keeps failing ends as a dead letter
                assert r.attempts < self.policy.max_attempts
            if r.dead_at is not None:  # a dead letter was never posted (re-sending it cannot duplicate)
                assert self.posts[rid] == 0 and r.posted_ref is None

    def teardown(self) -> None:
        """Whatever happened, once the receiver works every row ends delivered or dead, within a bound."""
        if not hasattr(self, "rows"):
            return
        for _ in range(4 * self.policy.max_attempts + 4):
            self.now += self.policy.longest_delay + 1
            self.scheduler = Scheduler(self.policy, self.rand)
            self.deliver([])
        assert all(not r.pending for r in self.rows.values())
        assert all(self.posts[rid] <= 1 for rid in self.rows)
        for rid, r in self.rows.items():  # delivered means its text went out: posted, or in its group's post
            if r.delivered_at is not None:
                assert self.posts[rid] == 1 or r.posted_ref is not None, f"row {rid} delivered, never posted"


TestOutboxModel = OutboxModel.TestCase
TestOutboxModel.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def test_fresh_rows_go_before_retries_so_a_row_that_keeps_failing_cannot_starve_its_lane():
    s = Scheduler(POLICY, half)
    due = [row(1, key="poison", attempts=3), row(2, key="fresh"), row(3, key="older-retry", attempts=1)]
    assert [g[2] for g in s.groups(due, NOW)] == ["fresh", "poison", "older-retry"]


def test_an_outage_is_not_a_poison_row():
    """Two groups failing on a lane since its last success: the lane is down, nobody nears a dead letter;
    one group failing while others get through: that group is the problem."""
    s = Scheduler(POLICY, half)
    a, b = row(1, key="a", attempts=9), row(2, key="b", attempts=9)
    s.after([row(99, key="other")], Sent(), NOW - 5)
    assert s.after([a], Failed("transient", "HTTP 503"), NOW).state == "dead"  # alone, the lane works: its own fault
    s = Scheduler(POLICY, half)
    assert s.after([row(3, key="c")], Failed("transient", "HTTP 503"), NOW).state == "retry"
    down = s.after([a], Failed("transient", "HTTP 503"), NOW)
    assert (down.state, down.attempts) == ("retry", 9) and down.delay == 192.0  # held at its level
    assert s.after([b], Failed("error", "KeyError: 'ts'"), NOW).state == "dead"  # a bug is no outage
    s.after([row(4, key="d")], Sent(), NOW)  # the lane is back
    assert s.after([a], Failed("transient", "HTTP 503"), NOW).state == "dead"


def test_a_lone_alert_in_an_outage_is_held_not_dead():
    """Nothing got through on the lane since the row was queued: the receiver is down (Slack down for an hour
    with one ERROR waiting), not the row's fault: it keeps its level and keeps trying at the cap."""
    s = Scheduler(POLICY, half)
    held = s.after([row(1, attempts=9)], Failed("transient", "HTTP 503"), NOW)
    assert (held.state, held.attempts) == ("retry", 9)
    assert s.after([row(1, attempts=9)], Failed("permanent", "code 310000"), NOW).state == "dead"  # no retry helps
    stale = s.after([row(1, attempts=9)], Failed("transient", "HTTP 404"), NOW - 10 + POLICY.max_hold)
    assert stale.state == "dead"  # held 6 h with nothing through: a lone message that never goes ends
    assert s.after([row(1, attempts=2)], Failed("error", "KeyError: 'ts'"), NOW).state == "dead"  # a bug


def test_a_down_lane_is_probed_by_one_group_and_its_first_success_reopens_it():
    s = Scheduler(POLICY, half)
    first = s.after([row(1, key="a")], Failed("transient", "HTTP 503"), NOW)
    assert not first.reopened and s.down(("slack", "C1"))
    due = [row(1, key="a", attempts=1), row(2, key="b"), row(3, key="c"), row(4, key="d", channel="C2"),
           row(5, key="e", channel="C2")]
    assert s.groups(due, NOW) == [("slack", "C1", "b", "alert"), ("slack", "C1", "c", "alert"),
                                  ("slack", "C2", "d", "alert"), ("slack", "C2", "e", "alert")]  # C1 is down:
    # its new messages try once; its retry waits for them (and alone, probes)
    assert s.groups([row(1, key="a", attempts=1), row(6, key="f", attempts=2)], NOW) == [("slack", "C1", "a", "alert")]
    back = s.after([row(2, key="b")], Sent(), NOW + 1)
    assert back.state == "delivered" and back.reopened and not s.down(("slack", "C1"))
    assert len(s.groups(due, NOW + 1)) == 5  # all of C1 goes again
    assert not s.after([row(3, key="c")], Sent(), NOW + 2).reopened


def test_the_default_policy_retries_a_recovered_receiver_within_30_s():
    p = Policy()
    assert max(p.bounds(n)[1] for n in range(1, 100)) == 30.0
