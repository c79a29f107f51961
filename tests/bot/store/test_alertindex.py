"""The in-memory copy of the alerts' state in front of SQLite: exact, rolled back with its
transaction, and suppressed repeats' last steps written later in one statement."""

from __future__ import annotations

import pytest

from bot.config import load_bot_config
from bot.ingest.envelope import Ingest
from bot.metrics import BotMetrics
from bot.shared import BotState
from bot.store.sqlite import Store
from msmon.contract.wire import Envelope, Event, Severity, Status


def ev(step: int, sev: Severity = Severity.WARNING, device: str = "0", status: Status = Status.FIRING) -> Event:
    return Event(run_id="r", device=device, step=step, time=0.0, rule="loss_spike", severity=sev, status=status,
                 value=1.0, threshold=0.5, message="m")


def edge(tmp_path, clock=lambda: 1000.0) -> Ingest:
    cfg = load_bot_config({"bot": {"port": 0, "state_path": str(tmp_path / "s.sqlite")}})
    return Ingest(BotState(cfg, Store(cfg.state_path), BotMetrics(), clock))


def ingest(d: Ingest, *events: Event) -> int:
    queued: int = d.envelope(Envelope(run_id="r", device="0", sent_at=0.0, events=list(events)))["queued"]
    return queued


def last_step(d: Ingest) -> int:
    (row,) = d.state.store.alerts("r")
    step: int = row["last_step"]
    return step


def test_repeats_move_the_last_step_once_flushed_and_a_restart_reads_the_state_back(tmp_path):
    d = edge(tmp_path)
    assert ingest(d, ev(10)) == 1
    assert ingest(d, *[ev(s) for s in range(11, 200)]) == 0  # repeats inside repeat_interval
    assert last_step(d) == 10  # held in memory...
    d.state.flush()
    assert last_step(d) == 199  # ... and written in one statement
    d.state.store.close()
    d2 = edge(tmp_path)  # a restart: nothing cached, the state comes from SQLite
    assert ingest(d2, ev(200)) == 0  # still a repeat: dedup remembered what was sent
    assert ingest(d2, ev(201, Severity.ERROR)) == 1  # a rise passes
    d2.state.flush()
    (row,) = d2.state.store.alerts("r")
    assert (row["severity"], row["status"], row["first_step"], row["last_step"]) == ("ERROR", "firing", 10, 201)


def test_a_rolled_back_envelope_leaves_the_memory_copy_as_it_was(tmp_path):
    d = edge(tmp_path)
    saved = d.state.store.save_alerts

    def broken(rows):
        saved(rows)
        raise OSError("disk full")

    d.state.store.save_alerts = broken  # type: ignore[method-assign]
    with pytest.raises(OSError):
        ingest(d, ev(10, Severity.ERROR))
    assert d.state.store.alerts("r") == []  # the transaction was rolled back...
    d.state.store.save_alerts = saved  # type: ignore[method-assign]
    assert ingest(d, ev(11, Severity.ERROR)) == 1  # ... and so was the copy: the ERROR is not "already sent"


def test_a_suppressed_change_of_state_is_written_at_once(tmp_path):
    d = edge(tmp_path)
    assert ingest(d, ev(10, Severity.ERROR)) == 1
    assert ingest(d, ev(11, Severity.WARNING)) == 0  # a WARNING under a firing ERROR: inhibited...
    (row,) = d.state.store.alerts("r")
    assert (row["severity"], row["last_step"]) == ("WARNING", 11)  # ... but the row says what the job reports now


def test_the_copy_is_bounded(tmp_path):
    d = edge(tmp_path)
    d.state.index.max_entries = 50
    ingest(d, *[ev(1, device=str(k)) for k in range(200)])
    assert len(d.state.index.entries) == 50
    assert ingest(d, *[ev(2, device=str(k)) for k in range(200)]) == 0  # forgotten entries are read back


def test_the_stores_run_and_silence_copies_follow_rollbacks_and_new_silences(tmp_path):
    from bot.pipeline.silence import Silence

    d = edge(tmp_path)
    store = d.state.store
    with store.tx():
        store.touch_run("r", "llm", {}, "0", 10, 1000.0)
    with pytest.raises(OSError), store.tx():
        store.touch_run("r", "llm", {}, "1", 20, 1001.0)
        raise OSError("disk full")
    with store.tx():
        store.touch_run("r", "llm", {}, "0", 15, 1002.0)
    run = store.run("r")
    assert (run["devices"], run["last_step"]) == (["0"], 15)  # device 1 and step 20 were rolled back
    assert store.silences(1000.0) == []
    with store.tx():
        store.add_silence(Silence(id=0, expires_at=2000.0, run_id="r"))
    assert [s.run_id for s in store.silences(1000.0)] == ["r"]
    assert store.silences(2000.0) == []  # expired


def test_each_dropped_notification_is_counted_under_the_stage_that_dropped_it(tmp_path):
    from prometheus_client import generate_latest

    now = [1000.0]
    d = edge(tmp_path, clock=lambda: now[0])
    assert ingest(d, ev(10)) == 1
    assert ingest(d, ev(11)) == 0  # a repeat inside repeat_interval
    with d.state.store.tx():
        d.state.index.acked(d.state.store.ack("r", "loss_spike", None, "alice"))
    now[0] += 3600.0  # a reminder is due, but someone is on it
    assert ingest(d, ev(12)) == 0
    assert ingest(d, ev(13, Severity.ERROR)) == 1  # a rise still goes out
    metrics = generate_latest(d.state.metrics.registry).decode()
    assert 'msmon_suppressed_total{stage="dedup"} 1.0' in metrics
    assert 'msmon_suppressed_total{stage="acked"} 1.0' in metrics
