"""The escalator's pass reads what changed, not what is stored (issue 31): a quiet pass costs the same over 100 or
2,000 open escalations (SQLite's own count of the instructions it ran), and over a random timeline of alerts
firing, resolving, acknowledged, silenced and unsilenced, the escalator that keeps its picture between passes takes
exactly the steps of one that reads everything again at every pass. On PostgreSQL the escalator's replica sees an
alert another replica committed late, and an ack made there. Real stores, an injected clock."""

from __future__ import annotations

import random
import threading
from typing import Any

import pytest

from bot.config import load_bot_config
from bot.escalation.scheduler import Escalator
from bot.metrics import BotMetrics
from bot.pipeline.silence import Silence
from bot.shared import BotState
from bot.store.sqlite import AlertRow, Store
from msmon.contract.wire import Severity, Status, encode
from tests.fakes import postgres
from tests.fakes.records import event

POLICY = {"levels": [{"after": 0, "mention": ["@a"]}, {"after": 30, "mention": ["@b"]},
                     {"after": 90, "mention": ["@c"]}], "repeat": 1, "repeat_every": 200}


def config(path: str, **store: Any) -> Any:
    bot: dict[str, Any] = {"state_path": path, "escalations": {"page": POLICY},
                           "routes": [{"receiver": "console", "channel": "c", "escalation": "page"}]}
    if store:
        bot["store"] = store
    return load_bot_config({"bot": bot})


def row(run: str, rule: str = "loss", device: str = "0", sev: str = "ERROR", status: str = "firing",
        at: float = 0.0) -> AlertRow:
    ev = event(run=run, rule=rule, device=device, sev=Severity(sev), status=Status(status))
    return AlertRow(f"{run}|{rule}|{device}", run, rule, device, sev, status, 5, at, event=encode(ev).decode())


def escalating(tmp_path: Any, name: str, clock: list[float], alerts: int) -> tuple[Store, Escalator]:
    cfg = config(str(tmp_path / f"{name}.sqlite"))
    state = BotState(cfg, Store(cfg.state_path), BotMetrics(), lambda: clock[0])
    with state.store.tx():
        for r in range(alerts):
            state.store.touch_run(f"run-{r}", "p", {}, "0", 5, clock[0])
        state.store.save_alerts([row(f"run-{r}", at=clock[0]) for r in range(alerts)])
    return state.store, Escalator(state, clock=lambda: clock[0])


def instructions(store: Store, fn: Any) -> int:
    """The SQLite virtual machine instructions `fn` ran on the store's connection (a full scan of a table of N
    rows is at least N of them)."""
    count = [0]

    def tick() -> int:
        count[0] += 1
        return 0

    store.db.set_progress_handler(tick, 1)
    try:
        fn()
    finally:
        store.db.set_progress_handler(None, 1)
    return count[0]


def test_a_quiet_pass_and_an_ack_cost_the_same_over_100_or_2000_open_escalations(tmp_path):
    cost = {}
    for n in (100, 2000):
        clock = [1_000_000.0]
        store, esc = escalating(tmp_path, f"n{n}", clock, n)
        assert esc.sync() == n  # the first pass: every escalation started, its first level taken
        clock[0] += 1.0
        quiet = instructions(store, esc.sync)
        with store.tx():
            store.ack("run-7", "loss", None, "alice")  # an old alert acknowledged
        clock[0] += 1.0
        ack = instructions(store, esc.sync)
        assert store.escalations.of("run-7")[0]["state"] == "acked"
        assert len(store.escalations.open()) == n - 1
        clock[0] += 30.0
        assert esc.sync() == n - 1  # the second level, for every other one: on time
        cost[n] = (quiet, ack)
    assert cost[2000][0] <= cost[100][0] * 1.2 and cost[2000][1] <= cost[100][1] * 1.2, cost


def test_a_pass_does_not_read_every_open_escalation_or_firing_alert_again(tmp_path):
    clock = [1_000_000.0]
    store, esc = escalating(tmp_path, "rows", clock, 300)
    esc.sync()
    read: list[str] = []
    store.db.set_trace_callback(read.append)
    clock[0] += 5.0
    esc.sync()
    store.db.set_trace_callback(None)
    assert not any("FROM escalations WHERE state='active'" in q or "FROM alerts WHERE status='firing'" in q
                   for q in read), read


def _timeline_step(rng: random.Random, stores: list[Store], now: float) -> None:
    """One random change, the same in every store."""
    run, rule, device = f"run-{rng.randrange(4)}", rng.choice(["loss", "grad"]), rng.choice(["0", "1"])
    roll, sev, whose, lasts, which = rng.random(), rng.choice(["ERROR", "ERROR", "WARNING"]), \
        rng.choice([None, device]), rng.choice([20, 60, 150]), rng.random()
    for store in stores:
        with store.tx():
            if roll < 0.35:
                store.save_alerts([row(run, rule, device, sev=sev, at=now)])
            elif roll < 0.55:
                store.save_alerts([row(run, rule, device, status="resolved", at=now)])
            elif roll < 0.7:
                store.ack(run, rule, whose, "alice")
            elif roll < 0.8:
                store.add_silence(Silence(id=0, expires_at=now + lasts, run_id=run if which < 0.5 else None,
                                          rule=rule if 0.3 < which < 0.8 else None,
                                          device=device if which < 0.2 else None))


@pytest.mark.parametrize("seed", range(8))
def test_the_kept_picture_takes_exactly_the_steps_of_reading_everything_each_pass(tmp_path, seed):
    rng = random.Random(seed)
    clock = [1_000_000.0]
    (kept_store, kept), (full_store, full) = (escalating(tmp_path, f"{name}{seed}", clock, 0) for name in "kf")
    for store in (kept_store, full_store):
        for r in range(4):
            store.touch_run(f"run-{r}", "p", {}, "0", 5, clock[0])
    for _ in range(150):
        clock[0] += rng.choice([1.0, 3.0, 10.0, 25.0, 60.0])
        _timeline_step(rng, [kept_store, full_store], clock[0])
        full._picture = None  # read everything again, as every pass did before
        assert kept.sync() == full.sync()
    steps = [[(s["escalation_id"], s["step"], s["how"], s["at"]) for s in st.escalations.steps()]
             for st in (kept_store, full_store)]
    assert steps[0] == steps[1]
    states = [[(e["run_id"], e["rule"], e["state"], e["next_step"], e["paused_at"], e["shift"])
               for e in st.escalations.of()] for st in (kept_store, full_store)]
    assert states[0] == states[1]
    hows = {h for _, _, h, _ in steps[0]}
    assert {"console", "acked", "resolved"} <= hows, hows  # the timeline took steps and closed some both ways
    assert any(e[4] is not None or e[5] for e in states[0]), "no escalation was ever paused by a silence"


def test_the_escalating_replica_sees_an_alert_another_commits_late_and_an_ack_made_there():
    postgres.required()
    from bot.store.postgres import PostgresStore

    with postgres.fresh_schema() as schema:
        a, b = PostgresStore(postgres.PG_URL, schema, lease=5.0), PostgresStore(postgres.PG_URL, schema, lease=5.0)
        try:
            cfg = config("unused.sqlite", url=postgres.PG_URL, schema=schema, lease=5.0)
            clock = [1_000_000.0]
            esc = Escalator(BotState(cfg, a, BotMetrics(), lambda: clock[0]), clock=lambda: clock[0])
            a.touch_run("run-1", "p", {}, "0", 5, clock[0])
            with a.tx():
                a.save_alerts([row("run-1", at=clock[0])])
            assert esc.sync() == 1  # the first pass reads everything
            written, go = threading.Event(), threading.Event()

            def late() -> None:  # replica b's envelope: written before a's pass, committed after it
                b.touch_run("run-2", "p", {}, "0", 5, 1.0)
                with b.tx():
                    b.save_alerts([row("run-2", at=1.0)])  # its clock far behind
                    written.set()
                    go.wait(10)

            t = threading.Thread(target=late)
            t.start()
            assert written.wait(10)
            clock[0] += 1.0
            assert esc.sync() == 0  # not committed yet
            go.set()
            t.join(10)
            clock[0] += 1.0
            assert esc.sync() == 1 and {e["run_id"] for e in a.escalations.open()} == {"run-1", "run-2"}
            with b.tx():
                b.ack("run-1", "loss", None, "bob")
            clock[0] += 1.0
            esc.sync()
            assert [e["run_id"] for e in a.escalations.open()] == ["run-2"]
            assert a.escalations.of("run-1")[0]["acked_by"] == "bob"
        finally:
            a.close()
            b.close()
