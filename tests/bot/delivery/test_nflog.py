"""The notification log (dedup's NotifyState) against the delivery's outcomes, as Alertmanager's nflog: what
counts as sent is what was delivered. A hypothesis state machine drives one alert's events through the real
dedup stage's decisions (`decide`, `kind`, `record`, as bot/ingest/envelope.py applies them when it queues) and its
queued messages to delivered or dead letters (`given_up`, as bot/delivery/nflog.py applies it), in any order and
with any clock, and checks:

- a dead letter does not count as notified: with nothing delivered since and nothing waiting, the alert's
  next event is queued at once (not a `repeat_interval` later);
- reminders after a dead letter: once a message of the alert was delivered, the next reminder is due
  `repeat_interval` after the last queued one, never sooner, and is a reminder of what was posted;
- nothing is queued twice while a message of the same severity waits within `repeat_interval`.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from bot.pipeline import dedup
from bot.pipeline.flow import NEVER, NotifyState
from msmon.contract.wire import Event, Severity, Status

REPEAT = 3600.0


def ev(sev: Severity = Severity.ERROR, status: Status = Status.FIRING, step: int = 1) -> Event:
    return Event(run_id="r", device="0", step=step, time=0.0, rule="grad_norm", severity=sev, status=status,
                 value=1.0, threshold=1.0, message="m")


class NotifyLog(RuleBasedStateMachine):
    @initialize()
    def setup(self) -> None:
        self.now = 1000.0
        self.state: NotifyState = NEVER
        self.waiting: list[tuple[str, float, Severity]] = []  # queued: (kind, queued at, severity)
        self.delivered: list[tuple[str, float, Severity]] = []
        self.step = 0

    @rule(dt=st.floats(0, 2 * REPEAT, allow_nan=False))
    def tick(self, dt: float) -> None:
        self.now += dt

    @rule(sev=st.sampled_from([Severity.WARNING, Severity.ERROR]))
    def event(self, sev: Severity) -> None:
        self.step += 1
        e = ev(sev, step=self.step)
        if dedup.decide(e, self.state, self.now, REPEAT):
            kind = dedup.kind(e, self.state)
            self.waiting.append((kind, self.now, sev))
            self.state = dedup.record(e, self.state, self.now)

    @rule(i=st.integers(0, 5), ok=st.booleans())
    def outcome(self, i: int, ok: bool) -> None:
        if not self.waiting:
            return
        kind, at, sev = self.waiting.pop(i % len(self.waiting))
        if ok:
            self.delivered.append((kind, at, sev))
            return
        after = dedup.given_up(self.state, kind, at, sev)
        if after is not None:
            self.state = after

    @invariant()
    def a_dead_letter_is_not_notified(self) -> None:
        if not hasattr(self, "state"):
            return
        if not self.waiting and self.state.sent_at not in {at for _, at, _ in self.delivered}:
            # nothing waiting, and the last record is of no delivered message: the next ERROR goes at once
            assert dedup.decide(ev(), self.state, self.now, REPEAT)

    @invariant()
    def nothing_twice_while_it_waits(self) -> None:
        if not hasattr(self, "state"):
            return
        for _, at, sev in self.waiting:
            if sev is Severity.ERROR and self.now - at < REPEAT and self.state.severity is Severity.ERROR \
                    and self.state.sent_at is not None:
                assert not dedup.decide(ev(), self.state, self.now, REPEAT)


TestNotifyLog = NotifyLog.TestCase
TestNotifyLog.settings = settings(max_examples=300, stateful_step_count=30, deadline=None)


def test_a_dead_lettered_error_goes_out_with_the_next_event():
    s = dedup.record(ev(), NEVER, 100.0)  # queued at 100
    assert not dedup.decide(ev(), s, 200.0, REPEAT)  # waiting: not queued again
    s = dedup.given_up(s, "alert", 100.0, Severity.ERROR) or s
    assert s == NEVER and dedup.decide(ev(), s, 200.0, REPEAT) and dedup.kind(ev(), s) == "alert"


def test_a_dead_lettered_reminder_is_due_again_as_a_reminder():
    posted = dedup.record(ev(step=5), NEVER, 100.0)
    reminder = dedup.record(ev(step=9), posted, 100.0 + REPEAT)
    back = dedup.given_up(reminder, "repeat", 100.0 + REPEAT, Severity.ERROR)
    assert back is not None and back.sent_at is None and back.step == 5
    assert dedup.decide(ev(), back, 100.0 + REPEAT + 1, REPEAT) and dedup.kind(ev(), back) == "repeat"


def test_a_dead_letter_of_an_older_message_leaves_a_newer_record():
    s = dedup.record(ev(Severity.WARNING), NEVER, 100.0)
    s = dedup.record(ev(Severity.ERROR), s, 150.0)  # the rise, queued after
    assert dedup.given_up(s, "alert", 100.0, Severity.WARNING) is None  # the WARNING's: the ERROR's record stands
    same_time = dedup.record(ev(Severity.ERROR), dedup.record(ev(Severity.WARNING), NEVER, 100.0), 100.0)
    assert dedup.given_up(same_time, "alert", 100.0, Severity.WARNING) is None  # one envelope, both queued
    assert dedup.given_up(dedup.record(ev(status=Status.RESOLVED), s, 160.0), "resolve", 160.0, Severity.ERROR) is None
