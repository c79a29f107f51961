"""The cross-rank view and rules (bot/ranks): pure, fed envelopes and a clock."""

from __future__ import annotations

import math

import pytest

from bot.config import RanksConfig, load_bot_config
from bot.ranks import RULES, check, marks
from bot.ranks.stats import Spread, others
from bot.ranks.view import RankViews
from bot.receivers import Message
from bot.receivers.render import escape_slack, ranks_text, title
from msmon.config.errors import ConfigError
from msmon.contract.wire import Envelope, Event, Heartbeat, Sample, Severity, Status


def env(rank: int, step: int, now: float, *, step_time: float = 0.1, loss: float = 1.0,
        local: float | None = 2.0, host: str = "node-a", run: str = "r", data_time: float | None = None) -> Envelope:
    return Envelope(run_id=run, device=str(rank), sent_at=now, rank=rank, host=host, samples=[Sample(
        run_id=run, device=str(rank), step=step, time=now, loss=loss, grad_norm=5.0, local_grad_norm=local,
        step_time=step_time, tokens_per_s=1000.0 / step_time, data_time=data_time)])


class Sim:
    """Ranks reporting to a view every second; `check` runs the rules at that time."""

    def __init__(self, n: int, cfg: RanksConfig | None = None) -> None:
        self.cfg = cfg or RanksConfig()
        self.views = RankViews(self.cfg.max_runs, self.cfg.max_ranks, self.cfg.history)
        self.n, self.now, self.step = n, 1000.0, 0

    def tick(self, skip: frozenset[int] = frozenset(), **per_rank: dict[int, float]) -> list[Event]:
        self.now += 1.0
        self.step += 10
        for r in range(self.n):
            if r in skip:
                continue
            kw = {k: v[r] for k, v in per_rank.items() if r in v}
            self.views.envelope(env(r, self.step - kw.pop("lag", 0), self.now, **kw), self.now)
        return check(self.views, self.cfg, self.now)


def fired(events: list[Event], rule: str) -> list[tuple[str, str, str]]:
    return [(e.device, e.severity.value, e.status.value) for e in events if e.rule == rule]


def test_spread_is_median_mad_min_max_and_others_leave_one_out():
    s = Spread.of([1.0, 2.0, 3.0, 100.0, None, math.nan])
    assert s is not None and (s.n, s.median, s.low, s.high) == (4, 2.5, 1.0, 100.0)
    assert s.sigma == pytest.approx(1.4826 * 1.0)
    o = others({"0": 0.1, "1": 0.3})
    assert o["0"].median == 0.3 and o["1"].median == 0.1  # each against its only peer
    many = others({str(i): float(i) for i in range(32)})
    assert len({id(v) for v in many.values()}) == 1  # one sort for all


def test_rules_are_declared_in_order_with_one_shape():
    assert [r.name for r in RULES] == ["rank_missing", "rank_straggler", "rank_outlier", "step_skew"]


def test_a_slow_rank_is_a_straggler_after_the_checks_and_only_it():
    sim = Sim(3)
    out: list[Event] = []
    for _ in range(6):
        out += sim.tick(step_time={2: 0.35})
    assert fired(out, "rank_straggler") == [("2", "WARNING", "firing")]
    ev = next(e for e in out if e.rule == "rank_straggler")
    assert "rank 2" in ev.message and "node-a" in ev.message and ev.hint
    assert not fired(out, "rank_outlier") and not fired(out, "rank_missing")
    # it recovers: resolved once its own pace (median of its recent steps) is back
    back: list[Event] = []
    for _ in range(sim.cfg.history + 1):
        back += sim.tick()
    assert fired(back, "rank_straggler") == [("2", "WARNING", "resolved")]


def test_one_slow_step_is_not_a_straggler():
    sim = Sim(4)
    out = sim.tick(step_time={1: 5.0})
    for _ in range(8):
        out += sim.tick()
    assert not fired(out, "rank_straggler")


def test_two_ranks_the_slower_is_named():
    sim = Sim(2)
    out: list[Event] = []
    for _ in range(5):
        out += sim.tick(step_time={1: 0.2})
    assert fired(out, "rank_straggler") == [("1", "WARNING", "firing")]


LOCKSTEP = {r: 0.05 for r in range(4)}  # every rank's wall step time is the slowest one's


def test_in_lockstep_the_rank_that_waits_for_its_input_is_the_straggler_and_only_it():
    sim = Sim(4)
    out: list[Event] = []
    for i in range(6):
        waits = {r: 0.0002 + 0.00005 * ((r + i) % 3) for r in range(4)} | {2: 0.03 + 0.001 * (i % 2)}
        out += sim.tick(step_time=LOCKSTEP, data_time=waits)
    assert fired(out, "rank_straggler") == [("2", "WARNING", "firing")]
    ev = next(e for e in out if e.rule == "rank_straggler")
    assert ev.metric == "data_time" and ev.value == pytest.approx(0.0305, abs=6e-4)
    assert "rank 2" in ev.message and "device 2" in ev.message and "node-a" in ev.message, ev.message
    assert "input wait" in ev.message and "60% of its 0.05 s step" in ev.message, ev.message
    back: list[Event] = []
    for _ in range(sim.cfg.history + 1):  # its pipeline is fast again: resolved once its usual wait is back
        back += sim.tick(step_time=LOCKSTEP, data_time=dict.fromkeys(range(4), 0.0002))
    assert fired(back, "rank_straggler") == [("2", "WARNING", "resolved")]


def test_an_input_wait_small_against_the_step_is_no_straggler_however_many_times_the_others():
    sim = Sim(4)
    out: list[Event] = []
    for _ in range(8):  # 20x the others' wait, but 4% of its step (under straggler_wait_share 0.1)
        out += sim.tick(step_time=LOCKSTEP, data_time=dict.fromkeys(range(4), 0.0001) | {1: 0.002})
    assert not fired(out, "rank_straggler")
    out = []
    for _ in range(8):  # noisy waits on every rank, none apart
        out += sim.tick(step_time=LOCKSTEP, data_time={0: 0.004, 1: 0.009, 2: 0.006, 3: 0.012})
    assert not fired(out, "rank_straggler")


def test_one_long_input_wait_is_not_a_straggler():
    sim = Sim(3)
    out = sim.tick(step_time=LOCKSTEP, data_time={0: 0.0002, 1: 0.0002, 2: 2.0})  # an epoch's first batch
    for _ in range(8):
        out += sim.tick(step_time=LOCKSTEP, data_time=dict.fromkeys(range(3), 0.0002))
    assert not fired(out, "rank_straggler")


def test_without_input_waits_the_step_time_still_names_the_straggler():
    sim = Sim(3)
    out: list[Event] = []
    for _ in range(6):  # ranks that report data_time, none apart, and one whose steps are slower (no lockstep)
        out += sim.tick(step_time={2: 0.35}, data_time=dict.fromkeys(range(3), 0.001))
    ev = next(e for e in out if e.rule == "rank_straggler")
    assert (ev.device, ev.metric) == ("2", "step_time")


def test_the_notifier_reports_its_input_wait_per_step_over_the_samples_span():
    from notifier import Monitor
    from tests.fakes.helpers import FakeClock, ListSink, config

    clock, sink = FakeClock(), ListSink()
    mon = Monitor(config(step_interval=5), "r", sinks=[sink], clock=clock)
    for step in range(11):
        clock.advance(0.1)
        mon.step(step, loss=1.0, data_time=0.02 if step < 8 else 0.04)
    mon.step(11, loss=1.0)
    mon.close()
    assert [s.step for s in sink.samples] == [0, 5, 10]
    assert sink.samples[0].data_time is None  # no span yet, as its step time
    assert sink.samples[1].data_time == pytest.approx(0.02) and sink.samples[1].step_time == pytest.approx(0.1)
    assert sink.samples[2].data_time == pytest.approx((2 * 0.02 + 3 * 0.04) / 5)  # steps 6 to 10
    plain = ListSink()
    other = Monitor(config(step_interval=5), "r", sinks=[plain], clock=FakeClock())
    for step in range(6):
        other.step(step, loss=1.0)
    other.close()
    assert [s.data_time for s in plain.samples] == [None, None]  # a loop that does not time its input


def test_an_outlier_loss_is_a_warning_then_an_error_when_it_persists():
    cfg = RanksConfig(outlier_checks=2, outlier_error_checks=4)
    sim = Sim(8, cfg)
    out: list[Event] = []
    for i in range(8):  # from the third sample on, its median is the rank's typical loss
        out += sim.tick(loss={r: 1.0 + 0.01 * r for r in range(8)} | {5: 3.0 + i})
    assert fired(out, "rank_outlier") == [("5", "WARNING", "firing"), ("5", "ERROR", "firing")]
    assert "loss" in next(e for e in out if e.rule == "rank_outlier").message
    back: list[Event] = []
    for _ in range(cfg.history):  # resolved once its own median is back among the others
        back += sim.tick()
    assert fired(back, "rank_outlier") == [("5", "ERROR", "resolved")]


def test_one_odd_batch_is_not_an_outlier_and_an_old_report_does_not_become_one():
    sim = Sim(6, RanksConfig(outlier_checks=2))
    out = sim.tick(loss={2: 50.0})
    for _ in range(4):
        out += sim.tick()
    assert not fired(out, "rank_outlier")
    for _ in range(5):  # rank 4's loss stays apart, then it reports nothing new: no streak from old numbers
        out += sim.tick(loss={4: 9.0})
    assert fired(out, "rank_outlier") == [("4", "WARNING", "firing")]
    run = sim.views.runs["r"]
    assert run.firing[("rank_outlier", "4")].streak >= 2


def test_the_ranks_own_grad_norm_is_compared_not_the_reduced_one():
    sim = Sim(4, RanksConfig(outlier_checks=1))
    out = sim.tick(local={3: 40.0}) + sim.tick(local={3: 40.0}) + sim.tick(local={3: 40.0})
    assert fired(out, "rank_outlier") == [("3", "WARNING", "firing")]
    assert "grad norm" in out[0].message


def test_two_ranks_that_disagree_name_no_outlier():
    sim = Sim(2, RanksConfig(outlier_checks=1))
    assert not fired(sim.tick(loss={1: 20.0}), "rank_outlier")


def test_nan_is_left_to_the_jobs_rules():
    sim = Sim(4, RanksConfig(outlier_checks=1))
    assert not fired(sim.tick(loss={0: math.nan}), "rank_outlier")


def test_a_silent_rank_is_missing_while_the_others_go_on_and_not_when_all_stop():
    cfg = RanksConfig(missing_after=5.0)
    sim = Sim(3, cfg)
    sim.tick()
    out: list[Event] = []
    for _ in range(7):
        out += sim.tick(skip=frozenset({1}))
    assert fired(out, "rank_missing") == [("1", "ERROR", "firing")]
    assert "stopped reporting" in next(e for e in out if e.rule == "rank_missing").message
    # everyone falls silent (job_gone is the watchdog's): still missing, nothing new, nothing resolved
    sim.now += 60
    assert check(sim.views, cfg, sim.now) == []
    assert fired(sim.tick(), "rank_missing") == [("1", "ERROR", "resolved")]  # it came back


def test_a_rank_that_finished_is_not_missing():
    sim = Sim(2, RanksConfig(missing_after=5.0))
    sim.tick()
    sim.views.envelope(Envelope(run_id="r", device="1", sent_at=sim.now, rank=1, heartbeats=[
        Heartbeat(run_id="r", device="1", time=sim.now, step=sim.step, final=True)]), sim.now)
    out: list[Event] = []
    for _ in range(8):
        out += sim.tick(skip=frozenset({1}))
    assert not fired(out, "rank_missing")


def test_step_skew_beyond_the_bound_warns_on_the_rank_behind():
    sim = Sim(3, RanksConfig(skew_steps=50, skew_checks=2))
    out: list[Event] = []
    for _ in range(3):
        out += sim.tick(lag={0: 80})
    assert fired(out, "step_skew") == [("0", "WARNING", "firing")]
    assert "80 steps behind" in next(e for e in out if e.rule == "step_skew").message


def test_memory_is_bounded_by_ranks_and_runs():
    views = RankViews(max_runs=2, max_ranks=3, history=4)
    for run in ("a", "b", "c"):
        for r in range(5):
            views.envelope(env(r, 1, 1.0, run=run), 1.0)
    assert list(views.runs) == ["b", "c"]
    assert views.known("c") == 3 and views.runs["c"].refused == 2
    for step in range(2, 20):
        views.envelope(env(0, step, 1.0, run="c"), 1.0)
    assert len(views.runs["c"].members["0"].history) == 4


def test_marks_say_what_is_off_now_without_moving_a_streak():
    sim = Sim(4, RanksConfig(outlier_checks=5))
    for _ in range(3):
        sim.tick(loss={2: 9.0})
    streaks = {k: v.streak for k, v in sim.views.runs["r"].firing.items()}
    found = marks(sim.views.runs["r"], sim.cfg, sim.now)
    assert list(found) == ["2"] and found["2"][0].metric == "loss"
    assert {k: v.streak for k, v in sim.views.runs["r"].firing.items()} == streaks


def test_the_global_view_has_both_grad_norms():
    sim = Sim(4)
    sim.tick(local={0: 1.0, 1: 2.0, 2: 3.0, 3: 6.0})
    run = sim.views.runs["r"]
    assert run.mean_local_norm() == 3.0
    reduced = run.spread("grad_norm")
    assert reduced is not None and reduced.median == 5.0
    loss = run.spread("loss")
    assert loss is not None and loss.n == 4


def _msg(n: int, known: int, rule: str = "loss_nan") -> Message:
    order = [17] + [d for d in range(64) if d != 17]
    evs = [Event(run_id="run-<1>", device=str(d), step=12_400, time=0.0, rule=rule, severity=Severity.ERROR,
                 status=Status.FIRING, value=math.nan, threshold=0.0, message="NaN") for d in order[:n]]
    return Message(key="k", run_id="run-<1>", project="p", rule=rule, severity=Severity.ERROR,
                   status=Status.FIRING, events=evs, ranks={e.device: int(e.device) for e in evs}, known_ranks=known)


def test_a_storm_says_how_many_of_the_runs_ranks_and_the_first():
    msg = _msg(64, 64)
    assert ranks_text(msg) == "on 64/64 ranks (first: rank 17 at step 12,400)"
    assert "run run-&lt;1&gt;, on 64/64 ranks" in title(msg, escape_slack)
    assert ranks_text(_msg(1, 8)) == "on rank 17 (1/8 ranks) at step 12,400"
    single = Message(key="k", run_id="r", project="p", rule="x", severity=Severity.ERROR, status=Status.FIRING,
                     events=_msg(1, 0).events)
    assert ranks_text(single) is None and "device 17" in title(single)


def test_settings_are_bounded_and_checked():
    cfg = load_bot_config({"bot": {"ranks": {"period": 1, "straggler_ratio": 2.0}}})
    assert cfg.ranks.period == 1 and cfg.ranks.straggler_ratio == 2.0
    with pytest.raises(ConfigError, match="ranks.max_ranks"):
        load_bot_config({"bot": {"ranks": {"max_ranks": 10**9}}})
    with pytest.raises(ConfigError, match="outlier_error_checks"):
        load_bot_config({"bot": {"ranks": {"outlier_checks": 5, "outlier_error_checks": 2}}})


def test_the_edge_raises_through_emit_and_retries_what_the_ingest_refused():
    from bot.ranks.watch import RankWatch

    sim = Sim(3, RanksConfig(missing_after=5.0))
    sim.tick()
    for _ in range(6):
        sim.tick(skip=frozenset({2}))
    sim.views.runs["r"].firing.clear()  # as if nothing had been raised yet
    calls: list[tuple[str, str, int | None]] = []
    refuse = [True]

    def emit(ev: Event, project: str, labels: dict[str, str], now: float, rank: int | None) -> int:
        if refuse[0]:
            raise OSError("disk full")
        calls.append((ev.rule, project, rank))
        return 1

    woken: list[int] = []
    watch = RankWatch(sim.views, sim.cfg, emit, lambda run: {"project": "llm", "labels": {}}, lambda: sim.now,
                      lambda: woken.append(1))
    assert watch.check() == 0 and watch.failed == 1 and ("rank_missing", "2") not in sim.views.runs["r"].firing
    refuse[0] = False
    assert watch.check() == 1 and calls == [("rank_missing", "llm", 2)] and woken == [1]
    assert watch.check() == 0  # raised once


def test_the_storm_text_escapes_the_device_it_names_in_every_markup():
    from bot.receivers.render import escape_feishu, escape_html

    ev = Event(run_id="r", device="<!channel>", step=5, time=0.0, rule="nonfinite", severity=Severity.ERROR,
               status=Status.FIRING, value=math.nan, threshold=0.0, message="NaN")
    other = msgspec_replace(ev, device="1")
    msg = Message(key="k", run_id="r", project="p", rule="nonfinite", severity=Severity.ERROR,
                  status=Status.FIRING, events=[ev, other], known_ranks=4)
    assert "(first: device &lt;!channel&gt; at step 5)" in title(msg, escape_slack)
    assert "on 2/4 devices" in title(msg, escape_html) and "<!channel>" not in title(msg, escape_html)
    assert "&lt;\\!channel&gt;" in title(msg, escape_feishu)  # the ! backslashed: no Feishu markup


def msgspec_replace(ev: Event, **kw: object) -> Event:
    import msgspec

    return msgspec.structs.replace(ev, **kw)


def test_a_heartbeat_on_its_own_keeps_the_rank_of_its_host_and_device_alive():
    views = RankViews(10, 100, 4)
    views.envelope(Envelope(run_id="r", device="0", sent_at=1.0, rank=0, host="a", samples=[
        Sample(run_id="r", device="0", step=1, time=1.0, step_time=0.1)]), 1.0)
    views.envelope(Envelope(run_id="r", device="0", sent_at=1.0, rank=8, host="b", samples=[
        Sample(run_id="r", device="0", step=1, time=1.0, step_time=0.1)]), 1.0)
    views.heartbeat(Heartbeat(run_id="r", device="0", time=9.0, step=2, host="b"), 9.0)
    run = views.runs["r"]
    assert (run.members["0"].last_seen, run.members["8"].last_seen) == (1.0, 9.0)
