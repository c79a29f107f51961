"""The PostgreSQL store under real faults, the real bot on loopback and the machine's real PostgreSQL:

- blackholed (tests/fakes/peers.py TcpProxy: the connections stay open and nothing answers, as when the
  database host dies without a reset): ingest, heartbeat and /healthz answer 503 with Retry-After within
  5 s (the client's own deadline, connect timeout, keepalives), and 202 again once it is back;
- two replicas opening one fresh schema at once both start (CREATE SCHEMA under an advisory lock).
"""

from __future__ import annotations

import threading
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest

from bot.store.postgres import PostgresStore
from msmon.contract.wire import Heartbeat, encode
from tests.fakes import postgres
from tests.fakes.bot_server import wait_for
from tests.fakes.peers import TcpProxy
from tests.fakes.records import envelope, event


@pytest.fixture
def proxy() -> Iterator[TcpProxy]:
    u = urllib.parse.urlsplit(postgres.PG_URL)
    p = TcpProxy(u.hostname or "127.0.0.1", u.port or 5432)
    try:
        yield p
    finally:
        p.close()


def via(proxy: TcpProxy) -> str:
    u = urllib.parse.urlsplit(postgres.PG_URL)
    return urllib.parse.urlunsplit(u._replace(netloc=f"{u.username or 'postgres'}@127.0.0.1:{proxy.port}"))


def timed(fn: Any) -> tuple[float, Any]:
    t0 = time.monotonic()
    out = fn()
    return time.monotonic() - t0, out


@pytest.mark.timing  # a wall-clock bound: run alone, after the rest (make unit)
def test_a_blackholed_database_is_a_503_with_retry_after_within_5_s(tmp_path, schema, proxy, monkeypatch, bot_server):
    monkeypatch.setenv("MSMON_TEST_TOKEN", "job-token")
    bot = bot_server({"bot": {"port": 0, "state_path": str(tmp_path / "bot.sqlite"),
                              "store": {"url": via(proxy), "schema": schema},
                              "tokens": [{"project": "llm", "env": "MSMON_TEST_TOKEN"}],
                              "console": {"charts": False}}})
    hb = encode(Heartbeat(run_id="run-42", device="0", step=100, time=time.time()))
    try:
        assert bot.request("POST", "/v1/ingest", envelope([event()]))[0] == 202
        proxy.blackhole()
        for what, call in [
            ("ingest", lambda: bot.request("POST", "/v1/ingest", envelope([event(step=101)]))),
            ("heartbeat", lambda: bot.request("POST", "/v1/heartbeat", hb)),
            ("healthz", lambda: bot.request("GET", "/healthz", token=None)),
            ("ingest again", lambda: bot.request("POST", "/v1/ingest", envelope([event(step=102)]))),
        ]:
            took, (status, answer) = timed(call)
            assert status == 503, (what, status, answer)
            assert took < 5.0, f"{what} answered after {took:.1f} s with the database blackholed"
        proxy.restore()
        assert wait_for(lambda: bot.request("POST", "/v1/ingest", envelope([event(step=103)]))[0] == 202,
                        timeout=20), "the bot did not take envelopes again once the database was back"
    finally:
        proxy.restore()


def test_replicas_opening_one_fresh_schema_at_once_all_start(schema):
    errors: list[BaseException] = []
    stores: list[PostgresStore] = []
    gate = threading.Barrier(6)

    def open_one() -> None:
        try:
            gate.wait()
            stores.append(PostgresStore(postgres.PG_URL, schema))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for s in stores:
        s.close()
    assert not errors, errors
    assert len(stores) == 6
