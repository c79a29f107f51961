"""bot/ingest/overload.py: the level the ingest sheds at, from the bot's own backlog (how long its oldest waiting work
waits; the event loop's lag only while some work waits); hysteresis; what was shed. (`observe(x)` with one argument:
a wait of x s, no lag.)"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from bot.ingest.overload import Backlog, Level, Median, Overload, ShedCount, errors_first, table
from msmon.contract.wire import Envelope, Severity, encode
from tests.fakes.records import event, sample

STEPS = table(0.1, 0.5)
COOL = 15.0


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _target(lag: float) -> Level:
    return Level.WARNINGS if lag >= 0.5 else Level.SAMPLES if lag >= 0.1 else Level.NORMAL


lags = st.lists(st.tuples(st.floats(0, 2), st.floats(0, 10)), max_size=200)  # (lag, seconds until the next sample)


@given(lags)
def test_up_at_once_down_one_level_after_a_calm_cool(samples: list[tuple[float, float]]) -> None:
    clock = Clock()
    o = Overload(STEPS, COOL, clock)
    calm_since: dict[Level, float | None] = {}
    last_down = None
    for lag, dt in samples:
        before = o.level
        changed = o.observe(lag)
        assert (changed is not None) == (o.level != before)
        assert changed is None or changed == o.level
        assert o.level >= _target(lag)  # never below what the lag says, at once
        if o.level < before:
            assert o.level == before - 1  # one level at a time
            leave = STEPS[before - 1].leave
            assert lag < leave
            since = calm_since.get(before)
            assert since is not None and clock.t - since >= COOL  # only after `cool` s under the level's leave
            assert last_down is None or clock.t - last_down >= COOL
            last_down = clock.t
        if o.level > Level.NORMAL:
            leave = STEPS[o.level - 1].leave
            if lag >= leave or o.level != before:
                calm_since[o.level] = None if lag >= leave else clock.t
            elif calm_since.get(o.level) is None:
                calm_since[o.level] = clock.t
        clock.t += dt


@given(st.lists(st.floats(0.05, 0.5, exclude_max=True), min_size=1, max_size=200), st.floats(0, 60))
def test_no_flapping_in_the_band(band: list[float], dt: float) -> None:
    """A lag between a level's leave (half its threshold) and the next level's threshold keeps the level."""
    clock = Clock()
    o = Overload(STEPS, COOL, clock)
    assert o.observe(0.1) == Level.SAMPLES
    for lag in band:
        clock.t += dt
        assert o.observe(lag) is None
        assert o.level == Level.SAMPLES


def test_the_table_walked() -> None:
    clock = Clock()
    o = Overload(STEPS, COOL, clock)
    assert o.observe(0.01) is None and o.level == Level.NORMAL
    assert o.observe(0.7) == Level.WARNINGS  # straight to the top
    clock.t += 1
    assert o.observe(0.0) is None  # calm starts
    clock.t += COOL - 0.1
    assert o.observe(0.0) is None
    clock.t += 0.1
    assert o.observe(0.0) == Level.SAMPLES
    clock.t += COOL
    assert o.observe(0.0) == Level.NORMAL
    assert o.observe(0.0) is None


@given(st.lists(st.tuples(st.floats(0, 60), st.floats(0, 10)), max_size=200))
def test_a_late_loop_with_nothing_waiting_is_not_overload(lags_: list[tuple[float, float]]) -> None:
    """An idle bot on a busy host: its event loop runs late (10 ms, or seconds), nothing waits for it: no level."""
    clock = Clock()
    o = Overload(table(1.0, 5.0, 0.25, 1.0), COOL, clock)
    for lag, dt in lags_:
        assert o.observe(0.0, lag, depth=0) is None and o.level == Level.NORMAL
        clock.t += dt


@given(st.floats(0, 60), st.floats(0, 60), st.integers(0, 1000))
def test_the_level_is_what_the_backlog_says_and_the_lag_only_with_a_backlog(wait: float, lag: float, depth: int
                                                                             ) -> None:
    o = Overload(table(1.0, 5.0, 0.25, 1.0), COOL, Clock())
    o.observe(wait, lag, depth)
    by_wait = Level.WARNINGS if wait >= 5.0 else Level.SAMPLES if wait >= 1.0 else Level.NORMAL
    by_lag = Level.NORMAL if not depth else Level.WARNINGS if lag >= 1.0 else Level.SAMPLES if lag >= 0.25 else \
        Level.NORMAL
    assert o.level == max(by_wait, by_lag)


@given(st.lists(st.tuples(st.booleans(), st.floats(0, 100)), max_size=100))
def test_a_backlog_says_its_depth_and_how_long_its_oldest_waits(ops: list[tuple[bool, float]]) -> None:
    b, kept, now = Backlog(), {}, 0.0
    for enter, since in ops:
        now = max(now, since)
        if enter or not kept:
            kept[b.enter(since)] = since
        else:
            token = next(iter(kept))
            b.leave(token)
            del kept[token]
        assert b.depth == len(kept)
        assert b.age(now) == (now - min(kept.values()) if kept else 0.0)


def test_disabled_never_sheds() -> None:
    o = Overload((), COOL, Clock())
    assert o.observe(100.0) is None and o.level == Level.NORMAL


def test_what_was_shed_in_the_last_minute_and_said_once() -> None:
    clock = Clock()
    o = Overload(STEPS, COOL, clock)
    o.observe(0.2)
    o.count("samples", 40)
    clock.t += 30
    o.count("samples", 2)
    o.count("warnings", 3)
    assert "shedding samples (42 samples and 3 WARNINGs shed in the last minute); ERRORs and resolutions go first, " \
        "never shed" in o.say()
    clock.t += 31  # the first 40 are older than a minute
    st_ = o.status()
    assert st_["shed_last_minute"] == {"samples": 2, "warnings": 3}
    assert st_["shed_total"] == {"samples": 42, "warnings": 3}
    assert st_["level"] == "samples"


@given(st.lists(st.tuples(st.sampled_from(["samples", "warnings"]), st.integers(0, 100), st.floats(0, 30)),
                max_size=100))
def test_counts_add_up(adds: list[tuple[str, int, float]]) -> None:
    c, t = ShedCount(), 0.0
    kept: list[tuple[float, str, int]] = []
    for kind, n, dt in adds:
        c.add(kind, n, t)
        kept.append((t, kind, n))
        t += dt
    for kind in ("samples", "warnings"):
        assert c.total[kind] == sum(n for _, k, n in kept if k == kind)
        assert c.last_minute(t)[kind] == sum(n for at, k, n in kept if k == kind and at > t - 60)


def test_the_median_needs_a_busy_loop_not_one_slow_moment() -> None:
    m = Median(5)
    assert m(3.0) == 0.0  # one slow request, or the bot's start: the window starts calm
    assert m(0.0) == 0.0
    assert [m(0.2) for _ in range(3)] == [0.0, 0.2, 0.2]  # busy for most of the window: the signal


def _message(run: str, kind: str) -> tuple[str, bytes]:
    """(subject, data) of an envelope of `run` carrying an ERROR, a WARNING or samples only, as the job encodes it."""
    events = {"error": [event(run=run)], "warning": [event(run=run, sev=Severity.WARNING)], "samples": []}[kind]
    samples = [] if events else [sample(1)]
    return f"msmon.llm.{run}", encode(Envelope(run_id=run, device="0", sent_at=0.0, events=events, samples=samples))


@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.sampled_from(["error", "warning", "samples"])),
                max_size=30))
def test_errors_first_and_each_run_in_its_order(batch: list[tuple[str, str]]) -> None:
    msgs = [(i, *_message(run, kind), kind) for i, (run, kind) in enumerate(batch)]
    out = errors_first(msgs, lambda m: m[1], lambda m: m[2])
    assert sorted(out) == sorted(msgs)  # nothing lost, nothing twice
    for run in "abc":  # a run's own messages in the order they came
        assert [m[0] for m in out if m[1] == f"msmon.llm.{run}"] == [m[0] for m in msgs if m[1] == f"msmon.llm.{run}"]
    for i, m in enumerate(msgs):  # an ERROR with nothing of its run before it goes ahead of every other message
        if m[3] == "error" and not any(o[1] == m[1] for o in msgs[:i]):
            assert all(o[3] == "error" for o in out[:out.index(m)])
