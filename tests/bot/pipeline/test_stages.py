"""The bot's pure pipeline stages, fed directly (no I/O, clock passed in)."""

from __future__ import annotations

import pytest

from bot.config import PipelineConfig, Route
from bot.pipeline import DELIVERY, STAGES, acked, dedup, group, inhibit, ratelimit, route, silence
from bot.pipeline.flow import Context, Due, Notification, NotifyState, Round, run_stages
from bot.pipeline.ratelimit import RateLimiter, TokenBucket
from bot.pipeline.schedule import Failed, OutboxRow, Scheduler
from msmon.contract.wire import Event, Severity, Status


def ev(sev=Severity.WARNING, status=Status.FIRING, run="r", rule="loss_spike", device="0") -> Event:
    return Event(run_id=run, device=device, step=1, time=0.0, rule=rule, severity=sev, status=status, value=1.0,
                 threshold=0.5, message="m")


def test_dedup_repeat_interval_and_rises():
    s = NotifyState()
    assert dedup.decide(ev(), s, 0.0, 60)
    s = dedup.record(ev(), s, 0.0)
    assert not dedup.decide(ev(), s, 59.0, 60)  # same severity inside repeat_interval
    assert dedup.decide(ev(), s, 60.0, 60)  # ... and after it
    assert dedup.decide(ev(Severity.ERROR), s, 1.0, 60)  # a rise always passes
    assert dedup.decide(ev(status=Status.RESOLVED), s, 1.0, 60)
    s = dedup.record(ev(status=Status.RESOLVED), s, 1.0)
    assert not dedup.decide(ev(status=Status.RESOLVED), s, 2.0, 60)  # resolved once
    assert dedup.decide(ev(), s, 2.0, 60)  # a new episode
    assert not dedup.decide(ev(status=Status.RESOLVED), NotifyState(), 0.0, 60)  # nothing was sent


def test_the_notification_log_keeps_the_step_of_the_alert_posted_through_reminders():
    import msgspec

    def at(step: int, sev: Severity = Severity.WARNING, status: Status = Status.FIRING) -> Event:
        return msgspec.structs.replace(ev(sev, status), step=step)

    s = dedup.record(at(650), NotifyState(), 0.0)
    assert s.step == 650
    assert dedup.record(at(900), s, 100.0).step == 650  # a reminder is of the alert posted at 650
    assert dedup.record(at(700, Severity.ERROR), s, 1.0).step == 700  # a rise is a new alert
    s = dedup.record(at(950, status=Status.RESOLVED), s, 2.0)
    assert s.resolved and s.step == 650
    assert dedup.record(at(1200), s, 3.0).step == 1200  # a new episode


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
              Route(receiver="slack", channel="C2", project="cv", labels={"team": "vision"}),
              Route(receiver="slack", channel="C3", project="*")]
    assert route.route_for("llm", {}, Severity.ERROR, routes).channel == "C1"
    assert route.route_for("llm", {}, Severity.WARNING, routes).channel == "C3"
    assert route.route_for("cv", {"team": "vision"}, Severity.ERROR, routes).channel == "C2"
    assert route.route_for("cv", {}, Severity.ERROR, []) is route.CONSOLE
    # labels are the job's word: project llm's job saying team: vision stays out of cv's channel
    assert route.route_for("llm", {"team": "vision"}, Severity.WARNING, routes).channel == "C3"
    unscoped = [Route(receiver="slack", channel="C9", labels={"team": "vision"})]  # bot.yaml refuses it
    assert route.route_for("cv", {"team": "vision"}, Severity.ERROR, unscoped) is route.CONSOLE


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


def ctx(now: float = 100.0, error_firing: bool = False, silences: list[silence.Silence] | None = None,
        routes: list[Route] | None = None) -> Context:
    return Context(now, PipelineConfig(repeat_interval=60.0, group_wait=5.0), routes or [], "llm", {},
                   silences or [], error_firing)


def test_the_stages_are_declared_in_order_with_one_shape():
    assert [s.name for s in STAGES] == ["dedup", "acked", "inhibit", "silence", "route", "group"]
    assert [s.name for s in DELIVERY] == ["group_due", "rate_limit"]


def test_a_new_alert_comes_out_of_the_stages_routed_grouped_and_due():
    routes = [Route(receiver="slack", channel="C1")]
    n, dropped_by = run_stages(STAGES, ctx(routes=routes), Notification(ev(), "r|loss_spike|0"))
    assert dropped_by is None
    assert (n.kind, n.receiver, n.channel, n.thread) == ("alert", "slack", "C1", True)  # a WARNING: in the thread
    assert (n.key, n.due_at) == (group.group_key(ev()), 105.0)  # group_wait
    n, _ = run_stages(STAGES, ctx(), Notification(ev(Severity.ERROR), "r|loss_spike|0"))
    assert (n.receiver, n.thread, n.due_at) == ("console", False, 100.0)  # no route: the console; an ERROR at once


def test_each_stage_drops_what_it_is_for_and_names_itself():
    sent = NotifyState(Severity.WARNING, 90.0)
    cases = [(ctx(), Notification(ev(), "fp", sent), "dedup"),  # a repeat inside repeat_interval
             (ctx(now=200.0), Notification(ev(), "fp", sent, acked=True), "acked"),  # a reminder of an acked alert
             (ctx(error_firing=True), Notification(ev(), "fp"), "inhibit"),
             (ctx(silences=[silence.Silence(id=1, expires_at=1e9)]), Notification(ev(), "fp"), "silence")]
    for c, n, stage in cases:
        out, dropped_by = run_stages(STAGES, c, n)
        assert dropped_by is not None and dropped_by.name == stage
        assert out.event is n.event
    reminder, dropped_by = run_stages(STAGES, ctx(now=200.0), Notification(ev(), "fp", sent))
    assert dropped_by is None and reminder.kind == "repeat"
    rise = Notification(ev(Severity.ERROR), "fp", sent, acked=True)
    assert acked.stage(ctx(), rise) is rise  # a rise in severity still goes out
    resolution = Notification(ev(status=Status.RESOLVED), "fp", sent, acked=True)
    assert acked.stage(ctx(), resolution) is resolution
    out = dedup.stage(ctx(), resolution)
    assert out is not None and out.kind == "resolve"


def test_a_firing_error_that_reaches_inhibit_holds_the_warnings_after_it():
    c = ctx()
    assert inhibit.stage(c, Notification(ev(), "w0")) is not None  # before the ERROR: goes out
    assert inhibit.stage(c, Notification(ev(Severity.ERROR), "e")) is not None
    assert c.error_firing and inhibit.stage(c, Notification(ev(), "w1")) is None
    assert inhibit.stage(c, Notification(ev(status=Status.RESOLVED), "w2")) is not None  # resolutions pass


def outbox_row(id: int, channel: str = "C1", posted_ref: str | None = None) -> OutboxRow:
    return OutboxRow(id=id, created_at=0.0, receiver="slack", channel=channel, kind="alert", key="k", run_id="r",
                     payload="{}", posted_ref=posted_ref)


def test_group_due_leaves_out_unwritten_rows_and_remembers_posts():
    rnd = Round(Scheduler(), RateLimiter(10.0, 10.0, 10.0, 5), posted={2: "171.01"}, unwritten={3})
    due = group.due(rnd, Due([outbox_row(1), outbox_row(2), outbox_row(3)], at=0.0))
    assert due is not None
    assert [(r.id, r.posted_ref) for r in due.rows] == [(1, None), (2, "171.01")]
    assert group.due(rnd, Due([outbox_row(3)], at=0.0)) is None  # nothing left to try now


def test_rate_limit_waits_for_a_paced_lane_then_for_tokens():
    scheduler = Scheduler()
    rnd = Round(scheduler, RateLimiter(per_channel=1.0, per_run=10.0, global_rate=10.0, burst=1), {}, ())
    assert ratelimit.stage(rnd, Due([outbox_row(1)], at=0.0)).wait == 0.0  # the token is taken
    assert ratelimit.stage(rnd, Due([outbox_row(2)], at=0.0)).wait == 1.0  # the channel's bucket is empty
    scheduler.after([outbox_row(3, channel="C2")], Failed("rate_limited", "429", retry_after=30.0), 0.0)  # paces C2
    assert ratelimit.stage(rnd, Due([outbox_row(4, channel="C2")], at=10.0)).wait == 20.0


def test_metric_windows_are_fixed_size_rings_that_keep_none_and_nan_apart():
    import math

    from bot.store.windows import Windows
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
