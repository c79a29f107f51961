"""The watchdog's pass reads only the runs whose verdict can have changed (issue 27: 100,000 stored runs
read every 2 s held the loop for seconds), and raises exactly what a pass over every run raises, over a
timeline of heartbeats, progress, silences and a bot-start grace. Real stores, an injected clock."""

from __future__ import annotations

import random

import pytest

from bot.config import BotConfig, PipelineConfig
from bot.ingest.envelope import Ingest
from bot.ingest.watchdog import Watchdog
from bot.metrics import BotMetrics
from bot.shared import BotState
from bot.store.sqlite import Store


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _setup(tmp_path, name: str, clock: Clock, full: bool) -> tuple[Store, Watchdog, list[tuple[float, str, str, str]]]:
    cfg = BotConfig(state_path=str(tmp_path / f"{name}.sqlite"),
                    pipeline=PipelineConfig(heartbeat_timeout=10.0, stall_timeout=30.0, group_wait=0.0))
    store = Store(cfg.state_path)
    state = BotState(cfg, store, BotMetrics(), clock)
    ingest = Ingest(state)
    raised: list[tuple[float, str, str, str]] = []  # (when, run, rule, status): one pass's order is no matter
    dog = Watchdog(cfg, store, ingest, clock)
    original = dog._raise

    def record(run, rule, status, silent, now):  # type: ignore[no-untyped-def]
        raised.append((now, run["run_id"], rule, status.value))
        return original(run, rule, status, silent, now)

    dog._raise = record  # type: ignore[method-assign]
    if full:
        dog.candidates = lambda now: store.runs()  # type: ignore[method-assign]
    return store, dog, raised


@pytest.mark.parametrize("seed", range(12))
def test_a_pass_over_what_changed_raises_what_a_pass_over_every_run_raises(tmp_path, seed):
    rng = random.Random(seed)
    clock = Clock(1_000_000.0)
    setups = [_setup(tmp_path, f"s{seed}{k}", clock, full) for k, full in ((0, False), (1, True))]
    for store, _, _ in setups:  # runs from before the bot started: the grace decides when they are judged
        for r in range(5):
            store.touch_run(f"old-{r}", "p", {}, "0", 10, clock.t - 3600 * (r + 1), heartbeat=True)
    steps = {f"run-{r}": 0 for r in range(6)}
    for _ in range(120):
        clock.t += rng.choice([0.5, 1.0, 2.0, 2.0, 5.0])
        for run_id in steps:
            roll = rng.random()
            if roll < 0.25:  # a heartbeat with progress
                steps[run_id] += 1
            for store, _, _ in setups:
                if roll < 0.4:  # a heartbeat (progress or not)
                    store.touch_run(run_id, "p", {}, "0", steps[run_id], clock.t, heartbeat=True)
                elif roll < 0.42:  # a pause or a resume answered to a command (last_seen does not move)
                    store.set_paused(run_id, roll < 0.41, clock.t)
                elif roll < 0.43:  # the job said it ended (a final heartbeat)
                    store.touch_run(run_id, "p", {}, "0", steps[run_id], clock.t, heartbeat=True)
                    store.escalations.end_run(run_id, clock.t, steps[run_id])
                elif roll < 0.44:  # a new attempt (its progress counts from now)
                    store.restart_run(run_id, clock.t)
        for _, dog, _ in setups:
            dog.check()
    (_, _, incremental), (_, _, full) = setups
    assert sorted(incremental) == sorted(full)
    assert any(r[2] == "job_gone" for r in full) and any(r[3] == "resolved" for r in full)  # the timeline moved
    assert any(r[1].startswith("old-") for r in full)  # the runs from before the start, once the grace ended


def test_after_the_first_pass_only_the_runs_heard_from_or_crossing_a_timeout_are_read(tmp_path):
    clock = Clock(1_000_000.0)
    store, dog, _ = _setup(tmp_path, "few", clock, full=False)
    for r in range(500):
        store.touch_run(f"old-{r}", "p", {}, "0", 10, clock.t - 7200, heartbeat=True)
    store.touch_run("live", "p", {}, "0", 10, clock.t, heartbeat=True)
    clock.t += 700.0  # past the bot-start grace of both timeouts
    dog.check()  # the grace's end: every run read once, the old ones judged gone
    clock.t += 2.0
    store.touch_run("live", "p", {}, "0", 11, clock.t, heartbeat=True)
    clock.t += 2.0
    assert [r["run_id"] for r in dog.candidates(clock.t)] == ["live"]


def _instructions(store: Store, fn) -> int:  # type: ignore[no-untyped-def]
    """The SQLite virtual machine instructions `fn` ran (a scan of N rows is at least N of them)."""
    count = [0]

    def step() -> int:
        count[0] += 1
        return 0

    store.db.set_progress_handler(step, 1)
    try:
        fn()
    finally:
        store.db.set_progress_handler(None, 1)
    return count[0]


def test_a_pass_costs_the_same_over_500_or_5000_stored_runs_and_ended_runs(tmp_path):
    cost = {}
    for n in (500, 5000):
        clock = Clock(1_000_000.0)
        store, dog, _ = _setup(tmp_path, f"n{n}", clock, full=False)
        for r in range(n):
            store.touch_run(f"old-{r}", "p", {}, "0", 10, clock.t - 7200 + r * 1e-3, heartbeat=True)
            if r % 2:
                store.escalations.end_run(f"old-{r}", clock.t - 7000, 10)
        clock.t += 700.0
        dog.check()  # the grace's end: every run read once
        passes = []
        for k in range(3):
            clock.t += 2.0
            for r in range(10):
                store.touch_run(f"old-{(r * 37 + k) % n}", "p", {}, "0", 11 + k, clock.t, heartbeat=True)
            passes.append(_instructions(store, dog.check))
        cost[n] = max(passes)
    assert cost[5000] <= cost[500] * 1.2, cost
