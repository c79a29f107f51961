"""The PostgreSQL store: the SQLite store's operations on a database several `msmon serve` replicas share.

psycopg 3's synchronous connection, used like SQLite's: the bot's store calls stay plain calls from the
event loop (a statement on a nearby database takes a fraction of a millisecond; bench/bench_store.py
measures it), and one code path serves both stores. The SQL is the SQLite store's (bot/store/sqlite.py), its
`?` placeholders turned into psycopg's; what differs with several writers is here:

- alerts: `lock_run` takes a transaction-scoped advisory lock on the envelope's run before its alert
  rows are read, so two replicas never both decide to post the same alert (the alert index reads the
  rows under that lock, not from memory: `shared`);
- runs: one upsert merges a run's devices and last step (no read-modify-write, no cache);
- the outbox: a replica claims a whole group's rows with `FOR UPDATE SKIP LOCKED` and a lease
  (`claimed_by`, `claim_until`); rows claimed by a live replica are not due for the others, and a dead
  replica's claims are taken over when its lease runs out; a row already posted keeps its `posted_ref`,
  so the replica taking it over only does the follow-up. Claims and leases are timed by the database's
  clock, one clock for every replica;
- commands: queuing one NOTIFYs the other replicas (`listen`), whose long polls wake;
- `lease(name)`: one owner at a time for the escalator, the digests and command expiry.

Migrations: bot/store/migrations/postgresql/, applied on open under an advisory lock (replicas starting
together migrate once).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
from psycopg import sql as pgsql

from bot.pipeline.schedule import GroupKey, OutboxRow
from bot.store import migrations
from bot.store.pgdb import CONNECT_TIMEOUT_S, DEADLINE_S, PgDb, lock_key
from bot.store.sqlite import OUTBOX_COLUMNS, AttemptLog, CommandLog, EscalationLog, Store
from bot.store.url import redact

log = logging.getLogger("msmon.bot")

DB_NOW = "extract(epoch from clock_timestamp())"
PRUNED = "pruned:"  # a notification's prefix: the run's row was deleted (the rest of the payload is its id)
OWNER_TTL = 60.0  # seconds project_of trusts what it read while it hears the prunes


@dataclasses.dataclass(slots=True)
class _Touch:
    """A run's update as touch_run makes it, or several merged (held for the group commit): the devices new to this
    process, the highest step, the last time, a heartbeat among them, the last pause state."""

    project: str
    labels: dict[str, str]
    device: str  # the last one's
    devices: list[str]  # new to this process: merged into the row's list
    step: int | None
    now: float
    heartbeat: bool
    paused: bool | None

    def merge(self, labels: dict[str, str], device: str, new: bool, step: int | None, now: float, heartbeat: bool,
              paused: bool | None) -> None:
        self.labels, self.now, self.heartbeat = labels, max(self.now, now), self.heartbeat or heartbeat
        if new and device not in self.devices:
            self.devices.append(device)
        self.device = device
        if step is not None and (self.step is None or step > self.step):
            self.step = step
        if paused is not None:
            self.paused = paused

    def absorb(self, newer: _Touch) -> None:
        """`newer`, an update of the same run made after this one, merged into it (a failed write's update held
        again under what was held since)."""
        self.merge(newer.labels, newer.device, False, newer.step, newer.now, newer.heartbeat, newer.paused)
        self.devices += [d for d in newer.devices if d not in self.devices]


class PostgresStore(Store):
    dialect: migrations.Dialect = "postgresql"
    shared = True
    Error: type[Exception] = psycopg.Error

    def __init__(self, url: str, schema: str | None = None, lease: float = 60.0) -> None:  # noqa: D107
        # No super().__init__: that opens a SQLite file. What it sets is set here, for this database.
        self.url, self.lease_s = url, lease
        self.path = redact(url) + (f" (schema {schema})" if schema else "")
        self.owner = f"bot-{uuid.uuid4().hex[:12]}"
        if schema is not None:
            self._create_schema(url, schema)
        self.db = self.pg = PgDb(url, schema)
        self.lax: PgDb | None = None  # liveness writes outside a transaction (touch_run, the group commit)
        current = self.pg.raw("SELECT current_schema() AS s").fetchone()
        if current is None or current["s"] is None:
            raise psycopg.OperationalError(f"no schema to create the tables in on {self.path}: its search_path names "
                                           "none that exists; set bot.store.schema")
        self.schema = str(current["s"])
        self.channel = "msmon_" + hashlib.blake2b(self.schema.encode(), digest_size=6).hexdigest()
        # Outbox rows this replica may take: undelivered, and not claimed by another replica whose lease runs.
        self._AVAILABLE = (f"{Store._PENDING} AND (claimed_by IS NULL OR claimed_by='{self.owner}'"
                           f" OR claim_until<{DB_NOW})")
        self._migrate()
        self.pg.deadline = DEADLINE_S  # from now on a statement nothing answers fails (503) within seconds
        self.commands = CommandLog(self.db, self._notify)
        self.escalations = EscalationLog(self.db)
        self.attempts = AttemptLog(self.db)
        self._run_cache = OrderedDict()  # not used: touch_run reads nothing
        self._members: OrderedDict[str, set[str]] = OrderedDict()  # run -> devices its row is known to hold
        self._held: dict[str, _Touch] = {}  # type: ignore[assignment]  # run -> its update held for flush_runs
        self._projects = OrderedDict()  # not used: project_of keeps `_owners`
        # run -> (its project, until when it is trusted): kept only while `listen` runs, which hears every replica's
        # prune (the one way a run's project can change: its row goes, another project's job creates it again)
        self._owners: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self._listening = False
        self._silence_cache = None

    @staticmethod
    def _create_schema(url: str, schema: str) -> None:
        """The schema, made once when replicas start together: under an advisory lock (CREATE SCHEMA IF NOT
        EXISTS alone races: the second of two concurrent creators fails on pg_namespace's unique index)."""
        with psycopg.connect(url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S) as conn:
            key = lock_key(f"msmon.schema.{schema}")
            conn.execute("SELECT pg_advisory_lock(%s)", (key,))
            try:
                conn.execute(pgsql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(pgsql.Identifier(schema)))
            except (psycopg.errors.UniqueViolation, psycopg.errors.DuplicateSchema):
                pass  # another creator without the lock (an older replica): it is there
            finally:
                conn.execute("SELECT pg_advisory_unlock(%s)", (key,))

    def close(self) -> None:
        with contextlib.suppress(psycopg.Error):
            self.flush_runs()  # the runs' last held updates
        self.db.close()
        if self.lax is not None:
            self.lax.close()

    def _lax(self) -> PgDb:
        if self.lax is None:
            self.lax = PgDb(self.url, self.pg.schema)  # its commits wait for their WAL fsync: a 202 is durable
            self.lax.deadline = DEADLINE_S
        return self.lax

    @property
    def where(self) -> str:
        return self.path

    def _migrate(self) -> None:
        db = self.pg
        key = lock_key(f"msmon.migrate.{self.schema}")
        db.raw("SELECT pg_advisory_lock(%s)", (key,))
        db.raw("SET statement_timeout = 0")  # a migration may take longer than a statement of the running bot
        try:
            db.raw(migrations.VERSION_TABLE.format(real="DOUBLE PRECISION"))
            row = db.raw("SELECT MAX(version) AS v FROM schema_version").fetchone()
            for m in migrations.pending("postgresql", int(row["v"] or 0) if row else 0):
                with db.transaction():
                    db.raw(m.sql)
                    db.raw("INSERT INTO schema_version(version, name, applied_at) VALUES(%s, %s, %s)",
                           (m.version, m.name, time.time()))
                log.info("msmon bot: schema migration %04d_%s applied to %s", m.version, m.name, self.path)
        finally:
            db.raw("RESET statement_timeout")
            db.raw("SELECT pg_advisory_unlock(%s)", (key,))

    def schema_version(self) -> int:
        row = self.pg.raw("SELECT MAX(version) AS v FROM schema_version").fetchone()
        return int(row["v"] or 0) if row else 0

    def tx(self) -> contextlib.AbstractContextManager[Any]:
        if not self.pg.in_tx:
            self.flush_runs()  # the runs' held updates first, in their own commit
        return self._tx()

    @contextlib.contextmanager
    def _tx(self) -> Iterator[PgDb]:
        try:
            with self.pg.transaction() as db:
                yield db
        except BaseException:
            self._forget()
            raise

    # -- several writers -------------------------------------------------------------------------

    def lock_run(self, run_id: str) -> None:
        self.pg.raw("SELECT pg_advisory_xact_lock(%s)", (lock_key(f"run:{run_id}"),))

    def lease(self, name: str, owner: str, now: float, ttl: float) -> bool:
        """As Store.lease, timed by the database's clock (`now` is not used)."""
        cur = self.pg.raw(
            f"INSERT INTO leases(name, owner, until) VALUES(%s, %s, {DB_NOW} + %s) ON CONFLICT(name) DO UPDATE SET"
            f" owner=excluded.owner, until=excluded.until WHERE leases.owner=excluded.owner OR leases.until<{DB_NOW}",
            (name, owner, ttl))
        return cur.rowcount == 1

    def touch_run(self, run_id: str, project: str, labels: dict[str, str], device: str, step: int | None,
                  now: float, heartbeat: bool = False, paused: bool | None = None, defer: bool = False) -> None:
        """One upsert: the last step moved only forward, whoever wrote before; the devices merged only when one is
        new to this process (`_members`), so an envelope of a known rank costs the same at 10 or 10,000 ranks (the
        merge parses the run's whole list). Outside a transaction (an envelope of samples, a heartbeat: liveness)
        on the `lax` connection, its own (never inside another request's transaction); its commits wait for their
        WAL fsync like every other, so what a 202 answered survives a server crash.
        `defer`: held and merged with the run's other held updates until `flush_runs` (the group commit)."""
        known = self._members.get(run_id)
        new = known is None or device not in known
        if defer and not self.pg.in_tx:
            held = self._held.get(run_id)
            if held is None:
                self._held[run_id] = _Touch(project, labels, device, [device] if new else [], step, now, heartbeat,
                                            paused)
            else:
                held.merge(labels, device, new, step, now, heartbeat, paused)
            return
        if not self.pg.in_tx:
            self.flush_runs()  # what is held was heard before this: written first
        self._upsert(self.pg if self.pg.in_tx else self._lax(), run_id,
                     _Touch(project, labels, device, [device] if new else [], step, now, heartbeat, paused))

    def _upsert(self, db: PgDb, run_id: str, t: _Touch) -> None:
        row = db.raw(
            "INSERT INTO runs(run_id, project, labels, devices, first_seen, last_seen, last_step, last_heartbeat,"
            " last_progress, paused) VALUES(%(run)s, %(project)s, %(labels)s, %(devices)s, %(now)s, %(now)s, %(step)s,"
            " CASE WHEN %(hb)s THEN %(now)s END, %(now)s, %(paused0)s)"
            " ON CONFLICT(run_id) DO UPDATE SET labels=excluded.labels, last_seen=excluded.last_seen, gone=0,"
            " devices=CASE WHEN NOT %(merge)s THEN runs.devices ELSE (runs.devices::jsonb || (SELECT"
            " COALESCE(jsonb_agg(d), '[]'::jsonb) FROM jsonb_array_elements(excluded.devices::jsonb) AS d"
            " WHERE NOT runs.devices::jsonb @> jsonb_build_array(d)))::text END,"
            " last_step=CASE WHEN excluded.last_step > runs.last_step OR runs.last_step IS NULL"
            " THEN COALESCE(excluded.last_step, runs.last_step) ELSE runs.last_step END,"
            " last_progress=CASE WHEN excluded.last_step > runs.last_step OR"
            " (runs.last_step IS NULL AND excluded.last_step IS NOT NULL) THEN excluded.last_seen"
            " ELSE runs.last_progress END,"
            " last_heartbeat=CASE WHEN %(hb)s THEN excluded.last_seen ELSE runs.last_heartbeat END,"
            " paused=COALESCE(%(paused)s, runs.paused) RETURNING (xmax = 0) AS inserted",
            {"run": run_id, "project": t.project, "labels": json.dumps(t.labels),
             "devices": json.dumps(t.devices or [t.device]), "merge": bool(t.devices), "now": t.now, "step": t.step,
             "hb": t.heartbeat, "paused0": int(bool(t.paused)), "paused": None if t.paused is None else int(t.paused)}
        ).fetchone()
        inserted = row is not None and bool(row["inserted"])
        members = self._members.get(run_id)
        if members is None or inserted:  # new to this process, or a new row (another replica pruned the run)
            members = self._members[run_id] = set()
            while len(self._members) > 10_000:
                self._members.popitem(last=False)
        members.update(t.devices or [t.device])

    def flush_runs(self, now: float | None = None) -> int:
        """The runs' held updates (touch_run's `defer`), one upsert per run, in one transaction on the `lax`
        connection; how many runs. `now`: a run's last_seen is at least that (see Store.flush_runs)."""
        if not self._held:
            return 0
        held, self._held = self._held, {}
        try:
            lax = self._lax()
            with lax.transaction():
                for run_id, t in held.items():
                    if now is not None and now > t.now:
                        t.now = now
                    self._upsert(lax, run_id, t)
        except BaseException:
            self._members.clear()  # what the rolled-back upserts merged is not there: merged again when next heard
            for run_id, t in held.items():  # held again, under what was held since: the next flush writes them
                newer = self._held.get(run_id)
                if newer is not None:
                    t.absorb(newer)
                self._held[run_id] = t
            raise
        return len(held)

    def _forget(self) -> None:
        super()._forget()
        self._members.clear()  # a rolled-back transaction's merges are not in the rows

    def change_mark(self) -> int:
        """A mark for `changed_alerts`: the oldest transaction still running (txid_snapshot_xmin). Every alert
        change not visible now is a transaction's at or after it, whichever replica's, however late it commits;
        alerts.changed holds the id of the transaction that changed the row (migration 0004)."""
        r = self.pg.raw("SELECT txid_snapshot_xmin(txid_current_snapshot()) AS x").fetchone()
        assert r is not None
        return int(r["x"])

    def project_of(self, run_id: str) -> str | None:
        """As Store.project_of. Every job request asks it: while this replica listens (`listen`), what it read is
        kept for OWNER_TTL seconds, dropped at once when any replica prunes the run; else read each time."""
        if self._listening:
            hit = self._owners.get(run_id)
            if hit is not None and hit[1] > time.monotonic():
                return hit[0]
        r = self.pg.raw("SELECT project FROM runs WHERE run_id=%s", (run_id,)).fetchone()
        if r is None:
            return None
        project = str(r["project"])
        if self._listening:
            self._owners[run_id] = (project, time.monotonic() + OWNER_TTL)
            self._owners.move_to_end(run_id)
            while len(self._owners) > 10_000:
                self._owners.popitem(last=False)
        return project

    def _pruned(self, run_id: str) -> None:
        """In prune_runs' transaction: every replica's listener drops the run's project when it commits."""
        self._owners.pop(run_id, None)
        self.pg.raw("SELECT pg_notify(%s, %s)", (self.channel, PRUNED + run_id))

    def silences(self, now: float | None = None) -> list[Any]:
        self._silence_cache = None  # another replica may have added one: read each time
        return super().silences(now)

    # -- the outbox: claims --------------------------------------------------------------------------

    def claim(self, group: GroupKey, now: float) -> list[OutboxRow]:
        """Every pending row of the group, claimed for this replica for `lease` seconds; none when another
        replica holds one of them (its lease runs) or is claiming them right now (a row is locked)."""
        where = f"{Store._PENDING} AND receiver=%s AND channel=%s AND key=%s AND kind=%s"
        with self.tx():
            rows = list(self.pg.raw(f"SELECT {OUTBOX_COLUMNS}, claimed_by, claim_until, {DB_NOW} AS db_now"
                                    f" FROM outbox WHERE {where} ORDER BY id FOR UPDATE SKIP LOCKED", group))
            total = self.pg.raw(f"SELECT COUNT(*) AS n FROM outbox WHERE {where}", group).fetchone()
            if not rows or total is None or len(rows) < total["n"]:
                return []
            if any(r["claimed_by"] not in (None, self.owner) and r["claim_until"] >= r["db_now"] for r in rows):
                return []
            ids = [r["id"] for r in rows]
            self.pg.raw(f"UPDATE outbox SET claimed_by=%s, claim_until={DB_NOW} + %s WHERE id = ANY(%s)",
                        (self.owner, self.lease_s, ids))
        names = OUTBOX_COLUMNS.replace(" ", "").split(",")
        return [OutboxRow(**{k: r[k] for k in names}) for r in rows]

    # -- commands cross replicas ---------------------------------------------------------------------

    def _notify(self, run_id: str) -> None:
        """A command for `run_id` is queued: every replica's listener hears it when this transaction commits."""
        self.pg.raw("SELECT pg_notify(%s, %s)", (self.channel, run_id))

    async def listen(self, on_command: Callable[[str | None], None], stop: Any) -> None:
        """LISTEN on this schema's channel until `stop` is set: `on_command(run_id)` per notification, and
        `on_command(None)` after each (re)connection (what was queued while it was away: look again). A run
        another replica pruned (PRUNED + its id) leaves `project_of`'s memory; while not listening it keeps none."""
        try:
            delay = 1.0
            while not stop.is_set():
                try:
                    async with await psycopg.AsyncConnection.connect(self.pg.conninfo, autocommit=True,
                                                                     connect_timeout=10) as conn:
                        await conn.execute(pgsql.SQL("LISTEN {}").format(pgsql.Identifier(self.channel)))
                        self._owners.clear()
                        self._listening = True  # a replica's prune reaches us now: project_of may keep what it read
                        on_command(None)
                        delay = 1.0
                        while not stop.is_set():
                            async for n in conn.notifies(timeout=0.5):
                                if n.payload.startswith(PRUNED):
                                    self._owners.pop(n.payload[len(PRUNED):], None)
                                else:
                                    on_command(n.payload)
                except (psycopg.Error, OSError) as exc:
                    self._listening = False
                    self._owners.clear()
                    log.warning("msmon bot: LISTEN for commands on %s failed (%s); long polls here wake only at their "
                                "timeout until it is back; retrying in %.0f s", self.path, exc, delay)
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(stop.wait(), delay)
                    delay = min(delay * 2, 30.0)
        finally:
            self._listening = False
            self._owners.clear()
