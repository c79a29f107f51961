"""Envelopes per second one replica ingests with each store, measured in one run.

    .venv/bin/python bench/bench_store.py [--seconds 5] [--pg postgresql://postgres@127.0.0.1:5432/test]

The bot's whole ingest path (bot/ingest/envelope.py: the run's row, the metric windows, the stages of bot/pipeline,
the alert and outbox rows, one transaction per envelope) called as the HTTP handler calls it, on the
SQLite store (a file in tmp, WAL) and on the PostgreSQL store (psycopg 3's synchronous connection, a
fresh schema, dropped afterwards). Two mixes of 200 runs x 8 ranks: samples only (what nearly every
post is), and one event per envelope (repeats of a WARNING per rank, suppressed after the first, and
one new ERROR per run: the storm case). For each: envelopes/s, and p50/p99 of one envelope's time, which
is how long the event loop is held (the store's calls are synchronous), and the ratio of the two stores;
and PostgreSQL once more with synchronous_commit=off, which shows how much of its time is the commit's
WAL fsync (SQLite's WAL with synchronous=NORMAL does not fsync per commit).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bot.config import load_bot_config  # noqa: E402
from bot.ingest.envelope import Ingest  # noqa: E402
from bot.metrics import BotMetrics  # noqa: E402
from bot.shared import BotState  # noqa: E402
from bot.store import open_store  # noqa: E402
from msmon.contract.wire import Envelope, Event, Sample, Severity, Status, encode  # noqa: E402

RUNS, RANKS, SAMPLES = 200, 8, 10


def envelopes(with_events: bool, n: int) -> list[tuple[Envelope, bytes]]:
    out = []
    for i in range(n):
        run, rank, step = f"run-{i % RUNS}", (i // RUNS) % RANKS, 100 + i // (RUNS * RANKS) * SAMPLES
        now = time.time()
        samples = [Sample(run_id=run, device=str(rank), step=step + k, time=now, loss=2.0, learning_rate=1e-4,
                          grad_norm=1.0, tokens_per_s=1000.0) for k in range(SAMPLES)]
        events = []
        if with_events:
            first = i < RUNS  # one ERROR per run, then WARNING repeats (suppressed by dedup)
            events = [Event(run_id=run, device=str(rank), step=step, time=now, rule="grad_norm" if first else "loss",
                            severity=Severity.ERROR if first else Severity.WARNING, status=Status.FIRING, value=12.0,
                            threshold=10.0, message="bench")]
        env = Envelope(run_id=run, device=str(rank), sent_at=now, project="llm", samples=samples, events=events)
        out.append((env, encode(env)))
    return out


def measure(store_cfg: dict[str, Any], with_events: bool, seconds: float, tmp: str) -> tuple[float, float, float]:
    cfg = load_bot_config({"bot": {"state_path": os.path.join(tmp, f"{uuid.uuid4().hex}.sqlite"),
                                   "routes": [{"receiver": "console"}], "store": store_cfg}})
    store = open_store(cfg)
    ingest = Ingest(BotState(cfg, store, BotMetrics()))
    batch = envelopes(with_events, 20_000)
    took: list[float] = []
    start = time.perf_counter()
    i = 0
    while time.perf_counter() - start < seconds:
        env, _ = batch[i % len(batch)]
        t0 = time.perf_counter()
        ingest.envelope(env)
        took.append(time.perf_counter() - t0)
        i += 1
    elapsed = time.perf_counter() - start
    store.close()
    took.sort()
    return i / elapsed, statistics.median(took) * 1e3, took[int(len(took) * 0.99)] * 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--pg", default=os.environ.get("MSMON_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test"))
    args = ap.parse_args()
    schema = f"msmon_bench_{uuid.uuid4().hex[:8]}"
    lax = args.pg + ("&" if "?" in args.pg else "?") + "options=-c%20synchronous_commit%3Doff"
    stores = {"sqlite": {}, "postgresql": {"url": args.pg, "schema": schema},
              "pg-nosync": {"url": lax, "schema": schema}}  # not a setting to run with: the commit's fsync share
    results: dict[tuple[str, bool], tuple[float, float, float]] = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for with_events in (False, True):
                for name, store_cfg in stores.items():
                    results[(name, with_events)] = measure(store_cfg, with_events, args.seconds, tmp)
    finally:
        import psycopg

        with psycopg.connect(args.pg, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    print(f"one replica, {RUNS} runs x {RANKS} ranks, {SAMPLES} samples per envelope, {args.seconds:g} s each")
    print(f"{'mix':<26}{'store':<12}{'envelopes/s':>12}{'p50 ms':>9}{'p99 ms':>9}")
    for with_events in (False, True):
        mix = "one event per envelope" if with_events else "samples only"
        for name in stores:
            rate, p50, p99 = results[(name, with_events)]
            print(f"{mix:<26}{name:<12}{rate:>12,.0f}{p50:>9.2f}{p99:>9.2f}")
        ratio = results[("postgresql", with_events)][0] / results[("sqlite", with_events)][0]
        print(f"{'':<26}{'pg/sqlite':<12}{ratio:>12.2f}")
    print("pg-nosync: the same PostgreSQL store with synchronous_commit=off (commits not waiting for their WAL "
          "fsync; a server crash could lose accepted envelopes: measured, not recommended)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
