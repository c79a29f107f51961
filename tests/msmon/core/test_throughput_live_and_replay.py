"""throughput_drop judges the same way live and in a replay: by the samples' time when known, else by steps,
never by how fast `Monitor.step` is called; short dips are averaged out, repeated ones are a WARNING at most."""

from __future__ import annotations

import random

from msmon.contract.wire import Severity, Status
from msmon.offline.readers import Row
from msmon.offline.replay import replay, replay_monitor
from notifier import Monitor
from tests.fakes.helpers import FakeClock, config

RULES = {"rules": {name: {"enable": False} for name in ("step_stall", "loss_spike", "convergence")}}


def cfg(**rule):
    return config(metrics=["loss", "throughput"], alert={"baseline_steps": 0, **RULES,
                                                         "rules": {**RULES["rules"], "throughput_drop": rule}})


def throughput_rows(steps, drops=(), seed=0, dt=None):
    """Noisy tokens/s (2% noise) around 1000, at `factor` x that in each (start, end, factor) of `drops`;
    `dt`: seconds per step in a time column (None: no time column)."""
    rng = random.Random(seed)
    rows = []
    for step in range(1, steps + 1):
        factor = next((f for a, b, f in drops if a <= step < b), 1.0)
        rows.append(Row(step, loss=1.0, throughput=1000.0 * factor * (1 + rng.gauss(0, 0.02)),
                        time=None if dt is None else step * dt))
    return rows


def alerts(events):
    return [(e.step, e.severity) for e in events if e.rule == "throughput_drop" and e.status is Status.FIRING
            and not e.repeat]


def live(rows, conf):
    """The live API fed recorded rates as fast as a loop goes (1 ms a call on its clock), no time= given."""
    clock = FakeClock()
    mon = Monitor(conf, "live", sinks=[], clock=clock)
    events = []
    for r in rows:
        clock.advance(0.001)
        events += mon.step(r.step, loss=r.loss, throughput=r.throughput)
    return events


def test_a_sustained_drop_is_an_error_live_and_in_a_replay_alike():
    rows = throughput_rows(1500, drops=[(1000, 1500, 0.3)])
    live_alerts = alerts(live(rows, cfg()))
    replayed = alerts(replay(rows, replay_monitor(cfg(), "replay")))
    assert live_alerts == replayed
    assert live_alerts and live_alerts[-1][1] is Severity.ERROR
    first = live_alerts[0][0]
    assert 1040 <= first <= 1060  # 5 spans of 10 steps after the drop began, judged by steps alone


def test_dips_of_3_to_20_steps_raise_nothing_and_repeated_ones_a_warning_at_most():
    rng = random.Random(3)
    few = [(s, s + rng.randint(3, 20), 0.2) for s in (300, 700)]
    assert alerts(live(throughput_rows(1200, few), cfg())) == []
    many = [(s, s + rng.randint(3, 20), 0.2) for s in range(300, 2400, 60)]
    assert alerts(live(throughput_rows(1000, many), cfg())) == []  # while the baseline fills: a rate settling
    got = alerts(live(throughput_rows(2700, many), cfg()))
    assert got and {sev for _, sev in got} == {Severity.WARNING}
    # the dips stop at 2400: the warning resolves once they have not repeated for a window of spans
    events = live(throughput_rows(5000, many), cfg())
    assert any(e.rule == "throughput_drop" and e.status is Status.RESOLVED for e in events)


def test_with_the_samples_time_a_drop_must_also_last_min_seconds():
    """50 ms steps: a 150-step drop is 7.5 s, under one span of 10 s, let alone the 5 a drop must hold."""
    short = throughput_rows(8000, drops=[(6000, 6150, 0.2)], dt=0.05)
    assert alerts(replay(short, replay_monitor(cfg(), "r"))) == []
    long = throughput_rows(12000, drops=[(8000, 12000, 0.2)], dt=0.05)
    got = alerts(replay(long, replay_monitor(cfg(), "r")))
    assert got and got[0][1] is Severity.ERROR and 8000 + 5 * 200 <= got[0][0] <= 8000 + 6 * 200


def test_the_samples_time_is_read_live_when_given():
    """The live API with time=: spans of 10 s of the job's time (here 1 s steps), not of the loop's."""
    rows = throughput_rows(400, drops=[(200, 400, 0.3)], dt=1.0)
    mon = Monitor(cfg(), "live", sinks=[], clock=FakeClock())
    events = []
    for r in rows:
        events += mon.step(r.step, loss=r.loss, throughput=r.throughput, time=r.time)
    got = alerts(events)
    assert got and 240 <= got[0][0] <= 260 and got[-1][1] is Severity.ERROR


def test_expected_rate_is_judged_per_span_without_a_median_to_learn():
    conf = config(metrics=["loss", "throughput"], alert={"baseline_steps": 0, **RULES,
                  "rules": {**RULES["rules"], "throughput_drop": {"expected": 100.0}}})
    clock = FakeClock()
    mon = Monitor(conf, "mf", sinks=[], clock=clock)
    events = []
    for step in range(1, 80):
        clock.advance(1.0)
        events += mon.step(step, loss=1.0, samples=40)  # 40 samples/s against an expected 100
    got = [e for e in events if e.rule == "throughput_drop" and e.status is Status.FIRING]
    assert got and got[0].severity is Severity.ERROR and got[0].step <= 60
    # a span: 10 s of the job's time, at 1 s per step
    assert "over 10 steps and 10 s" in got[0].message and "below the expected 100 samples/s" in got[0].message
