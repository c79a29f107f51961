"""The store contract (bot/store/contract.py), one suite against both stores: SQLite (a file in tmp) and
PostgreSQL (the machine's real server, a fresh schema per test; skipped with the reason when it does not
answer). Then what only several replicas on one PostgreSQL need: claims, leases, LISTEN/NOTIFY, locks."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
import time
from typing import Any

import pytest

from bot.config import load_bot_config
from bot.pipeline.flow import NotifyState
from bot.pipeline.schedule import Verdict
from bot.pipeline.silence import Silence
from bot.store import StoreUnavailable, migrations, open_store, redact
from bot.store.sqlite import AlertRow, OutboxEntry, Store
from msmon.config.errors import ConfigError
from msmon.contract.wire import Severity
from tests.fakes import postgres


def entry(key: str = "k1", kind: str = "alert", now: float = 100.0, run: str = "run-1") -> OutboxEntry:
    return OutboxEntry(now, "slack", "#ml", kind, key, run, '{"x": 1}', now)


# -- the schema and its migrations -------------------------------------------------------------------

def test_the_schema_is_at_the_latest_migration_and_reopening_applies_nothing(store: Store) -> None:
    assert store.schema_version() == migrations.latest(store.dialect)  # type: ignore[arg-type]
    again = Store(store.path) if store.dialect == "sqlite" else type(store)(store.url, store.schema)  # type: ignore[attr-defined]
    assert again.schema_version() == store.schema_version()
    rows = list(again.db.execute("SELECT version FROM schema_version ORDER BY version"))
    assert [r["version"] for r in rows] == list(range(1, store.schema_version() + 1))
    again.close()


def test_a_sqlite_file_from_before_versions_is_migrated_and_keeps_its_rows(tmp_path: Any) -> None:
    path = str(tmp_path / "old.sqlite")
    db = sqlite3.connect(path)
    db.executescript(
        "CREATE TABLE outbox (id INTEGER PRIMARY KEY AUTOINCREMENT, created_at REAL, receiver TEXT, channel TEXT,"
        " kind TEXT, key TEXT, run_id TEXT, payload TEXT, attempts INTEGER DEFAULT 0, next_at REAL, delivered_at REAL,"
        " error TEXT);"
        "INSERT INTO outbox(created_at, receiver, channel, kind, key, run_id, payload, next_at)"
        " VALUES(1, 'slack', '#ml', 'alert', 'k', 'r', '{}', 1);")
    db.close()
    s = Store(path)
    assert s.schema_version() == migrations.latest("sqlite")
    (row,) = s.due(10.0)
    assert (row.key, row.dead_at, row.posted_ref) == ("k", None, None)
    s.close()


def test_migration_files_are_numbered_without_gaps() -> None:
    for dialect in ("sqlite", "postgresql"):
        ms = migrations.migrations(dialect)  # type: ignore[arg-type]
        assert [m.version for m in ms] == list(range(1, len(ms) + 1)) and ms[0].name == "initial"


# -- runs ---------------------------------------------------------------------------------------------

def test_a_run_merges_its_devices_and_its_step_only_moves_forward(store: Store) -> None:
    store.touch_run("r", "llm", {"a": "1"}, "0", 10, 100.0, heartbeat=True)
    store.touch_run("r", "other", {"a": "2"}, "1", 5, 101.0)
    store.touch_run("r", "other", {"a": "2"}, "0", None, 102.0)
    r = store.run("r")
    assert r is not None
    assert (r["project"], r["labels"], r["devices"], r["last_step"]) == ("llm", {"a": "2"}, ["0", "1"], 10)
    assert (r["first_seen"], r["last_seen"], r["last_heartbeat"], r["last_progress"]) == (100.0, 102.0, 100.0, 100.0)
    store.touch_run("r", "llm", {}, "0", 11, 103.0, heartbeat=True, paused=True)
    r = store.run("r")
    assert r is not None and (r["last_step"], r["last_progress"], r["last_heartbeat"], r["paused"]) == \
        (11, 103.0, 103.0, True)
    store.set_paused("r", False, 104.0)
    store.mark_gone("r", True)
    r = store.run("r")
    assert r is not None and (r["paused"], r["gone"], r["last_progress"]) == (False, True, 104.0)
    assert [x["run_id"] for x in store.runs()] == ["r"] and store.run("nope") is None


# -- alerts and the notification log ------------------------------------------------------------------

def test_alert_rows_keep_what_was_sent_and_a_new_episode_forgets_the_ack(store: Store) -> None:
    sent = NotifyState(Severity.ERROR, 100.5, False)
    store.save_alerts([AlertRow("fp1", "r", "grad_norm", "0", "ERROR", "firing", 7, 100.0, '{"e": 1}', sent),
                       AlertRow("fp2", "r", "loss", "0", "WARNING", "firing", 7, 100.0)])
    states = store.alert_states(["fp1", "fp2", "fp3", "fp1"])
    assert states["fp1"] == (sent, "ERROR", "firing", False)
    assert states["fp2"][0] == NotifyState() and "fp3" not in states
    assert store.error_firing("r") and not store.error_firing("other")
    assert store.ack("r", "grad_norm", None, "ana") == ["fp1"]
    assert store.alert_states(["fp1"])["fp1"][3] is True
    store.touch_alerts([(9, 101.0, "fp1")])
    (a,) = [x for x in store.alerts("r", "firing") if x["fingerprint"] == "fp1"]
    assert (a["last_step"], a["first_step"], a["acked_by"], a["sent_at"]) == (9, 7, "ana", 100.5)
    store.save_alerts([AlertRow("fp1", "r", "grad_norm", "0", "ERROR", "resolved", 12, 102.0)])
    store.save_alerts([AlertRow("fp1", "r", "grad_norm", "0", "ERROR", "firing", 20, 103.0, None,
                                NotifyState(Severity.ERROR, 103.0, False))])
    (a,) = [x for x in store.alerts("r") if x["fingerprint"] == "fp1"]
    assert (a["first_step"], a["acked_by"], a["status"]) == (20, None, "firing") and "event" not in a


# -- the outbox ---------------------------------------------------------------------------------------

def test_outbox_rows_are_due_claimed_settled_and_dead_lettered(store: Store) -> None:
    store.enqueue_many([entry("k1", now=100.0), entry("k1", now=100.0), entry("k2", now=200.0)])
    assert store.depth() == 3 and store.next_due_at() == 100.0
    assert [r.key for r in store.due(150.0)] == ["k1", "k1"]
    rows = store.claim(("slack", "#ml", "k1", "alert"), 150.0)
    assert len(rows) == 2 and all(r.pending for r in rows)
    store.mark_posted([r.id for r in rows], "ts-1")
    assert {r.posted_ref for r in store.pending("slack", "#ml", "k1", "alert")} == {"ts-1"}
    store.settle([r.id for r in rows], Verdict("delivered", 1, 150.0, posted_ref="ts-1"), 150.0)
    assert store.depth() == 1 and [r.key for r in store.delivered_since("slack", "#ml", "k1", "alert", 0.0)] == \
        ["k1", "k1"]
    (k2,) = store.claim(("slack", "#ml", "k2", "alert"), 250.0)
    store.settle([k2.id], Verdict("retry", 1, 900.0, error="503"), 250.0)
    assert store.next_due_at() == 900.0 and store.due(300.0) == []
    assert store.due_now(300.0) == 1 and store.next_due_at() == 300.0
    store.settle([k2.id], Verdict("dead", 2, 300.0, error="gave up"), 300.0)
    assert (store.depth(), store.dead_count()) == (0, 1)
    (dead,) = store.dead_letters()
    assert (dead.key, dead.error, dead.attempts) == ("k2", "gave up", 2)
    assert store.due_lane(1e9, "slack", only=True) == [] and store.next_due_lane("slack", only=False) is None


def test_messages_are_replaced_and_retired(store: Store) -> None:
    store.save_message("k", "slack", "#ml", "ts-1", 1.0)
    store.save_message("k", "slack", "#ml", "ts-2", 2.0)
    m = store.message("k")
    assert m is not None and (m["ts"], m["created_at"]) == ("ts-2", 2.0)
    store.retire_message("k", 3.0)
    assert store.message("k") is None and store.message("k|closed@3.0") is not None


def test_silences_hold_until_they_expire(store: Store) -> None:
    sid = store.add_silence(Silence(id=0, expires_at=200.0, run_id="r", rule="loss", created_by="ana"))
    (s,) = store.silences(150.0)
    assert (s.id, s.run_id, s.rule, s.created_by) == (sid, "r", "loss", "ana") and sid > 0
    assert store.silences(250.0) == []


def test_a_failed_transaction_leaves_nothing(store: Store) -> None:
    with pytest.raises(RuntimeError), store.tx():
        store.enqueue_many([entry()])
        store.touch_run("r", "p", {}, "0", 1, 1.0)
        raise RuntimeError("boom")
    assert store.depth() == 0 and store.run("r") is None


# -- commands, level changes, Slack's replay guard ----------------------------------------------------

def test_commands_are_numbered_listed_updated_and_replays_refused(store: Store) -> None:
    c = store.commands
    kw: dict[str, Any] = {"user": "ana", "source": "cli", "project": "llm", "text": "pause run-1", "verb": "pause",
                          "action": "pause", "params": {"p": 1}, "apply_step": None, "detail": "",
                          "origin": {"receiver": "console"}, "expires_at": 500.0}
    first = c.add(created_at=1.0, run_id="r", status="pending", **kw)
    second = c.add(created_at=2.0, run_id="r", status="rejected", **kw)
    assert (first["id"], second["id"], first["params"], first["user"]) == ("c1", "c2", {"p": 1}, "ana")
    assert [x["id"] for x in c.open_for("r")] == ["c1"] and c.open_for("r", after=first["seq"]) == []
    c.update("c1", 3.0, results={"0": {"ok": True}}, status="done")
    got = c.get("c1")
    assert got is not None and (got["status"], got["results"], got["updated_at"]) == ("done", {"0": {"ok": True}}, 3.0)
    assert c.open_all() == [] and [x["id"] for x in c.recent(run_id="r")] == ["c2", "c1"]
    assert c.first_signed("sig", 100, 50.0) and not c.first_signed("sig", 100, 50.0)
    assert c.first_signed("sig", 100, 150.0)  # stale ones are forgotten
    c.add_level_change(run_id="r", device="0", step=5, at=1.0, rule="loss", action="set_threshold", who="ana",
                       why="t", detail="d", command_id="c1")
    (lc,) = c.level_changes("r")
    assert (lc["who"], lc["step"], lc["command_id"]) == ("ana", 5, "c1")


# -- escalations, ack links, ended runs, digests ------------------------------------------------------

def test_escalations_steps_links_and_digests(store: Store) -> None:
    e = store.escalations
    eid = e.start("r", "grad_norm", "oncall", "slack", "#ml", 10.0)
    assert e.claim(eid, "a", 10.0, 30.0) and not e.claim(eid, "b", 20.0, 30.0) and e.claim(eid, "b", 41.0, 30.0)
    e.record_step(eid, 0, 0, 0, 11.0, "slack", ["@ana"], "paged")
    e.save(eid, next_step=1, state="acked", paused_at=None, shift=0.0, acked_by="ana", closed_at=12.0)
    e.set_mail_root(eid, "<m1>")
    e.set_mail_root(eid, "<m2>")
    row = e.get(eid)
    assert row is not None and (row["state"], row["acked_by"], row["mail_root"]) == ("acked", "ana", "<m1>")
    assert e.open() == [] and [x["id"] for x in e.of("r")] == [eid] and e.steps(eid)[0]["targets"] == ["@ana"]
    assert e.use_link("n1", 1.0, "ana") and not e.use_link("n1", 2.0, "bob")
    e.end_run("r", 5.0, 100)
    e.end_run("r", 6.0, 101)
    assert e.ended() == {"r": 6.0}
    assert e.digest_since("#ml") is None
    e.mark_digest("#ml", 7.0)
    e.mark_digest("#ml", 8.0)
    e.hold_for_digest("#ml", 7.5, "r", "loss", "WARNING", "held")
    assert e.digest_since("#ml") == 8.0 and [h["text"] for h in e.held("#ml", 7.0)] == ["held"]


def test_a_lease_has_one_owner_until_it_runs_out(store: Store) -> None:
    now = time.time()
    assert store.lease("escalator", "a", now, 1.0) and store.lease("escalator", "a", now, 1.0)
    assert not store.lease("escalator", "b", now, 1.0)
    time.sleep(1.2)  # PostgreSQL times leases by its own clock
    assert store.lease("escalator", "b", time.time(), 1.0) and not store.lease("escalator", "a", time.time(), 1.0)


# -- several replicas on one PostgreSQL ---------------------------------------------------------------

def test_a_group_claimed_by_one_replica_is_not_due_for_the_other_until_its_lease_runs_out(pg_pair: Any) -> None:
    a, b = pg_pair
    a.enqueue_many([entry("k1"), entry("k1")])
    group = ("slack", "#ml", "k1", "alert")
    rows = a.claim(group, 200.0)
    assert len(rows) == 2
    a.mark_posted([r.id for r in rows], "ts-9")  # posted, then the replica dies before settling
    assert b.claim(group, 200.0) == [] and b.due(1e9) == [] and a.due(1e9) != []
    time.sleep(1.2)
    taken = b.claim(group, 200.0)
    assert [r.id for r in taken] == [r.id for r in rows] and {r.posted_ref for r in taken} == {"ts-9"}
    assert a.claim(group, 200.0) == []  # the first replica, back, does not take them again
    b.settle([r.id for r in taken], Verdict("delivered", 1, 200.0, posted_ref="ts-9"), 200.0)
    assert a.depth() == 0


def test_a_group_is_claimed_whole_or_not_at_all(pg_pair: Any) -> None:
    a, b = pg_pair
    a.enqueue_many([entry("k1"), entry("k1")])
    group = ("slack", "#ml", "k1", "alert")
    with a.tx():  # a replica in the middle of claiming: one row locked
        a.db.raw("SELECT id FROM outbox ORDER BY id LIMIT 1 FOR UPDATE")
        assert b.claim(group, 200.0) == []
    assert len(b.claim(group, 200.0)) == 2


def test_runs_alerts_and_silences_written_by_one_replica_are_read_by_the_other(pg_pair: Any) -> None:
    a, b = pg_pair
    a.touch_run("r", "llm", {}, "0", 5, 1.0)
    b.touch_run("r", "llm", {}, "1", 7, 2.0)
    a.touch_run("r", "llm", {}, "0", 6, 3.0)
    r = b.run("r")
    assert r is not None and (sorted(r["devices"]), r["last_step"]) == (["0", "1"], 7)
    assert b.silences(0.0) == []
    a.add_silence(Silence(id=0, expires_at=100.0, run_id="r"))
    assert len(b.silences(50.0)) == 1


def test_a_runs_lock_makes_the_other_replica_wait(pg_pair: Any) -> None:
    a, b = pg_pair
    order: list[str] = []
    locked = threading.Event()

    def other() -> None:
        locked.wait(10)
        with b.tx():
            b.lock_run("r")
            order.append("b")

    t = threading.Thread(target=other)
    t.start()
    with a.tx():
        a.lock_run("r")
        locked.set()
        time.sleep(0.3)
        order.append("a")
    t.join(10)
    assert order == ["a", "b"]


def test_a_command_queued_on_one_replica_is_heard_by_the_other(pg_pair: Any) -> None:
    a, b = pg_pair
    heard: list[str | None] = []

    async def main() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(b.listen(heard.append, stop))
        for _ in range(100):
            if heard:
                break
            await asyncio.sleep(0.05)
        assert heard == [None]  # connected: look at every open run once
        a.commands.add(created_at=1.0, user="ana", source="cli", project="llm", run_id="run-7", text="pause",
                       verb="pause", action="pause", params={}, apply_step=None, status="pending", detail="",
                       origin={}, expires_at=None)
        for _ in range(100):
            if "run-7" in heard:
                break
            await asyncio.sleep(0.05)
        stop.set()
        await asyncio.wait_for(task, 5)

    asyncio.run(main())
    assert heard == [None, "run-7"]


def test_text_with_a_nul_is_kept_and_found_again(pg_pair: Any) -> None:
    a, _ = pg_pair
    a.touch_run("nul\x00id", "p", {}, "0", 1, 1.0)
    assert a.run("nul\x00id") is not None


# -- bot.yaml -----------------------------------------------------------------------------------------

def test_the_store_url_is_checked_and_its_password_never_shown(tmp_path: Any) -> None:
    with pytest.raises(ConfigError) as err:
        load_bot_config({"bot": {"store": {"url": "mysql://u:s3cret@db/x", "lease": 0}}})
    assert "bot.store.url" in str(err.value) and "bot.store.lease" in str(err.value) and "s3cret" not in str(err.value)
    assert redact("postgresql://u:s3cret@db:5432/x") == "postgresql://u:***@db:5432/x"
    assert redact("host=db password=s3cret user=u") == "host=db password=*** user=u"
    cfg = load_bot_config({"bot": {"store": {"url": f"sqlite:///{tmp_path}/x.sqlite"}}})
    s = open_store(cfg)
    assert isinstance(s, Store) and s.path == f"{tmp_path}/x.sqlite"
    s.close()
    down = load_bot_config({"bot": {"store": {"url": "postgresql://u:s3cret@127.0.0.1:1/x"}}})
    with pytest.raises(StoreUnavailable) as gone:
        open_store(down)
    assert "s3cret" not in str(gone.value) and "127.0.0.1:1" in str(gone.value)


def test_a_schema_newer_than_this_msmon_is_refused(store: Store, tmp_path: Any) -> None:
    store.db.execute("INSERT INTO schema_version(version, name, applied_at) VALUES(99, 'future', 0)")
    url = f"sqlite:///{store.path}" if store.dialect == "sqlite" else postgres.PG_URL
    schema = None if store.dialect == "sqlite" else store.schema  # type: ignore[attr-defined]
    with pytest.raises(StoreUnavailable, match="version 99, newer than this msmon"):
        open_store(load_bot_config({"bot": {"store": {"url": url, "schema": schema}}}))


def test_a_held_last_step_never_moves_an_alert_back(store: Store) -> None:
    store.save_alerts([AlertRow("fp", "r", "loss", "0", "WARNING", "firing", 50, 1.0)])
    store.touch_alerts([(40, 2.0, "fp")])  # a replica's older touch, written late
    store.touch_alerts([(60, 3.0, "fp")])
    (a,) = store.alerts("r")
    assert (a["last_step"], a["updated_at"]) == (60, 3.0)
    store.touch_alerts([(55, 4.0, "fp")])
    (a,) = store.alerts("r")
    assert a["last_step"] == 60


def test_a_lost_connection_is_reopened_on_the_next_call(pg_pair: Any) -> None:
    import psycopg

    a, b = pg_pair
    pid = a.pg.raw("SELECT pg_backend_pid() AS p").fetchone()["p"]
    b.pg.raw("SELECT pg_terminate_backend(%s)", (pid,))
    with pytest.raises(psycopg.OperationalError):
        a.depth()  # the call that finds it gone fails (its caller retries or answers 5xx/counts)
    assert a.depth() == 0 and a.pg.raw("SELECT pg_backend_pid() AS p").fetchone()["p"] != pid



class CutProxy:
    """A TCP forwarder to PostgreSQL that can be cut (every connection dropped, new ones refused) and mended."""

    def __init__(self, host: str, port: int) -> None:
        import socket

        self.target, self.conns, self.up = (host, port), [], True
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import socket

        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            if not self.up:
                client.close()
                continue
            server = socket.create_connection(self.target)
            self.conns += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a: Any, b: Any) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.close()

    def cut(self) -> None:
        import socket

        self.up = False
        for c in self.conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
        self.conns = []

    def close(self) -> None:
        self.cut()
        self.sock.close()


def test_an_envelope_while_the_database_is_away_is_a_503_to_retry_then_accepted(monkeypatch: Any) -> None:
    postgres.required()
    from urllib.parse import urlsplit

    from tests.fakes.bot_server import BotServer
    from tests.fakes.records import envelope, event

    monkeypatch.setenv("MSMON_TEST_TOKEN", "job-token")
    pg = urlsplit(postgres.PG_URL)
    proxy = CutProxy(pg.hostname or "127.0.0.1", pg.port or 5432)
    url = postgres.PG_URL.replace(f"{pg.hostname}:{pg.port}", f"127.0.0.1:{proxy.port}")
    with postgres.fresh_schema() as schema:
        bot = BotServer({"bot": {"port": 0, "tokens": [{"project": "llm", "env": "MSMON_TEST_TOKEN"}],
                                 "store": {"url": url, "schema": schema}}})
        try:
            assert bot.request("POST", "/v1/ingest", envelope([event()]))[0] == 202
            proxy.cut()  # the database is away: every call fails, a reconnection too
            for _ in range(3):
                code, body = bot.request("POST", "/v1/ingest", envelope([event(step=200)]))
                assert code == 503 and "retry later" in body["error"], body
            proxy.up = True  # back: the next call reconnects
            assert bot.request("POST", "/v1/ingest", envelope([event(step=300)]))[0] == 202
            assert bot.store.run("run-42")["last_step"] == 300
        finally:
            bot.stop()
            proxy.close()
