"""How many ranks reporting every second one bot replica (and two) keeps up with, over HTTP and over NATS.

    .venv/bin/python bench/bench_replicas.py [--transport http,nats] [--replicas 1] [--levels 250,500,...]
                                             [--seconds 8] [--nats nats://127.0.0.1:4222] [--store-json '{...}']

Each simulated rank sends one envelope a second (one metric sample: loss, grad norm, LR; a real job's
flush interval), spread evenly over the second; 64 ranks make a run. A level of N ranks runs for
`--seconds` after a 2 s warm-up; the level is kept up with when the ingest latency p99 is under 1 s
and at least 97 % of the offered envelopes were ingested in time. The figures stop at the first level
not kept up with (or at the last level).

Ingest latency is measured inside each replica, for both transports alike: from the envelope's
`sent_at` (the rank's clock when it built it, the same host's clock) to the end of `Ingest.envelope`
(its transaction committed), or for an envelope without events to the group commit of its run's update
(bot/ingest/commit.py). Over HTTP that is the 202 the job waits for; over NATS the moment the
replica can ack the message. CPU (cores busy, from /proc/<pid>/stat) and resident memory are each
replica's own, over the measured seconds.

Replicas are `msmon serve`-like processes (the real `create_app`, one aiohttp server each, with a
route that reports the latencies); the ranks are simulated by one asyncio process (aiohttp to the
replicas' HTTP, round robin: the load balancer; one nats-py connection publishing to JetStream with a
message id, as `notifier.nats_transport` does). Two replicas need a store they can share: pass the
PostgreSQL store's bot.yaml keys with --store-json (bot/store, issue 18); with SQLite only one replica
is measured. On a shared machine the rank simulator competes with the replicas for the CPU: the
figures are a floor.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TOKEN = "bench-token"
RANKS_PER_RUN = 64
_HZ = os.sysconf("SC_CLK_TCK")


# -- a replica (a process of its own) ------------------------------------------------------------------

def replica(config: dict[str, Any], port: int) -> None:
    """The real bot app, with every Ingest.envelope timed, and GET /bench/latency to read and reset the
    latencies recorded since the last read."""
    import logging

    from aiohttp import web

    from bot.app import STORE, create_app
    from bot.config import load_bot_config
    from bot.ingest.envelope import Ingest

    logging.basicConfig(level=logging.WARNING)
    latencies: list[tuple[float, float]] = []  # (sent_at, latency)
    held: list[float] = []  # sent_at of the envelopes whose run updates wait for the group commit
    original = Ingest.envelope

    def timed(self: Any, env: Any, defer: bool = False) -> dict[str, Any]:
        answer = original(self, env, defer)
        if defer and self.state.store.holding:  # done once the group commit is (bot/ingest/commit.py)
            held.append(env.sent_at)
        else:
            latencies.append((env.sent_at, time.time() - env.sent_at))
        return answer

    Ingest.envelope = timed  # type: ignore[method-assign]
    app = create_app(load_bot_config(config))
    store = app[STORE]
    flush = store.flush_runs

    def flushed(now: float | None = None) -> int:
        n = flush(now)
        t = time.time()
        latencies.extend((sent, t - sent) for sent in held)
        held.clear()
        return n

    store.flush_runs = flushed  # type: ignore[method-assign]

    async def read(request: web.Request) -> web.Response:
        out = list(latencies)
        latencies.clear()
        return web.json_response(out)

    app.router.add_get("/bench/latency", read)
    web.run_app(app, host="127.0.0.1", port=port, print=None, handle_signals=True)


# -- the orchestrator ----------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _HZ  # utime + stime


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _config(tmp: str, i: int, nats: dict[str, Any] | None, store: dict[str, Any]) -> dict[str, Any]:
    os.environ["MSMON_BENCH_TOKEN"] = TOKEN
    bot = {"port": 0, "state_path": os.path.join(tmp, "bot.sqlite"), "max_runs": 10_000,
           "window_samples": 60, "tokens": [{"project": "bench", "env": "MSMON_BENCH_TOKEN"}],
           "routes": [{"receiver": "console", "channel": "bench"}],
           "console": {"charts_dir": os.path.join(tmp, f"charts{i}"), "charts": False},
           "pipeline": {"heartbeat_timeout": 3600, "stall_timeout": 3600}}
    if nats:
        bot["nats"] = nats
    bot.update(store)
    return {"bot": bot}


class Replicas:
    def __init__(self, n: int, nats: dict[str, Any] | None, store: dict[str, Any]) -> None:
        self.tmp = tempfile.mkdtemp(prefix="msmon-bench-replicas-")
        self.ports = [_free_port() for _ in range(n)]
        self.procs = []
        for i, port in enumerate(self.ports):  # one after the other: the first migrates a fresh schema
            cfg = json.dumps(_config(self.tmp, i, nats, store))
            self.procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), "--replica", cfg,
                                                str(port)], env={**os.environ, "PYTHONUNBUFFERED": "1"}))
            _wait_port(port)

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{p}" for p in self.ports]

    def stop(self) -> None:
        for p in self.procs:
            p.send_signal(signal.SIGINT)
        for p in self.procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(self.tmp, ignore_errors=True)


def _wait_port(port: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"a replica did not listen on port {port} within {timeout:g} s")


async def _latencies(session: Any, urls: list[str], since: float = 0.0) -> list[float]:
    """The latencies the replicas recorded since the last read, of the envelopes sent at or after `since`."""
    out: list[float] = []
    for url in urls:
        async with session.get(url + "/bench/latency") as resp:
            out.extend(lat for sent, lat in await resp.json() if sent >= since)
    return out


async def _level(ranks: int, seconds: float, transport: str, urls: list[str], nats: dict[str, Any] | None,
                 procs: list[subprocess.Popen[bytes]], tag: str, step_of: list[int]) -> dict[str, Any]:
    """N ranks, one envelope each a second, for `seconds` after a 2 s warm-up; the figures."""
    import aiohttp

    from msmon.contract.subjects import MSG_ID_HEADER, TOKEN_HEADER, subject
    from msmon.contract.wire import Envelope, Sample, encode

    ids = [(f"bench-{tag}-{r // RANKS_PER_RUN}", str(r % RANKS_PER_RUN)) for r in range(ranks)]
    sent = [0]
    failed = [0]
    behind = [0.0]
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256),
                                    headers={"Authorization": f"Bearer {TOKEN}"})
    nc = js = None
    if transport == "nats":
        import nats as nats_py

        nc = await nats_py.connect(nats["url"] if nats else "", pending_size=64 << 20)
        js = nc.jetstream()
    gate = asyncio.Semaphore(2048)

    async def send(r: int, step: int) -> None:
        run, device = ids[r]
        env = Envelope(run_id=run, device=device, sent_at=time.time(), project="bench",
                       samples=[Sample(run_id=run, device=device, step=step, time=time.time(), loss=2.0,
                                       grad_norm=1.0, learning_rate=1e-4)])
        body = encode(env)
        try:
            if js is not None:
                await js.publish(subject(nats["prefix"] if nats else "msmon", "bench", run, "env"), body,
                                 timeout=10, headers={TOKEN_HEADER: TOKEN, MSG_ID_HEADER: f"{run}/{device}/{step}"})
            else:
                url = urls[r % len(urls)]
                async with session.post(url + "/v1/ingest", data=body,
                                        headers={"Content-Type": "application/json"}) as resp:
                    await resp.read()
                    if resp.status != 202:
                        failed[0] += 1
            sent[0] += 1
        except Exception:  # noqa: BLE001 - counted: a send that failed is not kept up with
            failed[0] += 1
        finally:
            gate.release()

    tasks: set[asyncio.Task[None]] = set()
    start = time.monotonic()
    total = seconds + 2.0
    step_of.extend([0] * (ranks - len(step_of)))  # the fleet's ranks keep their steps from level to level
    tick = 0.01
    measured_from = start + 2.0
    measured_wall = time.time() + 2.0
    cpu0: list[float] = []
    sender0 = 0.0
    lat: list[float] = []
    offered = 0
    next_r = 0.0
    while True:
        now = time.monotonic()
        if now - start >= total:
            break
        if not cpu0 and now >= measured_from:
            await _latencies(session, urls)  # the warm-up's, dropped
            cpu0 = [_cpu_seconds(p.pid) for p in procs]
            sender0 = _cpu_seconds(os.getpid())
            offered = 0
        due = ranks * (now - start)  # ranks sent since the start, spread evenly over each second
        while next_r < due:
            r = int(next_r) % ranks
            step_of[r] += 1
            next_r += 1
            offered += 1
            if gate.locked():
                behind[0] += 1
            await gate.acquire()
            t = asyncio.create_task(send(r, step_of[r]))
            tasks.add(t)
            t.add_done_callback(tasks.discard)
        await asyncio.sleep(tick)
    wall = time.monotonic() - measured_from
    cpu = [(_cpu_seconds(p.pid) - c) / wall for p, c in zip(procs, cpu0, strict=True)]
    sender = (_cpu_seconds(os.getpid()) - sender0) / wall
    if tasks:
        await asyncio.wait(tasks, timeout=5)
    await asyncio.sleep(1.5)  # what was sent in the last second is ingested
    lat = await _latencies(session, urls, since=measured_wall)
    await session.close()
    if nc is not None:
        await nc.close()
    lat.sort()
    in_time = sum(1 for x in lat if x < 1.0)
    p99 = lat[int(0.99 * (len(lat) - 1))] if lat else float("inf")
    ingested = max(len(lat), 1)
    return {"ranks": ranks, "offered": offered, "ingested": len(lat), "in_time_share": in_time / max(offered, 1),
            "cpu_ms_per_envelope": round(1000 * sum(cpu) * wall / ingested, 3), "load_avg_1m": os.getloadavg()[0],
            "p50_s": statistics.median(lat) if lat else float("inf"), "p99_s": p99, "failed": failed[0],
            "cpu_cores": [round(c, 2) for c in cpu], "rss_mb": [round(_rss_mb(p.pid)) for p in procs],
            "sender_waited": int(behind[0]), "sender_cpu_cores": round(sender, 2),
            # a level is kept up with only when this simulator offered it: on a small machine the sender falls
            # behind first (sender_waited), and what it did not send says nothing of the replicas
            "offered_per_s": round(offered / wall), "sender_kept_pace": offered >= 0.97 * ranks * wall,
            "kept_up": p99 < 1.0 and in_time >= 0.97 * offered and offered >= 0.97 * ranks * wall}


def run(transport: str, replicas: int, levels: list[int], seconds: float, nats_url: str,
        store: dict[str, Any], stop_early: bool = True) -> list[dict[str, Any]]:
    nats = None
    tag = uuid.uuid4().hex[:8]
    if transport == "nats":
        nats = {"url": nats_url, "prefix": f"bench{tag}", "stream": f"BENCH{tag}", "durable": f"bench{tag}",
                "memory": True}
    group = Replicas(replicas, nats, store)
    results = []
    steps: list[int] = []  # each rank's last step (one fleet: a level's ranks are its first N, the others idle)
    try:
        time.sleep(3.0 if nats else 0.5)  # the replicas set up the stream and the consumer
        for n in levels:
            res = asyncio.run(_level(n, seconds, transport, group.urls, nats, group.procs, tag, steps))
            res.update(transport=transport, replicas=replicas)
            print(json.dumps(res), flush=True)
            results.append(res)
            if not res["kept_up"] and stop_early:
                break
    finally:
        group.stop()
        if nats:
            from tests.fakes.nats_server import delete_streams

            delete_streams(nats_url, nats["stream"])
    return results


def _drop_schema(url: str, schema: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replica", nargs=2, metavar=("CONFIG_JSON", "PORT"), help=argparse.SUPPRESS)
    ap.add_argument("--transport", default="http,nats", help="http, nats or both (comma-separated)")
    ap.add_argument("--replicas", default="1", help="replica counts to measure, e.g. 1,2 (2 needs --store-json)")
    ap.add_argument("--levels", default="250,500,1000,2000,3000,4000,6000,8000,12000,16000")
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--nats", default="nats://127.0.0.1:4222")
    ap.add_argument("--store-json", default="{}", help="bot.yaml keys of a shared store, e.g. the PostgreSQL one")
    ap.add_argument("--postgres", metavar="URL", help="replicas on this PostgreSQL (a fresh schema, dropped after), "
                    "e.g. postgresql://postgres@127.0.0.1:5432/test")
    ap.add_argument("--all-levels", action="store_true", help="go on past the first level not kept up with")
    args = ap.parse_args()
    if args.replica:
        replica(json.loads(args.replica[0]), int(args.replica[1]))
        return
    store = json.loads(args.store_json)
    levels = [int(x) for x in args.levels.split(",")]
    summary = []
    for transport in args.transport.split(","):
        for n in (int(x) for x in args.replicas.split(",")):
            if n > 1 and not store and not args.postgres:
                print(f"# {n} replicas need a shared store (--postgres URL, or --store-json); "
                      "skipped", flush=True)
                continue
            schema = None
            if args.postgres:
                schema = f"msmon_bench_{uuid.uuid4().hex[:12]}"
                store = {"store": {"url": args.postgres, "schema": schema}}
            try:
                results = run(transport, n, levels, args.seconds, args.nats, store, not args.all_levels)
            finally:
                if schema:
                    _drop_schema(args.postgres, schema)
            kept = [r for r in results if r["kept_up"]]
            best = kept[-1] if kept else None
            cost = statistics.median(r["cpu_ms_per_envelope"] for r in results)
            summary.append((transport, n, best, cost))
            for r in results:
                if not r["sender_kept_pace"]:
                    print(f"{transport}, {n} replicas, {r['ranks']:,} ranks: this simulator offered only "
                          f"{r['offered_per_s']:,} envelopes/s (it fell behind on this machine, not the replicas); "
                          f"they took {r['ingested']:,} at p99 {r['p99_s']:.2f} s on {sum(r['cpu_cores']):.2f} "
                          f"cores", flush=True)
    print("\n| transport | replicas | most ranks kept up with (1 envelope/s each) | p99 latency | CPU per replica "
          "(cores) | memory per replica (MB) | replica CPU per envelope | ranks one busy core would take |\n"
          "|---|---|---|---|---|---|---|---|")
    for transport, n, best, cost in summary:
        per_core = f"{1000 / cost:,.0f}" if cost > 0 else "?"
        if best is None:
            print(f"| {transport} | {n} | below the first level | | | | {cost:.2f} ms | {per_core} |")
        else:
            print(f"| {transport} | {n} | {best['ranks']:,} | {best['p99_s'] * 1000:.0f} ms | "
                  f"{', '.join(str(c) for c in best['cpu_cores'])} | {', '.join(str(m) for m in best['rss_mb'])} | "
                  f"{cost:.2f} ms | {per_core} |")


if __name__ == "__main__":
    main()
