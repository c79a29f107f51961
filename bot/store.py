"""All durable state in one SQLite file (WAL): runs, alerts and what was sent for them, the outbox,
the messages that can be updated, silences. Synchronous and quick; called from the event loop."""

from __future__ import annotations

import json
import sqlite3
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import msgspec

from msmon.contract.wire import Severity

from .delivery import OutboxRow, Verdict
from .pipeline.flow import NotifyState
from .pipeline.silence import Silence

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY, project TEXT, labels TEXT, devices TEXT, first_seen REAL, last_seen REAL,
    last_step INTEGER, last_heartbeat REAL, last_progress REAL, paused INTEGER DEFAULT 0, gone INTEGER DEFAULT 0);
CREATE TABLE IF NOT EXISTS alerts (
    fingerprint TEXT PRIMARY KEY, run_id TEXT, rule TEXT, device TEXT, severity TEXT, status TEXT,
    first_step INTEGER, last_step INTEGER, updated_at REAL, event TEXT,
    sent_severity TEXT, sent_at REAL, sent_resolved INTEGER DEFAULT 0, acked_by TEXT);
CREATE INDEX IF NOT EXISTS alerts_run ON alerts(run_id, status, severity);
CREATE TABLE IF NOT EXISTS outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT, created_at REAL, receiver TEXT, channel TEXT, kind TEXT,
    key TEXT, run_id TEXT, payload TEXT, attempts INTEGER DEFAULT 0, next_at REAL, delivered_at REAL,
    error TEXT, dead_at REAL, posted_ref TEXT);
CREATE INDEX IF NOT EXISTS outbox_due ON outbox(delivered_at, next_at);
CREATE TABLE IF NOT EXISTS messages (
    key TEXT PRIMARY KEY, receiver TEXT, channel TEXT, ts TEXT, created_at REAL);
CREATE TABLE IF NOT EXISTS commands (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE, created_at REAL, user TEXT, source TEXT, project TEXT,
    run_id TEXT, text TEXT, verb TEXT, action TEXT, params TEXT, apply_step INTEGER, status TEXT, detail TEXT,
    results TEXT DEFAULT '{}', origin TEXT DEFAULT '{}', expires_at REAL, updated_at REAL);
CREATE INDEX IF NOT EXISTS commands_open ON commands(status, run_id);
CREATE TABLE IF NOT EXISTS level_changes (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT, device TEXT, step INTEGER, at REAL, rule TEXT, action TEXT,
    who TEXT, why TEXT, detail TEXT, command_id TEXT);
CREATE INDEX IF NOT EXISTS level_changes_run ON level_changes(run_id, seq);
CREATE TABLE IF NOT EXISTS slack_signed (signature TEXT PRIMARY KEY, ts INTEGER);
CREATE INDEX IF NOT EXISTS slack_signed_ts ON slack_signed(ts);
CREATE TABLE IF NOT EXISTS silences (
    id INTEGER PRIMARY KEY AUTOINCREMENT, expires_at REAL, run_id TEXT, rule TEXT, device TEXT,
    severity TEXT, created_by TEXT, comment TEXT);
"""


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


class Store:
    def __init__(self, path: str) -> None:
        self.path = path
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.row_factory = sqlite3.Row
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable across a process kill
        self.db.executescript(SCHEMA)
        self._outbox_columns()
        self.commands = CommandLog(self.db)
        self.escalations = EscalationLog(self.db)
        # Read-through copies of what ingest reads on every envelope. This Store is their only writer;
        # a rolled-back transaction drops them (they are read again).
        self._run_cache: OrderedDict[str, tuple[list[str], int | None]] = OrderedDict()
        self._silence_cache: list[Silence] | None = None

    def close(self) -> None:
        self.db.close()

    def tx(self) -> _Tx:
        return _Tx(self.db, self._forget)

    def _forget(self) -> None:
        self._run_cache.clear()
        self._silence_cache = None

    # -- runs -----------------------------------------------------------------------------------

    def touch_run(self, run_id: str, project: str, labels: dict[str, str], device: str, step: int | None,
                  now: float, heartbeat: bool = False, paused: bool | None = None) -> None:
        cached = self._run_cache.get(run_id)
        if cached is None:
            row = self.db.execute("SELECT devices, last_step FROM runs WHERE run_id=?", (run_id,)).fetchone()
            cached = None if row is None else (json.loads(row["devices"]), row["last_step"])
        if cached is None:
            self.db.execute(
                "INSERT INTO runs(run_id, project, labels, devices, first_seen, last_seen, last_step, last_heartbeat,"
                " last_progress, paused) VALUES(?,?,?,?,?,?,?,?,?,?)",
                (run_id, project, json.dumps(labels), json.dumps([device]), now, now, step,
                 now if heartbeat else None, now, int(bool(paused))))
            self._remember_run(run_id, [device], step)
            return
        devices, last_step = cached
        if device not in devices:
            devices = [*devices, device]
        progressed = step is not None and (last_step is None or step > last_step)
        self.db.execute(
            "UPDATE runs SET labels=?, devices=?, last_seen=?, gone=0,"  # the project stays its creator's
            " last_step=CASE WHEN ? THEN ? ELSE last_step END,"
            " last_progress=CASE WHEN ? THEN ? ELSE last_progress END,"
            " last_heartbeat=CASE WHEN ? THEN ? ELSE last_heartbeat END,"
            " paused=COALESCE(?, paused) WHERE run_id=?",
            (json.dumps(labels), json.dumps(devices), now, progressed, step, progressed, now,
             heartbeat, now, None if paused is None else int(paused), run_id))
        self._remember_run(run_id, devices, step if progressed else last_step)

    def _remember_run(self, run_id: str, devices: list[str], last_step: int | None) -> None:
        self._run_cache[run_id] = (devices, last_step)
        self._run_cache.move_to_end(run_id)
        while len(self._run_cache) > 10_000:
            self._run_cache.popitem(last=False)

    def runs(self) -> list[dict[str, Any]]:
        return [self._run(r) for r in self.db.execute("SELECT * FROM runs ORDER BY last_seen DESC")]

    def run(self, run_id: str) -> dict[str, Any] | None:
        r = self.db.execute("SELECT * FROM runs WHERE run_id=?", (run_id,)).fetchone()
        return None if r is None else self._run(r)

    @staticmethod
    def _run(r: sqlite3.Row) -> dict[str, Any]:
        d = dict(r)
        d["labels"] = json.loads(d["labels"] or "{}")
        d["devices"] = json.loads(d["devices"] or "[]")
        d["paused"], d["gone"] = bool(d["paused"]), bool(d["gone"])
        return d

    def set_paused(self, run_id: str, paused: bool, now: float) -> None:
        """A job reported it paused or resumed (its progress restarts now)."""
        self.db.execute("UPDATE runs SET paused=?, last_progress=CASE WHEN ? THEN last_progress ELSE ? END"
                        " WHERE run_id=?", (int(paused), int(paused), now, run_id))

    def mark_gone(self, run_id: str, gone: bool) -> None:
        self.db.execute("UPDATE runs SET gone=? WHERE run_id=?", (int(gone), run_id))

    # -- alerts and what was sent for them (the notification log) -------------------------------

    def alert_states(self, fps: list[str]) -> dict[str, tuple[NotifyState, str | None, str | None, bool]]:
        """For each fingerprint with a row: what was sent for it, its severity, status and whether someone
        acknowledged it (one query per 500)."""
        out: dict[str, tuple[NotifyState, str | None, str | None, bool]] = {}
        uniq = list(dict.fromkeys(fps))
        for i in range(0, len(uniq), 500):
            chunk = uniq[i:i + 500]
            rows = self.db.execute("SELECT fingerprint, severity, status, sent_severity, sent_at, sent_resolved,"
                                   f" acked_by FROM alerts WHERE fingerprint IN ({','.join('?' * len(chunk))})", chunk)
            for r in rows:
                sent = r["sent_severity"]
                notify = NotifyState() if sent is None else NotifyState(Severity(sent), r["sent_at"],
                                                                        bool(r["sent_resolved"]))
                out[r["fingerprint"]] = (notify, r["severity"], r["status"], r["acked_by"] is not None)
        return out

    def touch_alerts(self, rows: list[tuple[int, float, str]]) -> None:
        """(last step, updated at, fingerprint): a suppressed repeat moved the alert's last step."""
        self.db.executemany("UPDATE alerts SET last_step=?, updated_at=? WHERE fingerprint=?", rows)

    def save_alerts(self, rows: list[AlertRow]) -> None:
        """Upsert alerts. A new episode (the row was resolved) starts at this step and is not acknowledged."""
        self.db.executemany(
            "INSERT INTO alerts(fingerprint, run_id, rule, device, severity, status, first_step, last_step,"
            " updated_at, event, sent_severity, sent_at, sent_resolved)"
            " VALUES(?1,?2,?3,?4,?5,?6,?7,?7,?8,?9,CASE WHEN ?10 THEN ?11 END,CASE WHEN ?10 THEN ?12 END,"
            " CASE WHEN ?10 THEN ?13 ELSE 0 END)"
            " ON CONFLICT(fingerprint) DO UPDATE SET severity=excluded.severity, status=excluded.status,"
            " last_step=excluded.last_step, updated_at=excluded.updated_at,"
            " event=COALESCE(excluded.event, alerts.event),"
            " first_step=CASE WHEN alerts.status='resolved' THEN excluded.first_step ELSE alerts.first_step END,"
            " acked_by=CASE WHEN alerts.status='resolved' THEN NULL ELSE alerts.acked_by END,"
            " sent_severity=CASE WHEN ?10 THEN ?11 ELSE alerts.sent_severity END,"
            " sent_at=CASE WHEN ?10 THEN ?12 ELSE alerts.sent_at END,"
            " sent_resolved=CASE WHEN ?10 THEN ?13 ELSE alerts.sent_resolved END", map(_alert_params, rows))

    def enqueue_many(self, entries: list[OutboxEntry]) -> None:
        self.db.executemany("INSERT INTO outbox(created_at, receiver, channel, kind, key, run_id, payload, next_at)"
                            " VALUES(?,?,?,?,?,?,?,?)", map(msgspec.structs.astuple, entries))

    def ack(self, run_id: str, rule: str, device: str | None, user: str) -> list[str]:
        """Acknowledge the firing alerts of a run's rule (one device, or all); their fingerprints."""
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

    def alerts(self, run_id: str | None = None, status: str | None = None) -> list[dict[str, Any]]:
        q, args = "SELECT * FROM alerts WHERE 1=1", []
        if run_id is not None:
            q += " AND run_id=?"
            args.append(run_id)
        if status is not None:
            q += " AND status=?"
            args.append(status)
        out = []
        for r in self.db.execute(q + " ORDER BY updated_at DESC", args):
            d = dict(r)
            d.pop("event", None)
            out.append(d)
        return out

    # -- outbox ---------------------------------------------------------------------------------

    def _outbox_columns(self) -> None:
        """A state file from before dead letters: add their columns (SQLite keeps the rows)."""
        have = {r[1] for r in self.db.execute("PRAGMA table_info(outbox)")}
        for column, decl in (("dead_at", "REAL"), ("posted_ref", "TEXT")):
            if column not in have:
                self.db.execute(f"ALTER TABLE outbox ADD COLUMN {column} {decl}")

    _PENDING = "delivered_at IS NULL AND dead_at IS NULL"

    def _rows(self, sql: str, args: tuple[Any, ...]) -> list[OutboxRow]:
        return [OutboxRow(**dict(r)) for r in self.db.execute(sql, args)]

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
        return self._rows(f"SELECT * FROM outbox WHERE {self._PENDING} AND next_at<=? AND receiver{op}? ORDER BY id"
                          " LIMIT ?", (now, receiver, limit))

    def next_due_lane(self, receiver: str, only: bool) -> float | None:
        op = "=" if only else "<>"
        r = self.db.execute(f"SELECT MIN(next_at) AS t FROM outbox WHERE {self._PENDING} AND receiver{op}?",
                            (receiver,)).fetchone()
        return None if r is None else r["t"]

    def due(self, now: float, limit: int = 200) -> list[OutboxRow]:
        return self._rows(f"SELECT * FROM outbox WHERE {self._PENDING} AND next_at<=? ORDER BY id LIMIT ?",
                          (now, limit))

    def next_due_at(self) -> float | None:
        r = self.db.execute(f"SELECT MIN(next_at) AS t FROM outbox WHERE {self._PENDING}").fetchone()
        return None if r is None else r["t"]

    def settle(self, ids: list[int], verdict: Verdict, now: float) -> None:
        """Write a delivery verdict (bot.delivery) to the rows of its group."""
        delivered = now if verdict.state == "delivered" else None
        dead = now if verdict.state == "dead" else None
        self.db.executemany(
            "UPDATE outbox SET attempts=?, next_at=?, error=?, posted_ref=?, delivered_at=COALESCE(?, delivered_at),"
            " dead_at=COALESCE(?, dead_at) WHERE id=?",
            [(verdict.attempts, verdict.next_at, verdict.error, verdict.posted_ref, delivered, dead, i) for i in ids])

    def mark_posted(self, ids: list[int], ref: str) -> None:
        """The group's message is out as `ref`: a retry only runs its follow-up steps."""
        self.db.executemany("UPDATE outbox SET posted_ref=? WHERE id=?", [(ref, i) for i in ids])

    def due_now(self, now: float) -> int:
        """After a restart: what waited for a retry is due at once (the outage may be long over)."""
        cur = self.db.execute(f"UPDATE outbox SET next_at=? WHERE {self._PENDING} AND next_at>? AND attempts>0",
                              (now, now))
        return cur.rowcount

    def depth(self) -> int:
        return int(self.db.execute(f"SELECT COUNT(*) FROM outbox WHERE {self._PENDING}").fetchone()[0])

    def dead_count(self) -> int:
        return int(self.db.execute("SELECT COUNT(*) FROM outbox WHERE dead_at IS NOT NULL").fetchone()[0])

    def dead_letters(self, limit: int = 100) -> list[OutboxRow]:
        """Rows given up on, newest first."""
        return self._rows("SELECT * FROM outbox WHERE dead_at IS NOT NULL ORDER BY dead_at DESC, id DESC LIMIT ?",
                          (limit,))

    # -- messages that can be updated or answered in their thread -------------------------------

    def save_message(self, key: str, receiver: str, channel: str, ts: str, now: float) -> None:
        self.db.execute("INSERT OR REPLACE INTO messages(key, receiver, channel, ts, created_at) VALUES(?,?,?,?,?)",
                        (key, receiver, channel, ts, now))

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
            " VALUES(?,?,?,?,?,?,?)", (s.expires_at, s.run_id, s.rule, s.device, s.severity, s.created_by, s.comment))
        return int(cur.lastrowid or 0)

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
    """save_alerts' 13 parameters for one row (?10: whether a notification was queued)."""
    sent = r.sent
    if sent is None:
        return (r.fingerprint, r.run_id, r.rule, r.device, r.severity, r.status, r.step, r.at, r.event, False,
                None, None, 0)
    return (r.fingerprint, r.run_id, r.rule, r.device, r.severity, r.status, r.step, r.at, r.event, True,
            None if sent.severity is None else sent.severity.value, sent.sent_at, int(sent.resolved))


# -- commands: every one received, allowed or not (the audit log), and the open ones' delivery state ---

_COMMAND_JSON = ("params", "results", "origin")


def _command(r: sqlite3.Row) -> dict[str, Any]:
    d = dict(r)
    for k in _COMMAND_JSON:
        d[k] = json.loads(d[k] or "{}")
    return d


class CommandLog:
    """The commands table of a Store."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def add(self, *, created_at: float, user: str, source: str, project: str | None, run_id: str | None, text: str,
            verb: str, action: str | None, params: dict[str, Any], apply_step: int | None, status: str, detail: str,
            origin: dict[str, Any], expires_at: float | None) -> dict[str, Any]:
        cur = self.db.execute(
            "INSERT INTO commands(created_at, user, source, project, run_id, text, verb, action, params, apply_step,"
            " status, detail, origin, expires_at, updated_at) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (created_at, user, source, project, run_id, text, verb, action, json.dumps(params), apply_step, status,
             detail, json.dumps(origin), expires_at, created_at))
        seq = cur.lastrowid
        self.db.execute("UPDATE commands SET id=? WHERE seq=?", (f"c{seq}", seq))
        got = self.get(f"c{seq}")
        assert got is not None
        return got

    def get(self, cid: str) -> dict[str, Any] | None:
        r = self.db.execute("SELECT * FROM commands WHERE id=?", (cid,)).fetchone()
        return None if r is None else _command(r)

    def open_for(self, run_id: str, after: int = 0) -> list[dict[str, Any]]:
        """Commands still to be applied by a run's ranks, in order, issued after cursor `after`."""
        return [_command(r) for r in self.db.execute(
            "SELECT * FROM commands WHERE run_id=? AND status='pending' AND seq>? ORDER BY seq", (run_id, after))]

    def open_all(self) -> list[dict[str, Any]]:
        return [_command(r) for r in self.db.execute("SELECT * FROM commands WHERE status='pending' ORDER BY seq")]

    def update(self, cid: str, now: float, **fields: Any) -> None:
        cols = ", ".join(f"{k}=?" for k in fields)
        vals = [json.dumps(v) if k in _COMMAND_JSON else v for k, v in fields.items()]
        self.db.execute(f"UPDATE commands SET {cols}, updated_at=? WHERE id=?", (*vals, now, cid))  # noqa: S608

    def first_signed(self, signature: str, ts: int, horizon: float) -> bool:
        """Record a signed Slack request; False when its signature was already recorded (a replay).
        Signatures with a timestamp before `horizon` are stale for the verifier anyway: forgotten here."""
        self.db.execute("DELETE FROM slack_signed WHERE ts<?", (horizon,))
        cur = self.db.execute("INSERT OR IGNORE INTO slack_signed(signature, ts) VALUES(?,?)", (signature, ts))
        return cur.rowcount == 1

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

    def recent(self, limit: int = 100, run_id: str | None = None) -> list[dict[str, Any]]:
        q, args = "SELECT * FROM commands", []
        if run_id is not None:
            q += " WHERE run_id=?"
            args.append(run_id)
        return [_command(r) for r in self.db.execute(q + " ORDER BY seq DESC LIMIT ?", (*args, limit))]


# -- escalations, their steps, used ack links, runs that ended, digests (bot/escalation, bot/digest.py) ----

ESCALATION_SCHEMA = """
CREATE TABLE IF NOT EXISTS escalations (
    id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT, rule TEXT, policy TEXT, receiver TEXT, channel TEXT,
    started_at REAL, next_step INTEGER DEFAULT 0, state TEXT DEFAULT 'active', paused_at REAL, shift REAL DEFAULT 0,
    acked_by TEXT, closed_at REAL, mail_root TEXT, owner TEXT, lease_until REAL);
CREATE INDEX IF NOT EXISTS escalations_open ON escalations(state, run_id, rule);
CREATE TABLE IF NOT EXISTS escalation_steps (
    id INTEGER PRIMARY KEY AUTOINCREMENT, escalation_id INTEGER, step INTEGER, round INTEGER, level INTEGER,
    at REAL, how TEXT, targets TEXT, detail TEXT);
CREATE TABLE IF NOT EXISTS ack_links_used (nonce TEXT PRIMARY KEY, used_at REAL, user TEXT);
CREATE TABLE IF NOT EXISTS run_ends (run_id TEXT PRIMARY KEY, at REAL, step INTEGER);
CREATE TABLE IF NOT EXISTS digest_marks (channel TEXT PRIMARY KEY, last_at REAL);
CREATE TABLE IF NOT EXISTS digest_items (
    id INTEGER PRIMARY KEY AUTOINCREMENT, channel TEXT, at REAL, run_id TEXT, rule TEXT, severity TEXT, text TEXT);
"""


class EscalationLog:
    """The escalation tables of a Store. Ownership: a bot instance acts on an escalation only while it
    holds its lease (`owner`, `lease_until`), taken and renewed in the transaction that acts on it;
    one replica escalates, another takes over when the lease runs out."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db
        db.executescript(ESCALATION_SCHEMA)

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
                              " VALUES(?,?,?,?,?,?)", (run_id, rule, policy, receiver, channel, now))
        return int(cur.lastrowid or 0)

    def claim(self, esc_id: int, owner: str, now: float, lease: float) -> bool:
        """Take or renew the lease of an escalation; False when another owner holds it."""
        cur = self.db.execute("UPDATE escalations SET owner=?, lease_until=? WHERE id=? AND (owner IS NULL OR"
                              " owner=? OR lease_until<?)", (owner, now + lease, esc_id, owner, now))
        return cur.rowcount == 1

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
        cur = self.db.execute("INSERT OR IGNORE INTO ack_links_used(nonce, used_at, user) VALUES(?,?,?)",
                              (nonce, now, user))
        return cur.rowcount == 1

    def end_run(self, run_id: str, at: float, step: int | None) -> None:
        """The job said it ended normally (a final heartbeat)."""
        self.db.execute("INSERT OR REPLACE INTO run_ends(run_id, at, step) VALUES(?,?,?)", (run_id, at, step))

    def ended(self) -> dict[str, float]:
        """run id -> when it said it ended."""
        return {r["run_id"]: r["at"] for r in self.db.execute("SELECT run_id, at FROM run_ends")}

    def digest_since(self, channel: str) -> float | None:
        r = self.db.execute("SELECT last_at FROM digest_marks WHERE channel=?", (channel,)).fetchone()
        return None if r is None else float(r["last_at"])

    def mark_digest(self, channel: str, at: float) -> None:
        self.db.execute("INSERT OR REPLACE INTO digest_marks(channel, last_at) VALUES(?,?)", (channel, at))

    def hold_for_digest(self, channel: str, at: float, run_id: str, rule: str, severity: str, text: str) -> None:
        self.db.execute("INSERT INTO digest_items(channel, at, run_id, rule, severity, text) VALUES(?,?,?,?,?,?)",
                        (channel, at, run_id, rule, severity, text))

    def held(self, channel: str, since: float) -> list[dict[str, Any]]:
        return [dict(r) for r in self.db.execute("SELECT * FROM digest_items WHERE channel=? AND at>=? ORDER BY id",
                                                 (channel, since))]


class _Tx:
    """`with store.tx():` one transaction (BEGIN IMMEDIATE ... COMMIT, ROLLBACK on error)."""

    def __init__(self, db: sqlite3.Connection, on_rollback: Callable[[], None]) -> None:
        self.db, self.on_rollback = db, on_rollback

    def __enter__(self) -> sqlite3.Connection:
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, exc_type: Any, *rest: Any) -> None:
        if exc_type:
            self.db.execute("ROLLBACK")
            self.on_rollback()
        else:
            self.db.execute("COMMIT")
