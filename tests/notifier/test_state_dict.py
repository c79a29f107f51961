"""Monitor.state_dict() / load_state_dict(): JSON-safe, bounded, versioned; a resumed replay raises exactly the
alerts of an uninterrupted one; a damaged, foreign or mismatched state is a StateError saying why."""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path

import msgspec
import pytest

from msmon.contract.wire import Status
from msmon.core.state import StateError, decode, encode
from msmon.offline.readers import read_log
from msmon.offline.replay import replay, replay_monitor
from notifier import Monitor
from tests.fakes.helpers import FakeClock, config, healthy

TRACES = Path(__file__).resolve().parents[2] / "data" / "backtest" / "mindspore-cpu"


def key(e):
    """Everything an alert says, its chart included."""
    return (e.step, e.device, e.rule, e.severity, e.status, e.repeat, e.message, e.phase,
            msgspec.json.encode(e.window))


def roundtrip(state):
    return json.loads(json.dumps(state, allow_nan=False))


@pytest.mark.parametrize(("trace", "stop"), [("lr-jump.csv", 2010), ("loader-slowdown.csv", 2150),
                                             ("lr-jump.csv", 700)])
def test_a_replay_resumed_from_its_state_raises_exactly_the_uninterrupted_alerts(trace, stop):
    rows = list(read_log(str(TRACES / trace)))
    whole = replay(rows, replay_monitor(config(), "run"))
    first = replay_monitor(config(), "run")
    before = replay([r for r in rows if r.step <= stop], first)
    resumed = replay_monitor(config(), "run")
    resumed.load_state_dict(roundtrip(first.state_dict()))
    after = replay([r for r in rows if r.step > stop], resumed)
    assert [key(e) for e in before] == [key(e) for e in whole if e.step <= stop]
    assert [key(e) for e in after] == [key(e) for e in whole if e.step > stop]
    assert any(e.status is Status.FIRING for e in whole)


def test_a_firing_alert_is_not_raised_again_after_a_resume():
    rows = list(read_log(str(TRACES / "lr-jump.csv")))
    whole = replay(rows, replay_monitor(config(), "run"))
    firing = [e for e in whole if e.status is Status.FIRING and not e.repeat]
    stop = firing[0].step + 1
    mon = replay_monitor(config(), "run")
    replay([r for r in rows if r.step <= stop], mon)
    resumed = replay_monitor(config(), "run")
    resumed.load_state_dict(roundtrip(mon.state_dict()))
    rest = [r for r in rows if r.step > stop]
    again = {(e.rule, e.severity) for e in replay(rest, resumed) if e.status is Status.FIRING and not e.repeat}
    assert (firing[0].rule, firing[0].severity) not in again  # (a rise to ERROR later is a new alert)


def test_the_state_is_json_bounded_and_keeps_live_level_changes():
    clock = FakeClock()
    rng = random.Random(1)
    mon = Monitor(config(), "r", sinks=[], clock=clock)
    sizes = []
    for step in range(3000):
        clock.advance(1.0)
        mon.step(step, **healthy(step, rng))
        if step in (999, 2999):
            sizes.append(len(json.dumps(mon.state_dict(), allow_nan=False)))
    assert sizes[1] < 1.2 * sizes[0]  # windows are bounded: 3x the steps, about the same size
    mon.set_threshold("grad_norm", 7.5, "error")
    other = Monitor(config(), "r", sinks=[])
    other.load_state_dict(roundtrip(mon.state_dict()))
    assert other.config.alert.rules.grad_norm.error == 7.5
    assert other.state_dict() == roundtrip(mon.state_dict())


def test_a_restarted_process_does_not_time_the_stop_as_a_step():
    clock = FakeClock()
    rng = random.Random(2)
    mon = Monitor(config(), "r", sinks=[], clock=clock)
    for step in range(400):
        clock.advance(1.0)
        mon.step(step, **healthy(step, rng))
    state = roundtrip(mon.state_dict())
    clock.advance(3600.0)  # an hour down
    for keep, stalls in ((True, True), (False, False)):
        resumed = Monitor(config(alert={"rules": {"step_stall": {"window": 10}}}), "r", sinks=[], clock=clock)
        with pytest.raises(StateError, match="other settings for step_stall"):
            resumed.load_state_dict(state)  # not the config it was saved with
        resumed = Monitor(config(), "r", sinks=[], clock=clock)
        resumed.load_state_dict(state, continue_clock=keep)
        events = []
        for step in range(400, 420):
            clock.advance(1.0)
            events += resumed.step(step, **healthy(step, rng))
        assert any(e.rule == "step_stall" for e in events) is stalls


@pytest.mark.parametrize(("damage", "error"), [
    (lambda s: s.update(version=99), "version 99, this msmon reads version 1"),
    (lambda s: s.update(format="x"), "not a monitor state"),
    (lambda s: s.pop("devices"), "damaged monitor state"),
    (lambda s: s["devices"]["0"]["rules"]["loss_spike"]["detector"].pop("window"), r"missing: window.*another msmon"),
    (lambda s: s["devices"]["0"]["rules"]["loss_spike"]["detector"].update(
        window={"$obj": "os:system", "attrs": {}}), "is not a class a monitor state may hold"),
    (lambda s: s["devices"]["0"]["rules"]["loss_spike"]["gate"].update(firing={"$enum": "msmon.contract.wire:Severity",
                                                                              "value": "LOUD"}), "damaged"),
    (lambda s: s.update(levels=[[["a", None]]]), "saved level"),
])
def test_a_damaged_or_foreign_state_is_a_clear_error_and_changes_nothing(damage, error):
    rng = random.Random(3)
    mon = Monitor(config(), "r", sinks=[], clock=FakeClock())
    for step in range(200):
        mon.step(step, **healthy(step, rng))
    state = roundtrip(mon.state_dict())
    before = copy.deepcopy(state)
    damage(state)
    with pytest.raises(StateError, match=error):
        mon.load_state_dict(state)
    assert roundtrip(mon.state_dict()) == before


def test_values_json_has_no_word_for_come_back_equal_through_json():
    from collections import deque

    from msmon.contract.wire import Severity

    value = {"nan": float("nan"), "inf": float("-inf"), "t": (1, 2.5), "d": deque([1, 2], maxlen=3),
             "s": {"b", "a"}, Severity.ERROR: [None, True, "x"]}
    back = decode(json.loads(json.dumps(encode(value), allow_nan=False)))
    assert back["nan"] != back["nan"] and back["inf"] == float("-inf") and back["t"] == (1, 2.5)
    assert back["d"] == deque([1, 2]) and back["d"].maxlen == 3 and back["s"] == {"a", "b"}
    assert back[Severity.ERROR] == [None, True, "x"]
    with pytest.raises(TypeError, match="cannot save a bytes"):
        encode(b"x")
