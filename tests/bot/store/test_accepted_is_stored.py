"""A 202 means stored, on every store, whatever path's write fails (issue 36).

The real bot on loopback, with its delivery worker posting to a local Slack and its escalator passing every
50 ms, takes envelopes (samples, events, heartbeats) and standalone heartbeats from 40 runs on 6 threads in a
seeded random order (tests/fakes/accepted.py); every answer that is not a 202 is sent again, as the job does.
Faults fire at random points meanwhile:

- PostgreSQL behind a fault-injecting TCP proxy (tests/fakes/tcp_proxy.py): every connection reset, new ones
  refused for up to 0.5 s, a blackhole (no answer, no reset) once;
- SQLite with another connection holding the file's write lock (short holds, and three of 11 s past the bot's 5 s busy
  timeout);
- SQLite on a full disk (a 16 MB tmpfs filled to its last byte and emptied again; needs root to mount).

Afterwards the store itself is read: every step, device and alert answered 202 is there. Before the fix, the
group commit's held updates taken by another path's failed write (an event envelope's transaction, the delivery
worker's, an escalation pass, a heartbeat) were gone, and the commit answered their waiters 202 anyway.

`MSMON_FAULT_ROUNDS=N` runs N rounds (seeds 1..N) instead of one, printing accepted/lost per round (-s).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import sqlite3
import subprocess
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes import postgres
from tests.fakes.accepted import Books, drive, lost
from tests.fakes.smtp import ESCALATION_ENV, escalating_bot_config
from tests.fakes.tcp_proxy import FaultyProxy

pytest.importorskip("aiosmtpd")

RUNS, REQUESTS = 40, 480
ROUNDS = int(os.environ.get("MSMON_FAULT_ROUNDS", "1"))


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in ESCALATION_ENV.items():
        monkeypatch.setenv(name, value)


def config(tmp_path: Path, slack: Any, smtp: Any, **store: Any) -> dict[str, Any]:
    cfg = escalating_bot_config(tmp_path, slack.base_url, smtp.port)
    cfg["bot"]["console"] = {"charts": False}
    cfg["bot"]["overload"] = {"enable": False}  # every envelope taken whole: the books are exact
    if store:
        cfg["bot"]["store"] = store
    return cfg


@contextlib.contextmanager
def firing(fault: Callable[[random.Random, threading.Event], None], seed: int) -> Iterator[None]:
    """`fault(rng, stop)` in a thread of its own until the block ends."""
    stop = threading.Event()
    t = threading.Thread(target=fault, args=(random.Random(seed), stop), name="faults", daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join(30)


def checked(books: Books, read: Callable[[], tuple[dict[str, tuple[int | None, list[str]]], set[str]]],
            what: str) -> None:
    rows, fps = read()
    missing = lost(books, rows, fps)
    print(f"{what}: {books.accepted} accepted (202), {books.retried} answers sent again, {len(missing)} lost")
    assert not books.odd, f"answers neither 202 nor 503: {books.odd[:5]}"
    assert books.retried > 0, "no fault reached the bot: the test tested nothing"
    assert not missing, f"{len(missing)} things answered 202 are not stored: {missing[:10]}"


# -- PostgreSQL behind a faulty network -------------------------------------------------------------------


def pg_faults(proxy: FaultyProxy) -> Callable[[random.Random, threading.Event], None]:
    def fire(rng: random.Random, stop: threading.Event) -> None:
        holes = 0
        while not stop.wait(rng.uniform(0.2, 0.6)):  # the time between faults (random points of the traffic)
            r = rng.random()
            if r < 0.65:
                proxy.reset()
            elif r < 0.92 or holes:
                proxy.refuse(rng.uniform(0.1, 0.5))
            else:
                holes += 1
                proxy.blackhole(rng.uniform(0.3, 1.0))
        proxy.restore()
    return fire


def pg_read(schema: str) -> tuple[dict[str, tuple[int | None, list[str]]], set[str]]:
    import psycopg

    with psycopg.connect(postgres.PG_URL, options=f"-c search_path={schema}") as conn:
        rows = {r[0]: (r[1], json.loads(r[2])) for r in conn.execute("SELECT run_id, last_step, devices FROM runs")}
        fps = {r[0] for r in conn.execute("SELECT fingerprint FROM alerts")}
    return rows, fps


@pytest.mark.parametrize("seed", range(1, ROUNDS + 1))
def test_every_202_is_in_postgresql_while_its_connections_are_reset_refused_and_blackholed(
        seed, tmp_path, schema, bot_server, slack, smtp):
    postgres.required()
    u = urllib.parse.urlsplit(postgres.PG_URL)
    with FaultyProxy(u.hostname or "127.0.0.1", u.port or 5432) as proxy:
        url = urllib.parse.urlunsplit(u._replace(netloc=f"{u.username or 'postgres'}@127.0.0.1:{proxy.port}"))
        bot = bot_server(config(tmp_path, slack, smtp, url=url, schema=schema), escalation_period=0.05)
        with firing(pg_faults(proxy), seed):
            books = drive(bot, seed, RUNS, REQUESTS)
        print(f"proxy: {proxy.faults}")
        checked(books, lambda: pg_read(schema), f"PostgreSQL round {seed}")


# -- SQLite: a locked file, a full disk ------------------------------------------------------------------


def sqlite_read(path: Path) -> tuple[dict[str, tuple[int | None, list[str]]], set[str]]:
    with contextlib.closing(sqlite3.connect(path)) as db:
        rows = {r[0]: (r[1], json.loads(r[2])) for r in db.execute("SELECT run_id, last_step, devices FROM runs")}
        fps = {r[0] for r in db.execute("SELECT fingerprint FROM alerts")}
    return rows, fps


def lock_holder(path: Path) -> Callable[[random.Random, threading.Event], None]:
    """Another process's connection taking the file's write lock at random points: mostly for a moment (the
    bot waits), three times (the first at once) for 11 s, past the bot's busy timeout (5 s: its writes fail then)."""
    def fire(rng: random.Random, stop: threading.Event) -> None:
        long_ones = {0, *rng.sample(range(2, 10), 2)}  # which holds outlast the bot's busy timeout (the first)
        with contextlib.closing(sqlite3.connect(path, timeout=30, isolation_level=None)) as other:
            n = 0
            while not stop.wait(rng.uniform(0.05, 0.3)):
                other.execute("BEGIN IMMEDIATE")
                stop.wait(11.0 if n in long_ones else rng.uniform(0.01, 0.3))
                other.execute("ROLLBACK")
                n += 1
    return fire


@pytest.mark.parametrize("seed", range(1, ROUNDS + 1))
def test_every_202_is_in_sqlite_while_another_connection_holds_its_write_lock(seed, tmp_path, bot_server, slack,
                                                                                smtp):
    bot = bot_server(config(tmp_path, slack, smtp), escalation_period=0.05)
    path = tmp_path / "bot.sqlite"
    with firing(lock_holder(path), seed):
        books = drive(bot, seed, RUNS, REQUESTS // 2)
    checked(books, lambda: sqlite_read(path), f"SQLite locked, round {seed}")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 16 MB tmpfs of its own (mounting needs root; skipped with the reason otherwise)."""
    where = tmp_path / "disk"
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(where)], capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({done.stderr.strip() or done.returncode}): needs root")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def disk_filler(where: Path) -> Callable[[random.Random, threading.Event], None]:
    """The disk filled to its last byte at random points, for a moment, then emptied again."""
    def fire(rng: random.Random, stop: threading.Event) -> None:
        filler = where / "filler"
        while not stop.is_set():
            fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
            with contextlib.suppress(OSError):  # until ENOSPC
                while True:
                    os.write(fd, b"\0" * 4096)
            os.close(fd)
            stop.wait(rng.uniform(0.1, 0.4))
            filler.unlink()
            stop.wait(rng.uniform(0.1, 0.4))  # the time until the disk fills again
    return fire


@pytest.mark.parametrize("seed", range(1, ROUNDS + 1))
def test_every_202_is_in_sqlite_when_its_disk_fills_up(seed, tmp_path, small_disk, bot_server, slack, smtp):
    cfg = config(tmp_path, slack, smtp)
    cfg["bot"]["state_path"] = str(small_disk / "bot.sqlite")
    bot = bot_server(cfg, escalation_period=0.05)
    with firing(disk_filler(small_disk), seed):
        books = drive(bot, seed, RUNS, REQUESTS)
    checked(books, lambda: sqlite_read(small_disk / "bot.sqlite"), f"SQLite full disk, round {seed}")


# -- the mechanism, on its own ----------------------------------------------------------------------------


def test_a_write_that_fails_on_another_path_puts_back_the_held_updates_it_took(tmp_path):
    """The group commit's held update taken by an event envelope's transaction whose write lock never comes:
    held again, and the group commit writes it once the lock is free."""
    import asyncio

    from bot.ingest.commit import Commits
    from bot.store.sqlite import Store

    path = tmp_path / "s.sqlite"
    store = Store(str(path))
    store.db.execute("PRAGMA busy_timeout=50")
    store.touch_run("r", "llm", {}, "0", 1, 1.0)  # a new run's row: written at once
    store.touch_run("r", "llm", {}, "1", 5, 2.0, defer=True)  # an envelope's update: held for the group commit
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as other:
        other.execute("BEGIN IMMEDIATE")
        with pytest.raises(sqlite3.OperationalError), store.tx():
            pass  # an event envelope's transaction: the held update is written first, and that fails
        assert store.holding, "the failed write dropped the held update"
        other.execute("ROLLBACK")

    async def commit() -> None:
        await Commits(store, lambda: 3.0, window=0).committed()

    asyncio.run(commit())
    row = store.run("r")
    assert row is not None and row["last_step"] == 5 and row["devices"] == ["0", "1"]
    store.close()


def test_held_updates_written_in_a_transaction_that_rolls_back_are_held_again(tmp_path):
    from bot.store.sqlite import Store

    store = Store(str(tmp_path / "s.sqlite"))
    store.touch_run("r", "llm", {}, "0", 1, 1.0)
    with pytest.raises(RuntimeError), store.tx():
        store.touch_run("r", "llm", {}, "1", 7, 2.0, defer=True)
        assert store.run("r")["last_step"] == 7  # a read flushes the held update inside this transaction
        raise RuntimeError("the envelope's events failed after it")
    assert store.holding, "the rolled-back transaction took the held update with it"
    store.touch_run("r", "llm", {}, "2", 6, 3.0, defer=True)  # newer, lower step: both kept where they count
    assert store.flush_runs() == 1
    row = store.run("r")
    assert row is not None and row["last_step"] == 7 and row["devices"] == ["0", "1", "2"]
    store.close()


def test_a_heartbeats_failed_write_leaves_nothing_behind_that_a_later_one_skips(tmp_path):
    """A write outside the group commit (a standalone heartbeat's) that fails must not leave the store believing
    the row has it: the heartbeat sent again writes its step and device (before: the retry wrote neither and got
    its 202, found by the lock-contention test above)."""
    from bot.store.sqlite import Store

    path = tmp_path / "s.sqlite"
    store = Store(str(path))
    store.db.execute("PRAGMA busy_timeout=50")
    store.touch_run("r", "llm", {}, "0", 1, 1.0)
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as other:
        other.execute("BEGIN IMMEDIATE")
        with pytest.raises(sqlite3.OperationalError):
            store.touch_run("r", "llm", {}, "3", 7, 2.0, heartbeat=True)  # answered 503: the job sends it again
        other.execute("ROLLBACK")
    store.touch_run("r", "llm", {}, "3", 7, 3.0, heartbeat=True)
    row = store.run("r")
    assert row is not None and row["last_step"] == 7 and row["devices"] == ["0", "3"]
    store.close()
