"""All durable state in one SQLite file (WAL): runs, alerts and what was sent for them, the outbox,
the messages that can be updated, silences. Synchronous and quick; called from the event loop.

`Store` is the embedded default of the store contract (bot/store/contract.py); the PostgreSQL store
(bot/store/postgres.py) shares its SQL, written in the dialect both speak (`ON CONFLICT`, `RETURNING`,
quoted "user"), and overrides what differs with several replicas. The schema is bot/store/migrations/sqlite/,
applied on open."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import msgspec

from bot.pipeline.flow import NotifyState
from bot.pipeline.schedule import GroupKey, OutboxRow, Verdict
from bot.pipeline.silence import Silence
from bot.runs.lifecycle import ended_phase
from bot.store import migrations
from bot.store.rows import AlertView, CommandRow, CommandStatus, RunRow, RunState
from msmon.contract.wire import Severity


class AlertRow(msgspec.Struct, frozen=True):
    """An alert's row as ingest writes it: what the job reports now (severity, status, step) and, when a
    notification was queued, the event's JSON and what the notification log says was sent."""

    fingerprint: str
    run_id: str
    rule: str
    device: str
    severity: str
    status: str  # firing | resolved
    step: int
    at: float
    event: str | None = None  # None: the row keeps its last event
    sent: NotifyState | None = None  # None: what was sent is unchanged (the notification was dropped)


@dataclass(slots=True)
class _RunSeen:
    """What a run's row holds, as the last write left it (SQLiteStore's cache in front of touch_run)."""

    devices: list[str]
    members: set[str]
    labels: str
    last_step: int | None


class OutboxEntry(msgspec.Struct, frozen=True):
    """A new outbox row: one message's part for `receiver`'s `channel`, sent with the other pending
    rows of its `key` and `kind` (alert | repeat | resolve | note) once `next_at` has come."""

    created_at: float
    receiver: str
    channel: str
    kind: str
    key: str
    run_id: str | None
    payload: str
    next_at: float


OUTBOX_COLUMNS = ("id, created_at, receiver, channel, kind, key, run_id, payload, attempts, next_at, delivered_at,"
                  " error, dead_at, posted_ref")  # an OutboxRow's fields (not the claim columns)


class Store:
    """The SQLite store: one process, one file. `shared` False: this process is the only writer, so
    in-memory copies (the alert index, the run and silence caches) stay exact."""

    dialect: migrations.Dialect = "sqlite"
    shared = False
    Error: type[Exception] = sqlite3.Error  # what a failed statement raises

    def __init__(self, path: str) -> None:
        self.path = path
        self.owner = "sqlite"  # one process per file: a restart keeps its leases
        self.db: Any = sqlite3.connect(path, isolation_level=None, check_same_thread=False)  # PostgreSQL: a PgDb
        self.db.row_factory = sqlite3.Row
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable across a process kill
        self._migrate()
        self.commands = CommandLog(self.db)
        self.escalations = EscalationLog(self.db)
        self.attempts = AttemptLog(self.db)
        # Read-through copies of what ingest reads on every envelope. This Store is their only writer;
        # a rolled-back transaction drops them (they are read again).
        # run -> what its row holds (devices, their set, labels' JSON, last step): an envelope writes only what changed
        self._run_cache: OrderedDict[str, _RunSeen] = OrderedDict()
        # run -> its project, which never changes while the row lives (the project stays its creator's): every job
        # request asks it (project_of), so a known run's costs no read
        self._projects: OrderedDict[str, str] = OrderedDict()
        self._silence_cache: list[Silence] | None = None
        self._held: dict[str, dict[str, Any]] = {}  # run -> columns of its update held for flush_runs (touch_run)
        # held updates flush_runs wrote inside a transaction not its own, until that transaction ends: its commit
        # drops them, its rollback puts them back in `_held` (a group commit's waiter is never answered for them)
        self._taken: list[dict[str, dict[str, Any]]] = []

    def close(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self.flush_runs()  # the runs' last held updates (a request waiting for them was answered 503 or not yet)
        self.db.close()

    @property
    def holding(self) -> bool:
        """Whether runs' updates are held for the next `flush_runs` (touch_run's `defer`)."""
        return bool(self._held)

    @property
    def where(self) -> str:
        """Where the state is, for log lines (never a password)."""
        return self.path

    def _migrate(self) -> None:
        """Apply bot/store/migrations/sqlite/ above the file's schema_version, each with its row in one script."""
        self.db.execute(migrations.VERSION_TABLE.format(real="REAL"))
        if self.db.execute("SELECT name FROM sqlite_master WHERE name='outbox'").fetchone() is not None:
            self._outbox_columns()  # a file from before dead letters (and before versions)
        row = self.db.execute("SELECT MAX(version) AS v FROM schema_version").fetchone()
        for m in migrations.pending("sqlite", int(row["v"] or 0)):
            self.db.executescript(f"BEGIN IMMEDIATE;\n{m.sql}\nINSERT INTO schema_version(version, name, applied_at)"
                                  f" VALUES({m.version}, '{m.name}', {time.time()!r});\nCOMMIT;")

    def schema_version(self) -> int:
        return int(self.db.execute("SELECT MAX(version) AS v FROM schema_version").fetchone()["v"] or 0)

    # -- one owner at a time (the escalator, the digests, command expiry) ------------------------

    def lease(self, name: str, owner: str, now: float, ttl: float) -> bool:
        """Take or renew lease `name` for `ttl` seconds; False while another owner holds it."""
        cur = self.db.execute(
            "INSERT INTO leases(name, owner, until) VALUES(?,?,?) ON CONFLICT(name) DO UPDATE SET"
            " owner=excluded.owner, until=excluded.until WHERE leases.owner=excluded.owner OR leases.until<?",
            (name, owner, now + ttl, now))
        return bool(cur.rowcount == 1)

    def release(self, owner: str) -> None:
        """A process that stops gives up what it holds (its named leases, its escalations), so that the next
        owner takes over at once instead of after the lease."""
        self.db.execute("DELETE FROM leases WHERE owner=?", (owner,))
        self.db.execute("UPDATE escalations SET owner=NULL, lease_until=NULL WHERE owner=?", (owner,))

    def lock_run(self, run_id: str) -> None:
        """Inside a transaction: no other writer decides on this run's alerts until it ends. One SQLite
        process holds the whole file (BEGIN IMMEDIATE): nothing to do."""

    async def listen(self, on_command: Callable[[str | None], None], stop: Any) -> None:
        """Call `on_command(run_id)` when another replica queues a command; one process has none."""

    def tx(self) -> contextlib.AbstractContextManager[Any]:
        self.flush_runs()  # the runs' held updates first, in their own commit (a rollback here keeps them)
        return _Tx(self.db, self._rolled_back, self._committed)

    def _committed(self) -> None:
        self._taken.clear()  # written for good

    def _rolled_back(self) -> None:
        """A transaction failed: the held updates it had taken are held again, the caches are read again."""
        taken, self._taken = self._taken, []
        for held in taken:
            self._restore(held)
        self._forget()

    def _forget(self) -> None:
        self._run_cache.clear()
        self._projects = OrderedDict()
        self._silence_cache = None

    def _restore(self, taken: dict[str, dict[str, Any]]) -> None:
        """Held updates a failed write had taken, held again under what was held since (newer, kept over them):
        the next flush writes them, and until one commits no group commit answers 202 for them."""
        for run_id, old in taken.items():
            newer = self._held.get(run_id)
            self._held[run_id] = old if newer is None else merge_sets(old, newer)

    # -- runs -----------------------------------------------------------------------------------

    def touch_run(self, run_id: str, project: str, labels: dict[str, str], device: str, step: int | None,
                  now: float, heartbeat: bool = False, paused: bool | None = None, defer: bool = False) -> None:
        """The run's liveness, last step and devices. The devices' and labels' JSON are written only when they
        changed: a run of thousands of ranks does not rewrite (or even encode) its list of devices per envelope.

        `defer`: a known run's update is held (merged with the run's other held updates) until `flush_runs`, which
        writes every run's in one transaction: the group commit of envelopes without events (bot/ingest/commit.py),
        whose 202 waits for it. A new run's row is written at once."""
        seen = self._run_cache.get(run_id)
        labels_json = json.dumps(labels) if labels else "{}"
        if seen is None:
            self.flush_runs()
            row = self.db.execute("SELECT devices, labels, last_step FROM runs WHERE run_id=?", (run_id,)).fetchone()
            if row is not None:
                devices = json.loads(row["devices"])
                seen = _RunSeen(devices, set(devices), row["labels"], row["last_step"])
        if seen is None:
            self.db.execute(
                "INSERT INTO runs(run_id, project, labels, devices, first_seen, last_seen, last_step, last_heartbeat,"
                " last_progress, paused) VALUES(?,?,?,?,?,?,?,?,?,?)",
                (run_id, project, labels_json, json.dumps([device]), now, now, step,
                 now if heartbeat else None, now, int(bool(paused))))
            self._remember_run(run_id, _RunSeen([device], {device}, labels_json, step))
            return
        held = self._held.get(run_id) if defer else None
        sets: dict[str, Any] = {"gone": 0} if held is None else held  # the project stays its creator's
        sets["last_seen"] = now
        if device not in seen.members:
            seen.devices = [*seen.devices, device]
            seen.members.add(device)
            sets["devices"] = seen.devices  # encoded when written: once per batch
        if labels_json != seen.labels:
            seen.labels = labels_json
            sets["labels"] = labels_json
        if step is not None and (seen.last_step is None or step > seen.last_step):
            seen.last_step = step
            sets["last_step"], sets["last_progress"] = step, now
        if heartbeat:
            sets["last_heartbeat"] = now
        if paused is not None:
            sets["paused"] = int(paused)
        self._remember_run(run_id, seen)
        if defer:
            self._held[run_id] = sets
            return
        try:
            self.flush_runs()  # what is held was heard before this: written first
            self._update_run(run_id, sets)
        except BaseException:
            self._run_cache.pop(run_id, None)  # it says what was not written: read the row again when next heard
            raise

    def _update_run(self, run_id: str, sets: dict[str, Any]) -> None:
        values = [json.dumps(v) if k == "devices" else v for k, v in sets.items()]  # `sets` kept: a retry writes it
        self.db.execute(f"UPDATE runs SET {'=?, '.join(sets)}=? WHERE run_id=?",  # noqa: S608 - our column names
                        (*values, run_id))

    def flush_runs(self, now: float | None = None) -> int:
        """Write the runs' held updates (touch_run's `defer`) in one transaction; how many runs. Called before
        anything else writes or reads the runs table here, so nothing reads behind them. `now` (the group commit's
        clock): a run's last_seen is at least that, so a pass that asks which runs were seen since it last looked
        (the watchdog) never misses one held while it looked.

        Whatever path calls it, a write that fails puts what it took back (`_restore`): held until a flush commits
        it. Inside a transaction not its own, they are committed with it or, on its rollback, held again."""
        if not self._held:
            return 0
        held, self._held = self._held, {}
        outer = self.db.in_transaction
        try:
            with contextlib.nullcontext() if outer else self.tx():
                for run_id, sets in held.items():
                    if now is not None and now > sets["last_seen"]:
                        sets["last_seen"] = now
                    self._update_run(run_id, sets)
        except BaseException:
            self._restore(held)
            raise
        if outer:
            self._taken.append(held)
        return len(held)

    def _remember_run(self, run_id: str, seen: _RunSeen) -> None:
        self._run_cache[run_id] = seen
        self._run_cache.move_to_end(run_id)
        while len(self._run_cache) > 10_000:
            self._run_cache.popitem(last=False)

    def runs(self) -> list[RunRow]:
        self.flush_runs()
        latest = self.attempts.latest_all()
        return [self._run(r, latest.get(r["run_id"])) for r in
                self.db.execute("SELECT * FROM runs ORDER BY last_seen DESC")]

    def runs_page(self, project: str | None, after: tuple[float, str] | None, limit: int) -> list[RunRow]:
        """Up to `limit` runs (of `project`; None: every project), most recently seen first, after the run
        `after` (its last_seen and run id: a page's cursor): a page read, never every run."""
        self.flush_runs()
        q, args = "SELECT * FROM runs WHERE 1=1", list[Any]()
        if project is not None:
            q += " AND project=?"
            args.append(project)
        if after is not None:
            q += " AND (COALESCE(last_seen, 0) < ? OR (COALESCE(last_seen, 0) = ? AND run_id > ?))"
            args += [after[0], after[0], after[1]]
        rows = self.db.execute(q + " ORDER BY COALESCE(last_seen, 0) DESC, run_id LIMIT ?", (*args, limit)).fetchall()
        return [self._run(r, self.attempts.latest(r["run_id"])) for r in rows]

    def project_of(self, run_id: str) -> str | None:
        """The project of a run (None: no such run): what every job request checks, in one read (none for a run
        this store has read or written lately)."""
        known = None if self.shared else self._projects.get(run_id)  # replicas: another may have pruned it
        if known is not None:
            return known
        r = self.db.execute("SELECT project FROM runs WHERE run_id=?", (run_id,)).fetchone()
        if r is None:
            return None
        project = str(r["project"])
        if self.shared:
            return project
        self._projects[run_id] = project
        while len(self._projects) > 10_000:
            self._projects.popitem(last=False)
        return project

    def run(self, run_id: str) -> RunRow | None:
        self.flush_runs()
        r = self.db.execute("SELECT * FROM runs WHERE run_id=?", (run_id,)).fetchone()
        return None if r is None else self._run(r, self.attempts.latest(run_id))

    @staticmethod
    def _run(r: Any, attempt: dict[str, Any] | None = None) -> RunRow:
        """A run's row, with its current attempt (bot/ingest/runs.py): its number, and when and why it ended."""
        d = dict(r)
        d["labels"] = json.loads(d["labels"] or "{}")
        d["devices"] = json.loads(d["devices"] or "[]")
        d["paused"], d["gone"] = bool(d["paused"]), bool(d["gone"])
        d["attempt"] = attempt["attempt"] if attempt else 1
        d["attempt_started"] = attempt["started_at"] if attempt else d["first_seen"]
        d["ended_at"] = attempt["ended_at"] if attempt else None
        d["end_reason"] = attempt["end_reason"] if attempt else None
        d["ended"] = d["ended_at"] is not None
        d["state"] = (RunState(ended_phase(d["end_reason"]).value) if d["ended"] else RunState.GONE if d["gone"]
                      else RunState.PAUSED if d["paused"] else RunState.RUNNING)
        return cast(RunRow, d)

    def set_paused(self, run_id: str, paused: bool, now: float) -> None:
        """A job reported it paused or resumed (its progress restarts now)."""
        self.flush_runs()
        self.db.execute("UPDATE runs SET paused=?, last_progress=CASE WHEN ? THEN last_progress ELSE ? END"
                        " WHERE run_id=?", (int(paused), bool(paused), now, run_id))

    def restart_run(self, run_id: str, now: float) -> None:
        """A new attempt of the run (bot/ingest/runs.py): its steps start again (the last step may go back), it is
        neither paused nor gone, its progress counts from now."""
        self.flush_runs()
        self.db.execute("UPDATE runs SET last_step=NULL, last_progress=?, paused=0, gone=0 WHERE run_id=?",
                        (now, run_id))
        self._run_cache.pop(run_id, None)

    def mark_gone(self, run_id: str, gone: bool) -> None:
        self.flush_runs()
        self.db.execute("UPDATE runs SET gone=? WHERE run_id=?", (int(gone), run_id))

    def prune_runs(self, before: float, limit: int = 500) -> list[str]:
        """Forget up to `limit` runs last seen before `before` (bot.retention) with what is theirs alone: their
        alerts and notification log, level changes, attempts, end and thread roots. Never a run with an alert
        firing, an escalation open or a command waiting; the command log (the audit) stays. The run ids."""
        ids = [r["run_id"] for r in self.db.execute(
            "SELECT run_id FROM runs WHERE last_seen<?"
            " AND run_id NOT IN (SELECT run_id FROM alerts WHERE status='firing')"
            " AND run_id NOT IN (SELECT run_id FROM escalations WHERE closed_at IS NULL AND run_id IS NOT NULL)"
            " AND run_id NOT IN (SELECT run_id FROM commands WHERE status='pending' AND run_id IS NOT NULL)"
            " ORDER BY last_seen LIMIT ?", (before, limit))]
        with self.tx():
            for run_id in ids:
                for table in ("alerts", "level_changes", "run_attempts", "run_ends", "runs"):
                    self.db.execute(f"DELETE FROM {table} WHERE run_id=?", (run_id,))  # noqa: S608 - names above
                self.db.execute("DELETE FROM messages WHERE substr(key, 1, length(?) + 1) = ? || '|'",
                                (run_id, run_id))
                self._run_cache.pop(run_id, None)
                self._projects.pop(run_id, None)
                self._pruned(run_id)
        return ids

    def _pruned(self, run_id: str) -> None:
        """A run's row deleted (in prune_runs' transaction): the other replicas forget its project (PostgreSQL)."""

    # -- alerts and what was sent for them (the notification log) -------------------------------

    def alert_states(self, fps: list[str]) -> dict[str, tuple[NotifyState, str | None, str | None, bool]]:
        """For each fingerprint with a row: what was sent for it, its severity, status and whether someone
        acknowledged it (one query per 500)."""
        out: dict[str, tuple[NotifyState, str | None, str | None, bool]] = {}
        uniq = list(dict.fromkeys(fps))
        for i in range(0, len(uniq), 500):
            chunk = uniq[i:i + 500]
            rows = self.db.execute("SELECT fingerprint, severity, status, sent_severity, sent_at, sent_resolved,"
                                   " sent_step, acked_by FROM alerts"
                                   f" WHERE fingerprint IN ({','.join('?' * len(chunk))})", chunk)
            for r in rows:
                sent = r["sent_severity"]
                notify = NotifyState() if sent is None else NotifyState(Severity(sent), r["sent_at"],
                                                                        bool(r["sent_resolved"]), r["sent_step"])
                out[r["fingerprint"]] = (notify, r["severity"], r["status"], r["acked_by"] is not None)
        return out

    def touch_alerts(self, rows: list[tuple[int, float, str]]) -> None:
        """(last step, updated at, fingerprint): a suppressed repeat moved the alert's last step (forward
        only: another replica may have written a later one)."""
        self.db.executemany("UPDATE alerts SET last_step=CASE WHEN last_step IS NULL OR ?1>last_step THEN ?1"
                            " ELSE last_step END, updated_at=?2 WHERE fingerprint=?3", rows)

    def save_alerts(self, rows: list[AlertRow]) -> None:
        """Upsert alerts. A new episode (the row was resolved) starts at this step and is not acknowledged."""
        self.db.executemany(
            "INSERT INTO alerts(fingerprint, run_id, rule, device, severity, status, first_step, last_step,"
            " updated_at, event, sent_severity, sent_at, sent_resolved, sent_step)"
            " VALUES(?1,?2,?3,?4,?5,?6,?7,?7,?8,?9,CASE WHEN ?10 THEN ?11 END,CASE WHEN ?10 THEN CAST(?12 AS REAL) END,"
            " CASE WHEN ?10 THEN ?13 ELSE 0 END,CASE WHEN ?10 THEN CAST(?14 AS BIGINT) END)"
            " ON CONFLICT(fingerprint) DO UPDATE SET severity=excluded.severity, status=excluded.status,"
            " last_step=excluded.last_step, updated_at=excluded.updated_at,"
            " event=COALESCE(excluded.event, alerts.event),"
            " first_step=CASE WHEN alerts.status='resolved' THEN excluded.first_step ELSE alerts.first_step END,"
            " acked_by=CASE WHEN alerts.status='resolved' THEN NULL ELSE alerts.acked_by END,"
            " sent_severity=CASE WHEN ?10 THEN ?11 ELSE alerts.sent_severity END,"
            " sent_at=CASE WHEN ?10 THEN CAST(?12 AS REAL) ELSE alerts.sent_at END,"
            " sent_resolved=CASE WHEN ?10 THEN ?13 ELSE alerts.sent_resolved END,"
            " sent_step=CASE WHEN ?10 THEN CAST(?14 AS BIGINT) ELSE alerts.sent_step END", map(_alert_params, rows))

    def enqueue_many(self, entries: list[OutboxEntry]) -> None:
        self.db.executemany("INSERT INTO outbox(created_at, receiver, channel, kind, key, run_id, payload, next_at)"
                            " VALUES(?,?,?,?,?,?,?,?)", map(msgspec.structs.astuple, entries))

    def ack(self, run_id: str, rule: str, device: str | None, user: str) -> list[str]:
        """Acknowledge the firing alerts of a run's rule (one device, or all); their fingerprints. Under the
        run's lock (replicas: after any envelope of the run deciding on these alerts, never crossed with one)."""
        self.lock_run(run_id)
        q, args = "SELECT fingerprint FROM alerts WHERE run_id=? AND rule=? AND status='firing'", [run_id, rule]
        if device is not None:
            q += " AND device=?"
            args.append(device)
        fps = [r["fingerprint"] for r in self.db.execute(q, args)]
        self.db.executemany("UPDATE alerts SET acked_by=? WHERE fingerprint=?", [(user, fp) for fp in fps])
        return fps

    def error_firing(self, run_id: str) -> bool:
        return self.db.execute("SELECT 1 FROM alerts WHERE run_id=? AND status='firing' AND severity='ERROR'"
                               " LIMIT 1", (run_id,)).fetchone() is not None

    def alerts(self, run_id: str | None = None, status: str | None = None) -> list[AlertView]:
        q, args = "SELECT * FROM alerts WHERE 1=1", []
        if run_id is not None:
            q += " AND run_id=?"
            args.append(run_id)
        if status is not None:
            q += " AND status=?"
            args.append(status)
        out: list[AlertView] = []
        for r in self.db.execute(q + " ORDER BY updated_at DESC", args):
            d: Any = dict(r)
            d.pop("event", None)
            d.pop("changed", None)
            out.append(d)
        return out

    # -- what changed since a periodic pass last looked (migrations 0005 sqlite / 0004 postgresql) -----------

    def change_mark(self) -> int:
        """A mark for `changed_alerts`: every alert changed after this call (status, severity, ack or event) has
        a change number at least this. Here the counter's next number: one writer, one order."""
        return int(self.db.execute("SELECT n FROM alert_changes").fetchone()["n"]) + 1

    def changed_alerts(self, mark: int) -> tuple[list[tuple[str, str]], int]:
        """The (run, rule) of every alert changed at or after `mark`, each once, and the mark to read from next
        (taken first: a change made meanwhile is read again next time, never lost)."""
        nxt = self.change_mark()
        # no DISTINCT in SQL: SQLite would then scan alerts_run for the order instead of searching alerts_changed
        rows = self.db.execute("SELECT run_id, rule FROM alerts WHERE changed>=?", (mark,))
        return list(dict.fromkeys((r["run_id"], r["rule"]) for r in rows)), nxt

    def runs_seen_since(self, t: float) -> list[str]:
        """The runs whose last_seen is at or after `t` (the index runs_last_seen): heard from since then (the held
        updates written first, as for every read of the runs)."""
        self.flush_runs()
        return [r["run_id"] for r in self.db.execute("SELECT run_id FROM runs WHERE last_seen>=?", (t,))]

    # -- outbox ---------------------------------------------------------------------------------

    def _outbox_columns(self) -> None:
        """A state file from before dead letters: add their columns (SQLite keeps the rows)."""
        have = {r[1] for r in self.db.execute("PRAGMA table_info(outbox)")}
        for column, decl in (("dead_at", "REAL"), ("posted_ref", "TEXT")):
            if column not in have:
                self.db.execute(f"ALTER TABLE outbox ADD COLUMN {column} {decl}")

    _PENDING = "delivered_at IS NULL AND dead_at IS NULL"
    _AVAILABLE = _PENDING  # what this process may deliver (PostgreSQL: not claimed by a live replica)

    def _rows(self, sql: str, args: tuple[Any, ...]) -> list[OutboxRow]:
        return [OutboxRow(**dict(r)) for r in self.db.execute(sql.replace("SELECT *", f"SELECT {OUTBOX_COLUMNS}", 1),
                                                              args)]

    def claim(self, group: GroupKey, now: float) -> list[OutboxRow]:
        """The pending rows of one group, for this process to deliver now (all of them, or none when
        another replica is delivering the group). One SQLite process: its pending rows."""
        return self.pending(*group)

    def pending(self, receiver: str, channel: str, key: str, kind: str) -> list[OutboxRow]:
        """Undelivered rows of one group, whatever their due time (they are sent together)."""
        return self._rows(f"SELECT * FROM outbox WHERE {self._PENDING} AND receiver=? AND channel=? AND key=?"
                          " AND kind=? ORDER BY id", (receiver, channel, key, kind))

    def delivered_since(self, receiver: str, channel: str, key: str, kind: str, since: float) -> list[OutboxRow]:
        return self._rows("SELECT * FROM outbox WHERE delivered_at IS NOT NULL AND receiver=? AND channel=?"
                          " AND key=? AND kind=? AND delivered_at>=? ORDER BY id",
                          (receiver, channel, key, kind, since))

    def due_lane(self, now: float, receiver: str, only: bool, limit: int = 200) -> list[OutboxRow]:
        """Due rows of `receiver` (only) or of every other receiver (not only): the email lane has a worker
        of its own, so a hanging SMTP server never holds a chat message."""
        op = "=" if only else "<>"
        return self._due(f"next_at<=? AND receiver{op}?", (now, receiver), limit)

    def next_due_lane(self, receiver: str, only: bool) -> float | None:
        op = "=" if only else "<>"
        r = self.db.execute(f"SELECT MIN(next_at) AS t FROM outbox WHERE {self._AVAILABLE} AND receiver{op}?",
                            (receiver,)).fetchone()
        return None if r is None else r["t"]

    def due(self, now: float, limit: int = 200) -> list[OutboxRow]:
        return self._due("next_at<=?", (now,), limit)

    def _due(self, where: str, args: tuple[Any, ...], limit: int) -> list[OutboxRow]:
        """Due rows, oldest first, at most `limit` of each lane (receiver and channel): a lane with a backlog
        (a storm to one robot, a receiver that hangs) never hides another lane's rows."""
        return self._rows(f"SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY receiver, channel ORDER BY id)"
                          f" AS lane_n FROM outbox WHERE {self._AVAILABLE} AND {where}) AS due WHERE lane_n<=?"
                          " ORDER BY id LIMIT ?", (*args, limit, 20 * limit))

    def next_due_at(self) -> float | None:
        r = self.db.execute(f"SELECT MIN(next_at) AS t FROM outbox WHERE {self._AVAILABLE}").fetchone()
        return None if r is None else r["t"]

    def settle(self, ids: list[int], verdict: Verdict, now: float) -> None:
        """Write a delivery verdict (bot.delivery) to the rows of its group."""
        delivered = now if verdict.state == "delivered" else None
        dead = now if verdict.state == "dead" else None
        self.db.executemany(
            "UPDATE outbox SET attempts=?, next_at=?, error=?, posted_ref=?, delivered_at=COALESCE(?, delivered_at),"
            " dead_at=COALESCE(?, dead_at), claimed_by=NULL, claim_until=NULL WHERE id=?",
            [(verdict.attempts, verdict.next_at, verdict.error, verdict.posted_ref, delivered, dead, i) for i in ids])

    def mark_posted(self, ids: list[int], ref: str) -> None:
        """The group's message is out as `ref`: a retry only runs its follow-up steps."""
        self.db.executemany("UPDATE outbox SET posted_ref=? WHERE id=?", [(ref, i) for i in ids])

    def due_now(self, now: float) -> int:
        """After a restart: what waited for a retry is due at once (the outage may be long over)."""
        cur = self.db.execute(f"UPDATE outbox SET next_at=? WHERE {self._PENDING} AND next_at>? AND attempts>0",
                              (now, now))
        return int(cur.rowcount)

    def depth(self) -> int:
        return int(self.db.execute(f"SELECT COUNT(*) FROM outbox WHERE {self._PENDING}").fetchone()[0])

    def set_payload(self, row_id: int, payload: str) -> None:
        """What is left of a row to send (a mail's refused recipients, after the others took it)."""
        self.db.execute("UPDATE outbox SET payload=? WHERE id=?", (payload, row_id))

    def due_now_lane(self, receiver: str, channel: str, now: float) -> int:
        """A lane that was down delivered again: its rows waiting for a retry are due at once."""
        cur = self.db.execute(f"UPDATE outbox SET next_at=? WHERE {self._PENDING} AND receiver=? AND channel=?"
                              " AND next_at>? AND attempts>0", (now, receiver, channel, now))
        return int(cur.rowcount)

    def set_sent(self, rows: list[tuple[NotifyState, str]]) -> None:
        """(what was sent, fingerprint): the notification log of alerts whose message was given up."""
        self.db.executemany("UPDATE alerts SET sent_severity=?, sent_at=?, sent_resolved=?, sent_step=?"
                            " WHERE fingerprint=?",
                            [(n.severity.value if n.severity else None, n.sent_at, int(n.resolved), n.step, fp)
                             for n, fp in rows])

    def dead_count(self) -> int:
        return int(self.db.execute("SELECT COUNT(*) FROM outbox WHERE dead_at IS NOT NULL").fetchone()[0])

    def dead_letters(self, limit: int = 100) -> list[OutboxRow]:
        """Rows given up on, newest first."""
        return self._rows("SELECT * FROM outbox WHERE dead_at IS NOT NULL ORDER BY dead_at DESC, id DESC LIMIT ?",
                          (limit,))

    # -- messages that can be updated or answered in their thread -------------------------------

    def save_message(self, key: str, receiver: str, channel: str, ts: str, now: float) -> None:
        self.db.execute("INSERT INTO messages(key, receiver, channel, ts, created_at) VALUES(?,?,?,?,?)"
                        " ON CONFLICT(key) DO UPDATE SET receiver=excluded.receiver, channel=excluded.channel,"
                        " ts=excluded.ts, created_at=excluded.created_at", (key, receiver, channel, ts, now))

    def message(self, key: str) -> dict[str, Any] | None:
        r = self.db.execute("SELECT * FROM messages WHERE key=?", (key,)).fetchone()
        return None if r is None else dict(r)

    def retire_message(self, key: str, now: float) -> None:
        """The episode is over: the next firing posts a new message."""
        self.db.execute("UPDATE messages SET key=? WHERE key=?", (f"{key}|closed@{now}", key))

    # -- silences -------------------------------------------------------------------------------

    def add_silence(self, s: Silence) -> int:
        self._silence_cache = None
        cur = self.db.execute(
            "INSERT INTO silences(expires_at, run_id, rule, device, severity, created_by, comment)"
            " VALUES(?,?,?,?,?,?,?) RETURNING id",
            (s.expires_at, s.run_id, s.rule, s.device, s.severity, s.created_by, s.comment))
        return int(cur.fetchone()["id"])

    def silences(self, now: float | None = None) -> list[Silence]:
        """The silences in force at `now` (read once, then kept until one is added)."""
        now = time.time() if now is None else now
        if self._silence_cache is None:
            rows = self.db.execute("SELECT * FROM silences WHERE expires_at>?", (now,))
            self._silence_cache = [
                Silence(id=r["id"], expires_at=r["expires_at"], run_id=r["run_id"], rule=r["rule"],
                        device=r["device"], severity=r["severity"], created_by=r["created_by"] or "",
                        comment=r["comment"] or "") for r in rows]
        return [x for x in self._silence_cache if x.expires_at > now]


def _alert_params(r: AlertRow) -> tuple[Any, ...]:
    """save_alerts' 14 parameters for one row (?10: whether a notification was queued)."""
    sent = r.sent
    if sent is None:
        return (r.fingerprint, r.run_id, r.rule, r.device, r.severity, r.status, r.step, r.at, r.event, False,
                None, None, 0, None)
    return (r.fingerprint, r.run_id, r.rule, r.device, r.severity, r.status, r.step, r.at, r.event, True,
            None if sent.severity is None else sent.severity.value, sent.sent_at, int(sent.resolved), sent.step)


# -- commands: every one received, allowed or not (the audit log), and the open ones' delivery state ---

_COMMAND_JSON = ("params", "results", "origin")
_STATUS = {s.value: s for s in CommandStatus}
_decode = msgspec.json.Decoder().decode


def _json(text: str) -> Any:
    """A JSON column (written by json.dumps) read back: msgspec, several times faster than json.loads, which reads
    the one thing msgspec does not (NaN or Infinity that json.dumps wrote for a non-finite float)."""
    try:
        return _decode(text)
    except msgspec.DecodeError:
        return json.loads(text)


def _command(r: Any) -> CommandRow:
    d: Any = dict(r)  # typed by the return: a cast() would be a call per row, and a poll reads every open command
    for k in _COMMAND_JSON:
        d[k] = _json(d[k] or "{}")
    d["status"] = _STATUS[d["status"]]  # a dict lookup: an Enum call per row would cost 5% of a poll
    row: CommandRow = d
    return row


class CommandLog:
    """The commands table of a Store."""

    def __init__(self, db: Any, queued: Callable[[str], None] = lambda run_id: None) -> None:
        self.db = db
        self._queued = queued  # a pending command for a run was added (PostgreSQL: NOTIFY the replicas)

    def add(self, *, created_at: float, user: str, source: str, project: str | None, run_id: str | None, text: str,
            verb: str, action: str | None, params: dict[str, Any], apply_step: int | None, status: CommandStatus,
            detail: str, origin: dict[str, Any], expires_at: float | None) -> CommandRow:
        cur = self.db.execute(
            "INSERT INTO commands(created_at, \"user\", source, project, run_id, text, verb, action, params,"
            " apply_step, status, detail, origin, expires_at, updated_at) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
            " RETURNING seq",
            (created_at, user, source, project, run_id, text, verb, action, json.dumps(params), apply_step,
             CommandStatus(status).value, detail, json.dumps(origin), expires_at, created_at))
        seq = int(cur.fetchone()["seq"])
        self.db.execute("UPDATE commands SET id=? WHERE seq=?", (f"c{seq}", seq))
        if run_id is not None and status == CommandStatus.PENDING:
            self._queued(run_id)
        got = self.get(f"c{seq}")
        assert got is not None
        return got

    def get(self, cid: str) -> CommandRow | None:
        r = self.db.execute("SELECT * FROM commands WHERE id=?", (cid,)).fetchone()
        return None if r is None else _command(r)

    def open_for(self, run_id: str, after: int = 0) -> list[CommandRow]:
        """Commands still to be applied by a run's ranks, in order, issued after cursor `after`."""
        return [_command(r) for r in self.db.execute(
            "SELECT * FROM commands WHERE run_id=? AND status='pending' AND seq>? ORDER BY seq", (run_id, after))]

    def open_all(self) -> list[CommandRow]:
        return [_command(r) for r in self.db.execute("SELECT * FROM commands WHERE status='pending' ORDER BY seq")]

    def update(self, cid: str, now: float, **fields: Any) -> None:
        cols = ", ".join(f"{k}=?" for k in fields)
        vals = [json.dumps(v) if k in _COMMAND_JSON else CommandStatus(v).value if k == "status" else v
                for k, v in fields.items()]
        self.db.execute(f"UPDATE commands SET {cols}, updated_at=? WHERE id=?", (*vals, now, cid))  # noqa: S608

    def first_signed(self, signature: str, ts: int, horizon: float) -> bool:
        """Record a signed Slack request; False when its signature was already recorded (a replay).
        Signatures with a timestamp before `horizon` are stale for the verifier anyway: forgotten here."""
        self.db.execute("DELETE FROM slack_signed WHERE ts<?", (horizon,))
        cur = self.db.execute("INSERT INTO slack_signed(signature, ts) VALUES(?,?) ON CONFLICT DO NOTHING",
                              (signature, ts))
        return bool(cur.rowcount == 1)

    def add_level_change(self, *, run_id: str, device: str, step: int, at: float, rule: str, action: str, who: str,
                         why: str, detail: str, command_id: str | None) -> None:
        """One rank's live threshold change as the job answered it (its detail says the levels and their effect)."""
        self.db.execute("INSERT INTO level_changes(run_id, device, step, at, rule, action, who, why, detail, "
                        "command_id) VALUES(?,?,?,?,?,?,?,?,?,?)",
                        (run_id, device, step, at, rule, action, who, why, detail, command_id))

    def level_changes(self, run_id: str, limit: int = 5) -> list[dict[str, Any]]:
        """A run's latest level changes, newest first."""
        return [dict(r) for r in self.db.execute(
            "SELECT * FROM level_changes WHERE run_id=? ORDER BY seq DESC LIMIT ?", (run_id, limit))]

    def recent(self, limit: int = 100, run_id: str | None = None) -> list[CommandRow]:
        q, args = "SELECT * FROM commands", []
        if run_id is not None:
            q += " WHERE run_id=?"
            args.append(run_id)
        return [_command(r) for r in self.db.execute(q + " ORDER BY seq DESC LIMIT ?", (*args, limit))]


# -- escalations, their steps, used ack links, runs that ended, digests (bot/escalation, bot/delivery/digest.py) ----



class EscalationLog:
    """The escalation tables of a Store. Ownership: a bot instance acts on an escalation only while it
    holds its lease (`owner`, `lease_until`), taken and renewed in the transaction that acts on it;
    one replica escalates, another takes over when the lease runs out."""

    def __init__(self, db: Any) -> None:
        self.db = db

    def open(self) -> list[dict[str, Any]]:
        return [dict(r) for r in self.db.execute("SELECT * FROM escalations WHERE state='active' ORDER BY id")]

    def get(self, esc_id: int) -> dict[str, Any] | None:
        r = self.db.execute("SELECT * FROM escalations WHERE id=?", (esc_id,)).fetchone()
        return None if r is None else dict(r)

    def of(self, run_id: str | None = None) -> list[dict[str, Any]]:
        q: str = "SELECT * FROM escalations"
        args: tuple[Any, ...] = ()
        if run_id is not None:
            q, args = q + " WHERE run_id=?", (run_id,)
        return [dict(r) for r in self.db.execute(q + " ORDER BY id", args)]

    def start(self, run_id: str, rule: str, policy: str, receiver: str, channel: str, now: float) -> int:
        cur = self.db.execute("INSERT INTO escalations(run_id, rule, policy, receiver, channel, started_at)"
                              " VALUES(?,?,?,?,?,?) RETURNING id", (run_id, rule, policy, receiver, channel, now))
        return int(cur.fetchone()["id"])

    def claim(self, esc_id: int, owner: str, now: float, lease: float) -> bool:
        """Take or renew the lease of an escalation; False when another owner holds it."""
        cur = self.db.execute("UPDATE escalations SET owner=?, lease_until=? WHERE id=? AND (owner IS NULL OR"
                              " owner=? OR lease_until<?)", (owner, now + lease, esc_id, owner, now))
        return bool(cur.rowcount == 1)

    def save(self, esc_id: int, *, next_step: int, state: str, paused_at: float | None, shift: float,
             acked_by: str | None, closed_at: float | None) -> None:
        self.db.execute("UPDATE escalations SET next_step=?, state=?, paused_at=?, shift=?, acked_by=?, closed_at=?"
                        " WHERE id=?", (next_step, state, paused_at, shift, acked_by, closed_at, esc_id))

    def set_mail_root(self, esc_id: int, message_id: str) -> None:
        self.db.execute("UPDATE escalations SET mail_root=COALESCE(mail_root, ?) WHERE id=?", (message_id, esc_id))

    def record_step(self, esc_id: int, step: int, rnd: int, level: int, at: float, how: str, targets: list[str],
                    detail: str) -> None:
        self.db.execute("INSERT INTO escalation_steps(escalation_id, step, round, level, at, how, targets, detail)"
                        " VALUES(?,?,?,?,?,?,?,?)", (esc_id, step, rnd, level, at, how, json.dumps(targets), detail))

    def steps(self, esc_id: int | None = None) -> list[dict[str, Any]]:
        q: str = "SELECT * FROM escalation_steps"
        args: tuple[Any, ...] = ()
        if esc_id is not None:
            q, args = q + " WHERE escalation_id=?", (esc_id,)
        out = []
        for r in self.db.execute(q + " ORDER BY id", args):
            d = dict(r)
            d["targets"] = json.loads(d["targets"] or "[]")
            out.append(d)
        return out

    def use_link(self, nonce: str, now: float, user: str) -> bool:
        """Record an ack link as used; False when it was used before."""
        cur = self.db.execute("INSERT INTO ack_links_used(nonce, used_at, \"user\") VALUES(?,?,?)"
                              " ON CONFLICT DO NOTHING", (nonce, now, user))
        return bool(cur.rowcount == 1)

    def end_run(self, run_id: str, at: float, step: int | None) -> None:
        """The job said it ended normally (a final heartbeat)."""
        self.db.execute("INSERT INTO run_ends(run_id, at, step) VALUES(?,?,?) ON CONFLICT(run_id) DO UPDATE SET"
                        " at=excluded.at, step=excluded.step", (run_id, at, step))

    def ended(self) -> dict[str, float]:
        """run id -> when it said it ended."""
        return {r["run_id"]: r["at"] for r in self.db.execute("SELECT run_id, at FROM run_ends")}

    def ended_of(self, run_ids: list[str]) -> dict[str, float]:
        """run id -> when it said it ended, for these runs only (those that said so); one query per 500."""
        out: dict[str, float] = {}
        for i in range(0, len(run_ids), 500):
            chunk = run_ids[i:i + 500]
            out.update((r["run_id"], r["at"]) for r in self.db.execute(
                f"SELECT run_id, at FROM run_ends WHERE run_id IN ({','.join('?' * len(chunk))})", chunk))
        return out

    def digest_since(self, channel: str) -> float | None:
        r = self.db.execute("SELECT last_at FROM digest_marks WHERE channel=?", (channel,)).fetchone()
        return None if r is None else float(r["last_at"])

    def mark_digest(self, channel: str, at: float) -> None:
        self.db.execute("INSERT INTO digest_marks(channel, last_at) VALUES(?,?) ON CONFLICT(channel) DO UPDATE SET"
                        " last_at=excluded.last_at", (channel, at))

    def hold_for_digest(self, channel: str, at: float, run_id: str, rule: str, severity: str, text: str) -> None:
        self.db.execute("INSERT INTO digest_items(channel, at, run_id, rule, severity, text) VALUES(?,?,?,?,?,?)",
                        (channel, at, run_id, rule, severity, text))

    def held(self, channel: str, since: float) -> list[dict[str, Any]]:
        return [dict(r) for r in self.db.execute("SELECT * FROM digest_items WHERE channel=? AND at>=? ORDER BY id",
                                                 (channel, since))]


class _Tx:
    """`with store.tx():` one transaction (BEGIN IMMEDIATE ... COMMIT, ROLLBACK on error). A COMMIT that fails (a
    full disk, an I/O error) is a rollback too: the transaction is ended, `on_rollback` runs, the error raises."""

    def __init__(self, db: sqlite3.Connection, on_rollback: Callable[[], None], on_commit: Callable[[], None]
                 ) -> None:
        self.db, self.on_rollback, self.on_commit = db, on_rollback, on_commit

    def __enter__(self) -> sqlite3.Connection:
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, exc_type: Any, *rest: Any) -> None:
        if exc_type:
            self._rollback()
            return
        try:
            self.db.execute("COMMIT")
        except BaseException:
            self._rollback()
            raise
        self.on_commit()

    def _rollback(self) -> None:
        try:
            with contextlib.suppress(sqlite3.Error):  # SQLite may have rolled it back already (SQLITE_FULL, IOERR)
                if self.db.in_transaction:
                    self.db.execute("ROLLBACK")
        finally:
            self.on_rollback()


def merge_sets(old: dict[str, Any], newer: dict[str, Any]) -> dict[str, Any]:
    """Two held updates of one run's row as one: the newer's columns win, except the devices (both lists, in
    order) and the last step (the higher, with its progress time) and the times (the later)."""
    out = {**old, **newer}
    if "devices" in old and "devices" in newer:
        out["devices"] = [*old["devices"], *(d for d in newer["devices"] if d not in old["devices"])]
    if "last_step" in old and (newer.get("last_step") is None or old["last_step"] > newer["last_step"]):
        out["last_step"], out["last_progress"] = old["last_step"], old["last_progress"]
    for t in ("last_seen", "last_heartbeat"):
        if t in old and t in newer:
            out[t] = max(old[t], newer[t])
    return out


class AttemptLog:
    """The attempts of each run (bot/ingest/runs.py decides when one ends or starts; both stores share this SQL).
    A run without a row is in its first attempt, still going."""

    def __init__(self, db: Any) -> None:
        self.db = db

    def of(self, run_id: str) -> list[dict[str, Any]]:
        """The run's attempts with a row, oldest first."""
        return [dict(r) for r in self.db.execute("SELECT * FROM run_attempts WHERE run_id=? ORDER BY attempt",
                                                 (run_id,))]

    def latest(self, run_id: str) -> dict[str, Any] | None:
        r = self.db.execute("SELECT * FROM run_attempts WHERE run_id=? ORDER BY attempt DESC LIMIT 1",
                            (run_id,)).fetchone()
        return None if r is None else dict(r)

    def latest_all(self) -> dict[str, dict[str, Any]]:
        """run id -> its latest attempt's row (for the runs that have one)."""
        return {r["run_id"]: dict(r) for r in self.db.execute(
            "SELECT a.* FROM run_attempts a JOIN (SELECT run_id, MAX(attempt) AS n FROM run_attempts GROUP BY run_id)"
            " m ON a.run_id=m.run_id AND a.attempt=m.n")}

    def end(self, run_id: str, attempt: int, started_at: float, at: float, step: int | None, reason: str) -> None:
        """Attempt `attempt` ended at `at` (its row made when it had none)."""
        self.db.execute("INSERT INTO run_attempts(run_id, attempt, started_at, ended_at, end_reason, last_step)"
                        " VALUES(?,?,?,?,?,?) ON CONFLICT(run_id, attempt) DO UPDATE SET ended_at=excluded.ended_at,"
                        " end_reason=excluded.end_reason, last_step=excluded.last_step",
                        (run_id, attempt, started_at, at, reason, step))

    def start(self, run_id: str, attempt: int, at: float) -> None:
        self.db.execute("INSERT INTO run_attempts(run_id, attempt, started_at) VALUES(?,?,?)"
                        " ON CONFLICT(run_id, attempt) DO NOTHING", (run_id, attempt, at))
