"""The health checkpoint ring and the rewind budget (notifier/checkpoints.py): their tables, and hypothesis state
machines over any order of saves, alerts, step boundaries and rewinds."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from notifier.checkpoints import (
    BUDGET_TABLE,
    TRANSITIONS,
    BudgetPolicy,
    Entry,
    Health,
    Mark,
    RewindBudget,
    Ring,
    RingPolicy,
    Spend,
)


def test_every_health_takes_every_mark_and_unhealthy_is_final():
    for h in Health:
        for m in Mark:
            assert (h, m) in TRANSITIONS
    assert all(TRANSITIONS[(Health.UNHEALTHY, m)] is Health.UNHEALTHY for m in Mark)
    assert all(TRANSITIONS[(h, Mark.ALERT)] is Health.UNHEALTHY for h in Health)


def test_the_budget_refuses_only_a_rule_over_it():
    assert BUDGET_TABLE[(True, False)] is Spend.REFUSE
    assert BUDGET_TABLE[(True, True)] is Spend.OVER
    assert {BUDGET_TABLE[(False, p)] for p in (True, False)} == {Spend.GO}


def ring(**kw) -> Ring:
    return Ring(RingPolicy(**{"keep": 3, "every_steps": 50, "confirm_steps": 50, "suspect_steps": 20, **kw}))


def test_a_checkpoint_is_healthy_only_after_its_confirmation_window():
    r = ring()
    r.saved(50, 0.0, "a", 50, 0)
    r.advance(99)
    assert r.entries[0].health is Health.PENDING
    assert [e.step for e in r.advance(100)] == [50]
    assert r.entries[0].health is Health.HEALTHY


def test_an_alert_marks_the_checkpoints_from_suspect_steps_before_it():
    r = ring(keep=10)
    for s in (50, 100, 150):
        r.saved(s, 0.0, str(s), s, 0)
    r.advance(160)
    assert [e.health for e in r.entries] == [Health.HEALTHY, Health.HEALTHY, Health.PENDING]
    marked = r.alert(170, "loss_spike ERROR at step 170")
    assert [e.step for e in marked] == [150]
    r.alert(115, "grad_norm ERROR at step 115")  # 115 - 20 = 95: the checkpoint of step 100 too
    assert [e.health for e in r.entries] == [Health.HEALTHY, Health.UNHEALTHY, Health.UNHEALTHY]
    assert r.entries[1].why == "grad_norm ERROR at step 115"


def test_an_alert_after_the_suspect_window_but_within_the_confirm_window_leaves_it_doubted():
    """issue 36: a checkpoint an ERROR followed 27 steps later (suspect_steps 20, confirm_steps 50) was confirmed
    "healthy: no alert in the 50 steps after it". It is doubted: never confirmed, never loaded by a plain rewind,
    but old enough for a rewind before that alert."""
    r = Ring(RingPolicy(keep=5, every_steps=100, confirm_steps=50, suspect_steps=20))
    r.saved(100, 0.0, "p100", 100, 0)
    r.advance(150)
    r.saved(200, 0.0, "p200", 200, 0)
    assert [e.step for e in r.alert(227, "loss_spike ERROR at step 227")] == [200]
    r.advance(300)
    e = r.entries[1]
    assert e.health is Health.DOUBTED and "27 steps after it" in e.why and "no alert" not in e.why
    assert r.choose().step == 100  # `rewind <run>`: the newest healthy one
    assert r.choose(to=260).step == 100
    assert r.choose(before=227).step == 200  # before that alert: it is older than its suspects
    assert "200 doubted (loss_spike ERROR at step 227, 27 steps after it" in r.describe()
    late = Ring(RingPolicy(keep=5, every_steps=100, confirm_steps=50, suspect_steps=20))
    late.saved(100, 0.0, "p100", 100, 0)
    late.advance(400)  # confirmed, then a rewind names an alert 30 steps after it (the bot's alert onset)
    late.alert(130, "loss_spike at step 130 (rewind)")
    assert late.entries[0].health is Health.DOUBTED


def test_a_checkpoint_saved_while_an_alert_fires_is_unhealthy_at_once():
    r = ring()
    r.saved(50, 0.0, "a", 50, 0, firing="nonfinite ERROR")
    r.advance(1000)
    assert r.entries[0].health is Health.UNHEALTHY and "nonfinite ERROR" in r.entries[0].why


def test_eviction_keeps_the_newest_healthy_one_whatever_comes_after():
    r = ring(keep=2)
    r.saved(50, 0.0, "good", 50, 0)
    r.advance(100)
    gone = []
    for s in range(100, 500, 50):
        gone += r.saved(s, 0.0, str(s), s, 0, firing="loss_spike ERROR")
    assert [e.step for e in r.entries] == [50, 400, 450]
    assert "good" not in [e.path for e in gone] and len(gone) == 6


def test_choose_before_an_alert_takes_the_newest_healthy_one_early_enough():
    r = ring(keep=10)
    for s in (50, 100, 150, 200):
        r.saved(s, 0.0, str(s), s, 0)
    r.advance(250)
    assert r.choose().step == 200
    assert r.choose(before=215).step == 150  # 215 - 20 - 1 = 194
    assert r.choose(to=120).step == 100
    assert r.choose(to=120, before=215).step == 100


def test_choose_says_why_when_nothing_is_healthy():
    r = ring()
    r.saved(50, 0.0, "a", 50, 0)
    why = r.choose()
    assert isinstance(why, str) and "no healthy checkpoint" in why and "50 pending" in why
    r.alert(60, "loss_spike ERROR at step 60")
    why = r.choose(before=60)
    assert isinstance(why, str) and "before the alert at step 60" in why and "50 unhealthy" in why


def test_a_rewind_drops_the_abandoned_attempts_checkpoints():
    r = ring(keep=10)
    for s in (50, 100, 150):
        r.saved(s, 0.0, str(s), s, 0)
    gone = r.rewound(100)
    assert [e.step for e in gone] == [150] and [e.step for e in r.entries] == [50, 100]
    assert r.due(150, 0.0)  # the new attempt saves its own step 150


def test_due_by_steps_and_by_time_never_twice_for_a_step():
    r = Ring(RingPolicy(every_steps=None, every_seconds=60.0), start=0.0)
    assert not r.due(10, 59.0) and r.due(10, 60.0)
    r.saved(10, 60.0, "a", 10, 0)
    assert not r.due(10, 500.0) and not r.due(11, 119.0) and r.due(11, 120.0)
    r2 = ring()
    assert r2.due(50, 0.0) and not r2.due(51, 0.0)


def test_state_round_trips():
    r = ring()
    r.saved(50, 1.5, "a", 50, 2, firing="x")
    r2 = ring()
    r2.load_state_dict(r.state_dict())
    assert [e.to_dict() for e in r2.entries] == [e.to_dict() for e in r.entries]
    assert Entry.from_dict(r.entries[0].to_dict()) == r.entries[0]


def test_the_budget_counts_rewinds_and_the_steps_between_them():
    b = RewindBudget(BudgetPolicy(max_rewinds=2, min_steps_between=100))
    assert b.decide(10, by_person=False) == (Spend.GO, None)
    b.spend(10)
    spend, why = b.decide(60, by_person=False)
    assert spend is Spend.REFUSE and "50 steps ago" in why
    assert b.decide(60, by_person=True)[0] is Spend.OVER
    assert b.decide(110, by_person=False)[0] is Spend.GO
    b.spend(110)
    spend, why = b.decide(10_000, by_person=False)
    assert spend is Spend.REFUSE and "2 rewinds" in why and b.left() == 0


class RingMachine(RuleBasedStateMachine):
    """Any order of steps, saves, alerts and rewinds: the ring stays bounded, ordered, never loses its newest healthy
    checkpoint to eviction, and never offers an unhealthy or too-late checkpoint to a rewind."""

    def __init__(self) -> None:
        super().__init__()
        self.keep = 3
        self.ring = Ring(RingPolicy(keep=self.keep, every_steps=10, confirm_steps=15, suspect_steps=5))
        self.step = 0
        self.alerts: list[int] = []  # alert steps of the current timeline

    @rule(n=st.integers(1, 40))
    def train(self, n: int) -> None:
        for _ in range(n):
            self.step += 1
            self.ring.advance(self.step)
            if self.ring.due(self.step, 0.0):
                good_before = self.ring.newest(Health.HEALTHY)
                gone = self.ring.saved(self.step, 0.0, f"p{self.step}", self.step, 0)
                assert good_before is None or good_before not in gone

    @rule()
    def alert(self) -> None:
        self.ring.alert(self.step, "alert")
        self.alerts.append(self.step)

    @rule(back=st.integers(0, 100), before=st.booleans())
    def rewind(self, back: int, before: bool) -> None:
        target = max(self.step - back, 0)
        chosen = self.ring.choose(before=target) if before else self.ring.choose(to=target)
        if isinstance(chosen, str):
            return
        assert chosen.health is Health.HEALTHY or before and chosen.health in (Health.PENDING, Health.DOUBTED)
        assert chosen.step <= (target - 6 if before else target)
        # no alert within suspect_steps after it, in its own timeline
        assert not any(chosen.step >= a - 5 for a in self.alerts if a >= chosen.step)
        self.ring.rewound(chosen.step)
        self.step = chosen.step
        self.alerts = [a for a in self.alerts if a <= chosen.step]

    @invariant()
    def bounded_and_ordered(self) -> None:
        steps = [e.step for e in self.ring.entries]
        assert steps == sorted(set(steps))
        assert len(steps) <= self.keep + 1
        assert all(s <= self.step for s in steps)

    @invariant()
    def healthy_means_confirmed_and_clean(self) -> None:
        for e in self.ring.entries:
            if e.health is Health.HEALTHY:  # docs/rewind.md: confirm_steps passed after it without an alert
                assert "no alert in the" in e.why
                assert not any(a - e.step < 15 for a in self.alerts if a >= e.step), (e, self.alerts)
            if e.health is Health.DOUBTED:  # an alert in its confirm window, none in its suspect window
                assert any(5 < a - e.step < 15 for a in self.alerts if a >= e.step), (e, self.alerts)


TestRing = RingMachine.TestCase
TestRing.settings = settings(max_examples=150, stateful_step_count=40, deadline=None,
                             suppress_health_check=[HealthCheck.too_slow])


@given(st.lists(st.tuples(st.integers(0, 5000), st.booleans()), max_size=40), st.integers(1, 5),
       st.integers(0, 300))
def test_the_budget_is_a_function_of_the_steps_alone(events, most, gap):
    """Two ranks that see the same steps and the same rewinds decide the same, whatever their clocks."""
    a, b = RewindBudget(BudgetPolicy(most, gap)), RewindBudget(BudgetPolicy(most, gap))
    trained = 0
    for dt, person in events:
        trained += dt
        da, db = a.decide(trained, person), b.decide(trained, person)
        assert da == db
        if da[0] is not Spend.REFUSE:
            a.spend(trained)
            b.spend(trained)
    assert len(a.spent) <= most or any(p for _, p in events)


@pytest.mark.parametrize("keep", [1, 2, 5])
def test_keep_one_still_keeps_the_last_good_one(keep):
    r = ring(keep=keep)
    r.saved(50, 0.0, "good", 50, 0)
    r.advance(100)
    for s in range(100, 1000, 50):
        r.saved(s, 0.0, str(s), s, 0)
        r.alert(s, "bad")
    assert r.choose().path == "good"
