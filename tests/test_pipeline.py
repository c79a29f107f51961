"""The bot's pure pipeline stages, fed directly (no I/O, clock passed in)."""

from __future__ import annotations

import pytest

from bot.config import Route
from bot.pipeline import dedup, group, inhibit, route, silence
from bot.pipeline.ratelimit import RateLimiter, TokenBucket
from msmon.contract.wire import Event, Severity, Status


def ev(sev=Severity.WARNING, status=Status.FIRING, run="r", rule="loss_spike", device="0") -> Event:
    return Event(run_id=run, device=device, step=1, time=0.0, rule=rule, severity=sev, status=status, value=1.0,
                 threshold=0.5, message="m")


def test_dedup_repeat_interval_and_rises():
    s = dedup.NotifyState()
    assert dedup.decide(ev(), s, 0.0, 60)
    s = dedup.record(ev(), s, 0.0)
    assert not dedup.decide(ev(), s, 59.0, 60)  # same severity inside repeat_interval
    assert dedup.decide(ev(), s, 60.0, 60)  # ... and after it
    assert dedup.decide(ev(Severity.ERROR), s, 1.0, 60)  # a rise always passes
    assert dedup.decide(ev(status=Status.RESOLVED), s, 1.0, 60)
    s = dedup.record(ev(status=Status.RESOLVED), s, 1.0)
    assert not dedup.decide(ev(status=Status.RESOLVED), s, 2.0, 60)  # resolved once
    assert dedup.decide(ev(), s, 2.0, 60)  # a new episode
    assert not dedup.decide(ev(status=Status.RESOLVED), dedup.NotifyState(), 0.0, 60)  # nothing was sent


def test_inhibit_holds_warnings_of_a_run_with_an_error():
    assert inhibit.inhibited(ev(), True)
    assert not inhibit.inhibited(ev(Severity.ERROR), True)
    assert not inhibit.inhibited(ev(status=Status.RESOLVED), True)
    assert not inhibit.inhibited(ev(), False)
    assert not inhibit.inhibited(ev(), True, enabled=False)


def test_silence_matchers_and_expiry():
    s = silence.Silence(id=1, expires_at=100.0, run_id="r", rule="loss_spike")
    assert silence.silenced_by(ev(), [s], 50.0) is s
    assert silence.silenced_by(ev(rule="grad_norm"), [s], 50.0) is None
    assert silence.silenced_by(ev(run="other"), [s], 50.0) is None
    assert silence.silenced_by(ev(), [s], 100.0) is None  # expired
    anything = silence.Silence(id=2, expires_at=100.0)
    assert silence.silenced_by(ev(run="x", device="7"), [anything], 0.0) is anything


def test_group_keys_and_delays():
    assert group.group_key(ev(device="3")) == group.group_key(ev(device="9"))  # devices group together
    assert group.group_key(ev()) != group.group_key(ev(Severity.ERROR))
    assert group.delay(ev(Severity.ERROR), 5.0) == 0.0  # an ERROR does not wait
    assert group.delay(ev(), 5.0) == 5.0
    assert group.firing_key(ev(status=Status.RESOLVED)) == group.group_key(ev())


def test_route_first_match_by_project_severity_labels():
    routes = [Route(receiver="slack", channel="C1", project="llm", severity="ERROR"),
              Route(receiver="slack", channel="C2", labels={"team": "vision"}),
              Route(receiver="slack", channel="C3", project="*")]
    assert route.route_for("llm", {}, Severity.ERROR, routes).channel == "C1"
    assert route.route_for("llm", {}, Severity.WARNING, routes).channel == "C3"
    assert route.route_for("cv", {"team": "vision"}, Severity.ERROR, routes).channel == "C2"
    assert route.route_for("cv", {}, Severity.ERROR, []) is route.CONSOLE


def test_token_buckets_per_channel_run_and_global():
    b = TokenBucket(rate=1.0, burst=2, now=0.0)
    assert b.wait(0.0) == 0.0
    b.take(0.0)
    b.take(0.0)
    assert b.wait(0.0) == 1.0 and b.wait(0.5) == 0.5 and b.wait(1.0) == 0.0
    rl = RateLimiter(per_channel=1.0, per_run=0.5, global_rate=100.0, burst=2)
    assert rl.wait("C1", "r1", 0.0) == 0.0
    assert rl.wait("C1", "r2", 0.0) == 0.0  # the burst
    assert rl.wait("C1", "r3", 0.0) == 1.0  # the channel's bucket is empty: about 1 message/s
    assert rl.wait("C2", "r3", 0.0) == pytest.approx(0.01)  # another channel, but the global bucket is empty
    assert rl.wait("C2", "r3", 0.01) == 0.0
    assert rl.wait("C3", "r3", 0.02) == 0.0  # r3's burst used up now ...
    assert rl.wait("C4", "r3", 0.03) == pytest.approx(1.98)  # ... so its own bucket (0.5/s) holds the next one
    assert rl.wait("C1", "r1", 1.0) == 0.0


def test_metric_windows_are_fixed_size_rings_that_keep_none_and_nan_apart():
    import math

    from bot.windows import Windows
    from msmon.contract.wire import Sample

    w = Windows(per_device=3, max_runs=2)
    for step in range(5):
        w.add(Sample(run_id="r", device="0", step=step, time=float(step), loss=math.nan if step == 4 else 2.0,
                     grad_norm=None if step == 3 else 1.5))
    hist = w.history("r", "0")
    assert [s.step for s in hist] == [2, 3, 4]  # the last 3 only
    assert hist[1].grad_norm is None and hist[2].grad_norm == 1.5
    assert math.isnan(hist[2].loss) and hist[0].learning_rate is None
    assert w.latest("r")["0"].step == 4
    for run in ("a", "b"):
        w.add(Sample(run_id=run, device="0", step=0, time=0.0))
    assert list(w.runs) == ["a", "b"]  # max_runs: the least recently seen run went first
