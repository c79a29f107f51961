"""The alert state machine: consecutive, baseline, rises, reminders, flaps, resolution."""

from __future__ import annotations

import random
from collections.abc import Iterable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from msmon.contract.wire import Sample, Severity, Status
from msmon.core.detectors import DetectorContext
from msmon.core.detectors.base import Finding
from msmon.core.detectors.loss_spike import LossSpike, LossSpikeParams
from msmon.core.gate import AlertGate, GateState

WARNING, ERROR = Severity.WARNING, Severity.ERROR
FIRING, RESOLVED = Status.FIRING, Status.RESOLVED

W = Finding(WARNING, 5.0, 4.0, "over the warning level")
E = Finding(ERROR, 12.0, 10.0, "over the error level")
CLEAR = None
BELOW = Finding(None, 1.0, float("nan"), "a finding under every level counts as clear")


def run(gate: AlertGate, seq: Iterable[tuple[int, Finding | None]], consecutive: int = 1,
        immediate: bool = False, st: GateState | None = None) -> list[tuple[int, Severity, Status, bool]]:
    """Feed (step, finding) pairs; the events as (step, severity, status, repeat)."""
    st = GateState() if st is None else st
    out = []
    for step, f in seq:
        v = gate.admit(st, f, step, consecutive, immediate)
        if v is not None:
            out.append((step, v.severity, v.status, v.repeat))
    return out


def steps(findings: Iterable[Finding | None], start: int = 0, every: int = 1) -> list[tuple[int, Finding | None]]:
    return [(start + i * every, f) for i, f in enumerate(findings)]


# -- consecutive ------------------------------------------------------------------------------


def test_consecutive_n_before_alerting() -> None:
    gate = AlertGate(alert_interval=1000, baseline_steps=0, resolve_after=5)
    seq = steps([W, W, CLEAR, W, W, BELOW, W, W, W, W])
    assert run(gate, seq, consecutive=3) == [(8, WARNING, FIRING, False)]
    assert run(gate, seq, consecutive=1) == [(0, WARNING, FIRING, False)]
    assert run(gate, steps([W] * 20), consecutive=21) == []


def test_consecutive_errors_alert_as_error_directly() -> None:
    gate = AlertGate(alert_interval=1000, baseline_steps=0, resolve_after=5)
    assert run(gate, steps([E, E, E]), consecutive=3) == [(2, ERROR, FIRING, False)]


def test_errors_count_towards_warning_but_error_needs_n_errors_in_a_row() -> None:
    gate = AlertGate(alert_interval=1000, baseline_steps=0, resolve_after=5)
    # W E E: three over WARNING (ERROR counts) but only two ERRORs: WARNING; the third ERROR raises it.
    assert run(gate, steps([W, E, E, E]), consecutive=3) == [(2, WARNING, FIRING, False), (3, ERROR, FIRING, False)]
    # Alternating: ERROR is never reached N times in a row.
    assert run(gate, steps([W, E, W, E, W, E]), consecutive=2) == [(1, WARNING, FIRING, False)]


def idle(st: GateState) -> bool:
    """Nothing counted and nothing firing: the Monitor skips the gate for a normal sample then."""
    return st.firing is None and st.n_warn == 0


def test_state_counters_and_idle() -> None:
    gate = AlertGate(alert_interval=1000, baseline_steps=0, resolve_after=2)
    st = GateState()
    assert idle(st)
    gate.admit(st, W, 0, 3)
    assert (st.n_warn, st.n_err, st.firing) == (1, 0, None) and not idle(st)
    gate.admit(st, E, 1, 3)
    assert (st.n_warn, st.n_err) == (2, 1)
    gate.admit(st, CLEAR, 2, 3)
    assert (st.n_warn, st.n_err) == (0, 0) and idle(st)
    for step in (3, 4, 5):
        gate.admit(st, E, step, 3)
    assert st.firing is ERROR and st.emitted and st.last_emit == {ERROR: 5} and not idle(st)
    gate.admit(st, CLEAR, 6, 3)
    assert st.clear == 1 and not idle(st)
    gate.admit(st, CLEAR, 7, 3)
    assert st.firing is None and st.clear == 0 and idle(st)


# -- baseline and immediate ---------------------------------------------------------------------


def test_baseline_suppresses_until_it_ends() -> None:
    gate = AlertGate(alert_interval=1000, baseline_steps=100, resolve_after=5)
    assert run(gate, steps([W] * 30, start=50, every=5)) == [(100, WARNING, FIRING, False)]
    # Counting goes on during the baseline: 3 in a row straddling its end alert on its first step.
    assert run(gate, steps([W] * 5, start=98), consecutive=3) == [(100, WARNING, FIRING, False)]
    assert run(gate, steps([E] * 5, start=99), consecutive=3) == [(101, ERROR, FIRING, False)]
    # Entirely inside the baseline: nothing, and so nothing to resolve.
    assert run(gate, steps([E] * 10 + [CLEAR] * 10), consecutive=1) == []


def test_immediate_bypasses_consecutive_and_baseline() -> None:
    gate = AlertGate(alert_interval=1000, baseline_steps=100, resolve_after=3)
    events = run(gate, steps([E, E, CLEAR, CLEAR, CLEAR], start=5), consecutive=3, immediate=True)
    assert events == [(5, ERROR, FIRING, False), (9, ERROR, RESOLVED, False)]
    gate = AlertGate(alert_interval=1000, baseline_steps=0, resolve_after=3)
    assert run(gate, steps([E], start=7), consecutive=50, immediate=True) == [(7, ERROR, FIRING, False)]


# -- rises, reminders -----------------------------------------------------------------------------


def test_warning_to_error_rise_passes_inside_alert_interval() -> None:
    gate = AlertGate(alert_interval=1000, baseline_steps=0, resolve_after=5)
    seq = steps([W, E] + [E] * 20 + [W] * 5, start=10)
    assert run(gate, seq) == [(10, WARNING, FIRING, False), (11, ERROR, FIRING, False)]
    # With consecutive: the rise comes once ERROR has been seen N times in a row.
    assert run(gate, steps([W, W, E, E, E], start=10), consecutive=2) == [
        (11, WARNING, FIRING, False), (13, ERROR, FIRING, False)]


def test_reminders_every_alert_interval_while_firing() -> None:
    gate = AlertGate(alert_interval=100, baseline_steps=0, resolve_after=5)
    # A sample every 7 steps: a reminder on the first sample at least 100 steps after the last event.
    events = run(gate, steps([W] * 50, every=7))
    assert events == [(0, WARNING, FIRING, False), (105, WARNING, FIRING, True), (210, WARNING, FIRING, True),
                      (315, WARNING, FIRING, True)]


def test_reminders_after_a_rise_follow_the_error() -> None:
    gate = AlertGate(alert_interval=100, baseline_steps=0, resolve_after=5)
    seq = steps([W] * 5 + [E] * 30 + [W] * 20, every=10)
    assert run(gate, seq) == [
        (0, WARNING, FIRING, False),
        (50, ERROR, FIRING, False),
        (150, ERROR, FIRING, True),
        (250, ERROR, FIRING, True),
        (350, ERROR, FIRING, True),  # a WARNING under a firing ERROR keeps the ERROR going
        (450, ERROR, FIRING, True),
    ]  # the last sample is at step 540


def test_alert_interval_zero_means_no_reminders() -> None:
    gate = AlertGate(alert_interval=0, baseline_steps=0, resolve_after=2)
    assert run(gate, steps([W] * 1000)) == [(0, WARNING, FIRING, False)]
    seq = steps([W, CLEAR, CLEAR, W, CLEAR, CLEAR])
    assert run(gate, seq) == [(0, WARNING, FIRING, False), (2, WARNING, RESOLVED, False),
                              (3, WARNING, FIRING, False), (5, WARNING, RESOLVED, False)]


# -- flaps and resolution -----------------------------------------------------------------------


def test_a_new_episode_inside_alert_interval_goes_out() -> None:
    """alert_interval spaces the reminders of one episode; an episode that begins after the last one resolved is
    new and always goes out (issue 24: a NaN at step 300 was swallowed after a transient at step 100)."""
    gate = AlertGate(alert_interval=500, baseline_steps=0, resolve_after=3)
    st = GateState()
    assert run(gate, steps([E, CLEAR, CLEAR, CLEAR], start=100), st=st, immediate=True) == [
        (100, ERROR, FIRING, False), (103, ERROR, RESOLVED, False)]
    assert run(gate, steps([E], start=300), st=st, immediate=True) == [(300, ERROR, FIRING, False)]


def test_a_new_episode_then_its_reminders_follow_alert_interval() -> None:
    gate = AlertGate(alert_interval=100, baseline_steps=0, resolve_after=3)
    st = GateState()
    run(gate, steps([W, CLEAR, CLEAR, CLEAR]), st=st)
    events = run(gate, steps([W] * 150 + [CLEAR] * 3, start=10), st=st)
    assert events == [(10, WARNING, FIRING, False), (110, WARNING, FIRING, True), (162, WARNING, RESOLVED, False)]


def test_episode_then_rise_passes() -> None:
    gate = AlertGate(alert_interval=100, baseline_steps=0, resolve_after=3)
    st = GateState()
    run(gate, steps([W, CLEAR, CLEAR, CLEAR]), st=st)
    assert run(gate, steps([W, W, E], start=10), st=st) == [(10, WARNING, FIRING, False), (12, ERROR, FIRING, False)]


def test_resolved_after_resolve_after_clear_samples() -> None:
    gate = AlertGate(alert_interval=1000, baseline_steps=0, resolve_after=5)
    # 4 clear samples, then a finding: the count starts over.
    seq = steps([E, E, CLEAR, CLEAR, CLEAR, BELOW, W, CLEAR, CLEAR, CLEAR, CLEAR, BELOW, CLEAR])
    assert run(gate, seq) == [(0, ERROR, FIRING, False), (11, ERROR, RESOLVED, False)]


def test_no_resolved_without_a_firing_event() -> None:
    gate = AlertGate(alert_interval=1000, baseline_steps=0, resolve_after=2)
    # Never reached `consecutive`: nothing fired, nothing to resolve.
    assert run(gate, steps([W, W, CLEAR, CLEAR, CLEAR, W, CLEAR, CLEAR]), consecutive=3) == []
    # Inside the baseline: the same.
    gate = AlertGate(alert_interval=1000, baseline_steps=1000, resolve_after=2)
    assert run(gate, steps([E] * 5 + [CLEAR] * 5)) == []


@pytest.mark.parametrize("resolve_after", [1, 3, 10])
def test_resolve_after_counts_samples(resolve_after: int) -> None:
    gate = AlertGate(alert_interval=1000, baseline_steps=0, resolve_after=resolve_after)
    events = run(gate, steps([W] + [CLEAR] * 20, every=10))
    assert events == [(0, WARNING, FIRING, False), (10 * resolve_after, WARNING, RESOLVED, False)]


# -- with a detector: one-step loss spikes ---------------------------------------------------------


def test_one_step_loss_spikes_do_not_alert_through_the_gate() -> None:
    """LossSpike flags every one-batch spike; `consecutive` (3 by default) keeps them from alerting."""
    p = LossSpikeParams()
    det = LossSpike(p, DetectorContext())
    gate = AlertGate(alert_interval=1000, baseline_steps=0, resolve_after=5)
    st = GateState()
    rng = random.Random(3)
    flagged, events = [], []
    spikes = set(range(500, 5000, 250)) | {k + 1 for k in range(750, 5000, 1000)}  # singles, and some pairs
    jump_from = 5000
    for i in range(1, 5300):
        step = 10 * i
        loss = 1.8 + 8.0 * step ** -0.35 + rng.gauss(0.0, 0.02)
        if i in spikes:
            loss += 1.0  # ~50 sigma for one sample
        if i >= jump_from:
            loss += 1.0  # and then for good
        f = det.update(Sample(run_id="t", device="0", step=step, time=1.7e9 + step, loss=loss), p)
        if f is not None and f.level is not None:
            flagged.append((i, f.level))
        v = gate.admit(st, f, step, p.consecutive)
        if v is not None:
            events.append((i, v.severity, v.status, v.repeat))
    assert {i for i, lv in flagged if lv is ERROR and i < jump_from} == spikes
    assert events[0] == (jump_from + p.consecutive - 1, ERROR, FIRING, False)
    assert all(e[3] for e in events[1:])  # then only reminders


def test_skip_leaves_the_state_alone() -> None:
    """A sample with nothing to judge (metric absent or NaN) neither counts toward firing nor resolving."""
    from msmon.core.detectors.base import SKIP

    gate, st = AlertGate(alert_interval=0, baseline_steps=0, resolve_after=1), GateState()
    f = Finding(ERROR, 5.0, 1.0, "x")
    assert gate.admit(st, f, 1, 2) is None
    assert gate.admit(st, SKIP, 2, 2) is None
    v = gate.admit(st, f, 3, 2)
    assert v is not None and v.severity is ERROR
    assert gate.admit(st, SKIP, 4, 2) is None and st.firing is ERROR


# -- any interleaving: a new episode is never hidden ---------------------------------------------


@settings(max_examples=300, deadline=None)
@given(seq=hs.lists(hs.sampled_from(["clear", "W", "E"]), max_size=200),
       interval=hs.sampled_from([0, 1, 5, 500]), resolve_after=hs.integers(1, 4), consecutive=hs.integers(1, 3))
def test_every_episode_goes_out_once_and_is_resolved_at_most_once(seq, interval, resolve_after, consecutive):
    """Whatever the findings and alert_interval: an episode that reaches a level is sent when it does (FIRING, not
    a reminder), each rise once, a reminder never comes sooner than alert_interval after the last event of its
    level, and a RESOLVED follows only an episode that was sent."""
    gate, st = AlertGate(alert_interval=interval, baseline_steps=0, resolve_after=resolve_after), GateState()
    firing, last_sent = None, {}
    for step, kind in enumerate(seq):
        f = {"clear": CLEAR, "W": W, "E": E}[kind]
        before = st.firing
        v = gate.admit(st, f, step, consecutive)
        if before is None and st.firing is not None or before is WARNING and st.firing is ERROR:
            assert v is not None and v.status is FIRING and not v.repeat and v.severity is st.firing
        if v is not None and v.status is FIRING and v.repeat:
            assert interval > 0 and step - last_sent[v.severity] >= interval
        if v is not None and v.status is RESOLVED:
            assert firing is not None
        if v is not None and v.status is FIRING:
            last_sent[v.severity] = step
        firing = st.firing
