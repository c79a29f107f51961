"""touch_run on both stores (the `store` fixture of the contract suite): an envelope's run update held for the
group commit (`defer`) reads back as if written at once, in order with what is written after it, and a device
the run's row already holds costs no rewrite of its list of devices (PostgreSQL: no merge per envelope); a
PostgreSQL replica keeps a run's project (no read per request) only until another replica prunes the run."""

from __future__ import annotations

import asyncio
import sqlite3
from typing import Any

import pytest

from bot.ingest.commit import Commits
from bot.store.sqlite import Store


def _raw(s: Store) -> tuple[object, ...]:
    """The run's row as the database holds it now (no flush of what is held)."""
    r = s.db.execute("SELECT last_seen, last_step, last_heartbeat, devices, paused FROM runs WHERE run_id='r'")\
        .fetchone()
    return tuple(r)


def test_held_updates_are_merged_then_written_in_one_commit(store: Store) -> None:
    store.touch_run("r", "llm", {}, "0", 10, 100.0)  # a new run: written at once
    store.touch_run("r", "llm", {}, "1", 12, 101.0, defer=True)
    store.touch_run("r", "llm", {}, "0", 11, 102.0, heartbeat=True, defer=True)
    store.touch_run("r", "llm", {}, "2", None, 103.0, paused=True, defer=True)
    assert store.holding
    assert _raw(store)[:3] == (100.0, 10, None)  # nothing written yet
    assert store.flush_runs(now=103.5) == 1 and not store.holding  # one run: one statement
    last_seen, step, beat, devices, paused = _raw(store)
    assert (last_seen, step, paused) == (103.5, 12, 1)
    assert 102.0 <= beat <= 103.5  # the heartbeat's envelope's time (SQLite) or the commit's (PostgreSQL's one time)
    r = store.run("r")
    assert r is not None and r["devices"] == ["0", "1", "2"] and 101.0 <= r["last_progress"] <= 103.5


def test_what_is_written_after_a_held_update_comes_after_it(store: Store) -> None:
    store.touch_run("r", "llm", {}, "0", 10, 100.0)
    store.touch_run("r", "llm", {}, "1", 20, 101.0, defer=True)
    with store.tx():  # an envelope with events: its own transaction, the held update first
        store.touch_run("r", "llm", {}, "0", 15, 102.0)
    assert not store.holding
    r = store.run("r")
    assert r is not None and (r["last_step"], r["last_seen"], r["devices"]) == (20, 102.0, ["0", "1"])
    store.touch_run("r", "llm", {}, "3", 30, 103.0, defer=True)
    r = store.run("r")  # a read sees what was held
    assert r is not None and r["last_step"] == 30 and r["devices"] == ["0", "1", "3"]


def test_a_device_the_row_holds_does_not_rewrite_the_list(store: Store) -> None:
    for d in range(3):
        store.touch_run("r", "llm", {}, str(d), d, 100.0 + d)
    store.flush_runs()
    store.db.execute("UPDATE runs SET devices='[\"x\"]' WHERE run_id='r'")  # a marker: rewritten if merged again
    store.touch_run("r", "llm", {}, "1", 5, 104.0)
    store.touch_run("r", "llm", {}, "2", 6, 105.0, defer=True)
    store.flush_runs()
    assert _raw(store)[3] == '["x"]'
    store.touch_run("r", "llm", {}, "7", 7, 106.0, defer=True)  # a new one is added to what the row holds
    store.flush_runs()
    r = store.run("r")
    assert r is not None and r["devices"][-1] == "7" and r["last_step"] == 7


def test_the_group_commit_answers_after_the_commit_and_fails_every_waiter_with_it(tmp_path: object) -> None:
    s = Store(f"{tmp_path}/s.sqlite")
    s.touch_run("r", "llm", {}, "0", 1, 100.0)
    commits = Commits(s, lambda: 200.0, window=0.01)

    async def two() -> list[object]:
        async def one(step: int) -> tuple[object, ...]:
            s.touch_run("r", "llm", {}, "0", step, 150.0, defer=True)
            await commits.committed()
            return _raw(s)
        return list(await asyncio.gather(one(2), one(3)))

    rows = asyncio.run(two())
    assert rows[0] == rows[1] and rows[0][:2] == (200.0, 3)  # both answered once both were written
    s.touch_run("r", "llm", {}, "0", 4, 150.0, defer=True)
    s.db.close()  # the database goes away under the held update

    async def failing() -> None:
        await asyncio.gather(commits.committed(), commits.committed())

    with pytest.raises(sqlite3.Error):
        asyncio.run(failing())


def test_a_replica_keeps_a_runs_project_only_until_another_prunes_it(pg_pair: tuple[Any, Any]) -> None:
    a, b = pg_pair
    b.touch_run("r", "p1", {}, "0", 1, 100.0)

    async def scenario() -> list[str | None]:
        stop = asyncio.Event()
        task = asyncio.create_task(a.listen(lambda run: None, stop))
        for _ in range(100):
            if a._listening:
                break
            await asyncio.sleep(0.05)
        seen = [a.project_of("r")]  # read, then kept
        b.db.execute("UPDATE runs SET last_seen=0 WHERE run_id='r'")
        assert b.prune_runs(before=50.0) == ["r"]  # gone on b; its id taken by another project's job
        b.touch_run("r", "p2", {}, "0", 1, 200.0)
        for _ in range(100):
            if "r" not in a._owners:
                break
            await asyncio.sleep(0.05)
        seen.append(a.project_of("r"))
        stop.set()
        await task
        seen.append(a.project_of("r"))  # not listening: read each time
        return seen

    assert asyncio.run(scenario()) == ["p1", "p2", "p2"]


def test_a_device_merged_in_a_rolled_back_transaction_is_merged_again(store: Store) -> None:
    store.touch_run("r", "llm", {}, "0", 1, 100.0)
    with pytest.raises(RuntimeError), store.tx():
        store.touch_run("r", "llm", {}, "5", 2, 101.0)
        raise RuntimeError("the envelope's transaction fails after its run was touched")
    store.touch_run("r", "llm", {}, "5", 3, 102.0)
    r = store.run("r")
    assert r is not None and r["devices"] == ["0", "5"]
