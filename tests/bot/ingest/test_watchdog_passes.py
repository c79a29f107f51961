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


@pytest.mark.parametrize("seed", range(6))
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
            if roll < 0.4:  # a heartbeat (progress or not)
                for store, _, _ in setups:
                    store.touch_run(run_id, "p", {}, "0", steps[run_id], clock.t, heartbeat=True)
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
