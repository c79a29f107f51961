"""What changed since a periodic pass last looked (migrations 0005 sqlite / 0004 postgresql), on both stores: every
write that changes an alert's status, severity, acknowledgement or event is read from the mark taken before it, a
suppressed repeat's touch is not, and (PostgreSQL) another replica's transaction that commits after the mark was
taken, with an older clock, is still read. The runs heard from since a time, and the ends of a few runs."""

from __future__ import annotations

import threading
from typing import Any

from bot.store.sqlite import AlertRow, Store


def alert(run: str, rule: str = "loss", device: str = "0", status: str = "firing", severity: str = "ERROR",
          at: float = 100.0, event: str | None = None) -> AlertRow:
    return AlertRow(f"{run}|{rule}|{device}", run, rule, device, severity, status, 5, at, event=event)


def test_each_kind_of_alert_change_is_read_from_the_mark_before_it(store: Store) -> None:
    # SQLite: exactly what changed since the mark. PostgreSQL: that and maybe more (the mark is the oldest running
    # transaction in the whole cluster: another session's open transaction holds it back, so earlier changes may be
    # read again; never fewer)
    exact = store.dialect == "sqlite"

    def changed(mark: int, want: set[tuple[str, str]]) -> int:
        keys, nxt = store.changed_alerts(mark)
        assert len(keys) == len(set(keys))  # each once
        assert want <= set(keys) and (not exact or set(keys) == want), (keys, want)
        return nxt

    with store.tx():
        store.save_alerts([alert(f"run-{i}") for i in range(50)])
    mark = store.change_mark()
    changed(mark, set())  # nothing since
    with store.tx():
        assert store.ack("run-3", "loss", None, "alice") == ["run-3|loss|0"]  # an ack of an old alert
    mark = changed(mark, {("run-3", "loss")})
    changed(mark, set())
    with store.tx():
        store.touch_alerts([(9, 200.0, "run-4|loss|0")])  # a suppressed repeat: its last step only
    changed(mark, set())
    with store.tx():
        store.save_alerts([alert("run-5", status="resolved"), alert("run-6", severity="WARNING"),
                           alert("run-7", event='{"x": 1}'), alert("run-8", device="1")])
    mark = changed(mark, {("run-5", "loss"), ("run-6", "loss"), ("run-7", "loss"), ("run-8", "loss")})
    with store.tx():  # an operator's UPDATE by hand: the trigger sees it too
        store.db.execute("UPDATE alerts SET acked_by='bob' WHERE run_id='run-9'")
    changed(mark, {("run-9", "loss")})


def test_a_change_number_is_never_reused_after_the_newest_rows_are_pruned(tmp_path: Any) -> None:
    store = Store(str(tmp_path / "s.sqlite"))
    store.touch_run("old", "p", {}, "0", 1, 1.0)
    with store.tx():
        store.save_alerts([alert("old", status="resolved")])
    mark = store.change_mark()
    assert store.prune_runs(before=10.0) == ["old"]
    with store.tx():
        store.save_alerts([alert("new")])
    assert store.changed_alerts(mark)[0] == [("new", "loss")]
    store.close()


def test_a_replica_commit_after_the_mark_with_an_older_clock_is_still_read(pg_pair: tuple[Any, Any]) -> None:
    a, b = pg_pair
    mark = a.change_mark()
    written, go = threading.Event(), threading.Event()

    def late() -> None:  # b's transaction writes, then waits while a looks, then commits
        with b.tx():
            b.save_alerts([alert("late", at=1.0)])  # its clock far behind a's
            written.set()
            go.wait(10)

    t = threading.Thread(target=late)
    t.start()
    assert written.wait(10)
    keys, mark = a.changed_alerts(mark)
    assert ("late", "loss") not in keys  # not committed yet: not visible
    go.set()
    t.join(10)
    assert ("late", "loss") in a.changed_alerts(mark)[0]  # read after its commit, from the mark taken before


def test_the_runs_heard_from_since_a_time_and_the_ends_of_some_runs(store: Store) -> None:
    for i in range(20):
        store.touch_run(f"run-{i}", "p", {}, "0", 1, 100.0 + i, heartbeat=True)
    assert sorted(store.runs_seen_since(117.0)) == ["run-17", "run-18", "run-19"]
    store.escalations.end_run("run-2", 150.0, 9)
    store.escalations.end_run("run-3", 160.0, 9)
    assert store.escalations.ended_of(["run-1", "run-2", "run-3"]) == {"run-2": 150.0, "run-3": 160.0}
    assert store.escalations.ended_of([]) == {}
