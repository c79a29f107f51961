"""Issue 13 part 4: a level shift stays visible until the value returns or a person acknowledges it; an `ack` in
chat reaches the job (an `acknowledge` command every rank applies), which takes the held level as the new normal."""

from __future__ import annotations

import random
import time

import pytest

from msmon.contract.wire import Command, Envelope, Poll, PollAnswer, Sample, Severity, Status, decode, encode
from notifier import Monitor
from notifier.control import JobControl
from tests.fakes.helpers import FakeClock, config
from tests.fakes.records import envelope, event


def shifted_run(mon: Monitor, steps: range, rng: random.Random, level: float) -> list:
    events = []
    for step in steps:
        events += mon.step(step, loss=level + rng.gauss(0, 0.02))
    return events


def loss_events(events, status=Status.FIRING):
    return [e for e in events if e.rule == "loss_spike" and e.status is status]


def held_monitor():
    """A loss that steps from 2.0 to 3.0 at step 300 and stays: loss_spike fires and holds its pre-shift median."""
    rng = random.Random(5)
    mon = Monitor(config(metrics=["loss"], alert={"baseline_steps": 0, "alert_interval": 0}), "run-42", sinks=[],
                  clock=FakeClock())
    shifted_run(mon, range(1, 300), rng, 2.0)
    fired = shifted_run(mon, range(300, 400), rng, 3.0)
    assert loss_events(fired) and not loss_events(fired, Status.RESOLVED)
    return mon, rng


def test_without_an_ack_the_shift_stays_firing():
    mon, rng = held_monitor()
    later = shifted_run(mon, range(400, 1400), rng, 3.0)
    assert not loss_events(later, Status.RESOLVED)  # 1,000 samples on: still judged against the 2.0 before it


def test_an_acknowledge_command_makes_the_held_level_the_new_normal():
    mon, rng = held_monitor()
    ctl = JobControl(mon, None)
    ctl.take_commands([Command(id="c1", run_id="run-42", action="acknowledge", params={"rule": "loss_spike"},
                               apply_step=400, issued_by="@alice")])
    (res,) = ctl.apply(400)
    assert res.ok and res.command_id == "c1"
    assert "new normal on device(s) 0" in res.detail
    later = shifted_run(mon, range(400, 700), rng, 3.0)
    resolved = loss_events(later, Status.RESOLVED)
    assert resolved and resolved[0].step < 430  # learned afresh: clear samples from the first on
    assert not [e for e in loss_events(later) if e.step > resolved[0].step]  # 3.0 is normal now
    # a second ack has nothing left to accept
    ctl.take_commands([Command(id="c2", run_id="run-42", action="acknowledge", params={"rule": "loss_spike"},
                               apply_step=700)])
    (res,) = ctl.apply(700)
    assert res.ok and "no shift held" in res.detail


def test_acknowledge_of_a_rule_that_holds_nothing_says_so_and_of_an_unknown_rule_fails():
    mon, _ = held_monitor()
    assert "nothing to accept" in mon.acknowledge("nonfinite")
    with pytest.raises(ValueError, match="unknown rule 'loss_spik'; did you mean loss_spike"):
        mon.acknowledge("loss_spik")


def test_the_bot_sends_an_ack_on_to_the_job(tmp_path, monkeypatch, bot_server):
    """The real bot on loopback: `ack run-42/loss_spike` from `msmon cmd` acks the alert and queues `acknowledge`
    for the job, which its poll gets (with the rule) and answers."""
    pytest.importorskip("aiohttp")

    monkeypatch.setenv("MSMON_TEST_TOKEN", "job-token")
    monkeypatch.setenv("MSMON_OPERATOR", "operator-token")
    b = bot_server({"bot": {
        "port": 0, "state_path": str(tmp_path / "bot.sqlite"),
        "tokens": [{"project": "llm", "env": "MSMON_TEST_TOKEN"}],
        "routes": [{"receiver": "console"}], "console": {"charts_dir": str(tmp_path / "charts")},
        "commands": {"operators": [{"user": "cli:carol", "env": "MSMON_OPERATOR"}]}}})
    now = time.time()
    samples = [Sample(run_id="run-42", device="0", step=100 - 10 * k, time=now - k, loss=2.0)
               for k in range(20, -1, -1)]
    assert b.request("POST", "/v1/ingest", encode(Envelope(run_id="run-42", device="0", sent_at=now,
                                                          project="llm", samples=samples)))[0] == 202
    assert b.request("POST", "/v1/ingest", envelope([event(rule="loss_spike", sev=Severity.WARNING)]))[0] == 202
    code, body = b.request("POST", "/v1/commands", b'{"text": "ack run-42/loss_spike"}', token="operator-token")
    assert code == 200 and "cli:carol acknowledged loss_spike" in body["text"], body
    assert "The job takes the level it holds now as the new normal" in body["text"]
    code, got = b.request("POST", "/v1/commands/poll", encode(Poll(run_id="run-42", device="0", after=0)))
    assert code == 200
    (cmd,) = decode(encode(got), PollAnswer).commands
    assert (cmd.action, cmd.params, cmd.issued_by) == ("acknowledge", {"rule": "loss_spike"}, "cli:carol")
