"""Many ranks of one run reporting to one real bot process, measured in one run on loopback.

    .venv/bin/python bench/bench_ranks.py [--ranks 1000] [--seconds 180]     (or MSMON_BENCH_SECONDS=60)

A bot (`bot.server.serve`, bot.yaml written to a temp dir: console receiver, ranks.period 1 s) runs as
a process of its own; `--ranks` simulated ranks of one run each post an envelope (a
sample and a heartbeat, as the notifier's sender does) once a second, spread over `--clients` processes
(32 requests in flight each). Printed:

1. what the bot took: envelopes/s accepted against the offered rate (it keeps up, or the number it
   kept up with), how long the ranks' rounds took, the bot process's CPU (% of one core and per envelope,
   from /proc: what one core would take) and resident memory at the end, the clients' CPU, the load;
2. decision latency of the cross-rank rules: half-way through, one rank's step time goes from 0.1 s to
   0.5 s; the time from the sample that makes it a straggler (its pace, the median of its last
   `ranks.history` samples, crossing the bound) to the bot's rank_straggler event (its log line), and
   from its first slow sample;
3. the pure cost of one check of the rules over that many ranks (bot/ranks `check`, in this process), and
   what the view adds to one envelope's ingest (RankViews.envelope).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import multiprocessing
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bot.config import RanksConfig  # noqa: E402
from bot.ranks import check  # noqa: E402
from bot.ranks.view import RankViews  # noqa: E402
from msmon.contract.wire import Envelope, Heartbeat, Sample, encode  # noqa: E402

TOKEN = "bench-token"
RUN = "bench-ranks"
SLOW_RANK = 17
HISTORY, CHECKS = 4, 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _envelope(rank: int, step: int, step_time: float) -> bytes:
    now = time.time()
    return encode(Envelope(run_id=RUN, device=str(rank), sent_at=now, rank=rank, host=f"node-{rank // 8}",
                           samples=[Sample(run_id=RUN, device=str(rank), step=step, time=now,
                                           loss=2.0 + 0.001 * (rank % 7), grad_norm=1.0, local_grad_norm=1.0,
                                           step_time=step_time, samples_per_s=32 / step_time)],
                           heartbeats=[Heartbeat(run_id=RUN, device=str(rank), time=now, step=step)]))


def _client(url: str, ranks: range, seconds: float, slow_at: float, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    """Ranks `ranks`, each posting once a round; a round starts every second, or when the last one ended if it
    took longer (no catch-up burst)."""
    import resource

    import aiohttp

    async def run() -> None:
        sent = ok = 0
        slow_sends: list[float] = []
        rounds: list[float] = []
        headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
        sem = asyncio.Semaphore(32)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=32)) as http:
            async def one(rank: int, step: int, st: float) -> None:
                nonlocal ok
                async with sem:
                    try:
                        async with http.post(url, data=_envelope(rank, step, st), headers=headers) as r:
                            await r.read()
                            ok += r.status == 202
                    except aiohttp.ClientError:
                        pass
                    if st > 0.2:
                        slow_sends.append(time.time())
            t0 = time.time()
            k = 0
            while time.time() - t0 < seconds:
                start = time.time()
                slow = start - t0 >= slow_at
                await asyncio.gather(*(one(r, 10 * k, 0.5 if slow and r == SLOW_RANK else 0.1) for r in ranks))
                sent += len(ranks)
                rounds.append(time.time() - start)
                k += 1
                wait = start + 1.0 - time.time()
                if wait > 0:
                    await asyncio.sleep(wait)
            ru = resource.getrusage(resource.RUSAGE_SELF)
            out.put({"sent": sent, "ok": ok, "elapsed": time.time() - t0, "slow_sends": slow_sends,
                     "rounds": rounds, "cpu": ru.ru_utime + ru.ru_stime})

    asyncio.run(run())


def _proc_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _proc_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return math.nan


def pure_check_ms(ranks: int, reps: int = 20) -> float:
    cfg = RanksConfig(history=HISTORY)
    views = RankViews(cfg.max_runs, cfg.max_ranks, cfg.history)
    now = 1000.0
    for k in range(HISTORY):
        for r in range(ranks):
            views.envelope(Envelope(run_id=RUN, device=str(r), sent_at=now, rank=r, samples=[Sample(
                run_id=RUN, device=str(r), step=k, time=now, loss=2.0 + 0.001 * (r % 7), local_grad_norm=1.0,
                step_time=0.1)]), now)
    t = time.perf_counter()
    for _ in range(reps):
        check(views, cfg, now)
    return (time.perf_counter() - t) / reps * 1000


def pure_view_us(ranks: int, n: int = 20_000) -> float:
    """Microseconds the view (RankViews.envelope) adds to one envelope's ingest."""
    from msmon.contract.wire import decode

    views = RankViews(200, max(ranks, 2), HISTORY)
    envs = [decode(_envelope(i % ranks, i // ranks, 0.1), Envelope) for i in range(n)]
    t = time.perf_counter()
    for i, e in enumerate(envs):
        views.envelope(e, float(i))
    return (time.perf_counter() - t) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=float(os.environ.get("MSMON_BENCH_SECONDS", "180")))
    ap.add_argument("--clients", type=int, default=2, help="client processes the ranks are spread over")
    args = ap.parse_args()
    port = _free_port()
    with tempfile.TemporaryDirectory() as tmp:
        cfg_path = os.path.join(tmp, "bot.yaml")
        with open(cfg_path, "w") as f:
            f.write(f"bot:\n  port: {port}\n  state_path: {tmp}/bot.sqlite\n"
                    f"  tokens: [{{project: '*', env: BENCH_TOKEN}}]\n"
                    f"  console: {{charts: false}}\n  max_request_bytes: 1048576\n"
                    f"  ranks: {{period: 1.0, history: {HISTORY}, straggler_checks: {CHECKS}, max_ranks: 100000}}\n")
        env = {**os.environ, "BENCH_TOKEN": TOKEN, "PYTHONPATH": os.path.dirname(os.path.dirname(
            os.path.abspath(__file__)))}
        bot = subprocess.Popen([sys.executable, "-c", f"import sys; from bot.server import serve; "
                                f"sys.exit(serve({cfg_path!r}))"], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
        decided: list[float] = []

        def read() -> None:
            assert bot.stdout is not None
            for line in bot.stdout:
                if re.search(r"rank_straggler WARNING", line) and not decided:
                    decided.append(time.time())

        threading.Thread(target=read, daemon=True).start()
        url = f"http://127.0.0.1:{port}/v1/ingest"
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        cpu0, t0 = _proc_cpu(bot.pid), time.time()
        q: multiprocessing.Queue = multiprocessing.Queue()  # type: ignore[type-arg]
        parts = [range(i, args.ranks, args.clients) for i in range(args.clients)]
        clients = [multiprocessing.Process(target=_client, args=(url, part, args.seconds, args.seconds / 2, q))
                   for part in parts]
        for c in clients:
            c.start()
        got = [q.get(timeout=args.seconds + 900) for _ in clients]
        for c in clients:
            c.join()
        res = {"sent": sum(g["sent"] for g in got), "ok": sum(g["ok"] for g in got),
               "elapsed": max(g["elapsed"] for g in got), "slow_sends": sum((g["slow_sends"] for g in got), []),
               "rounds": sorted(r for g in got for r in g["rounds"]), "cpu": sum(g["cpu"] for g in got)}
        bot_cpu_s = _proc_cpu(bot.pid) - cpu0
        time.sleep(3 * 1.0 + 1)  # the last checks
        cpu = (_proc_cpu(bot.pid) - cpu0) / (time.time() - t0) * 100
        rss = _proc_rss_mb(bot.pid)
        bot.terminate()
        bot.wait(30)
    offered = args.ranks
    rate = res["ok"] / res["elapsed"]
    rounds = res["rounds"]
    late = sum(1 for r in rounds if r > 1.0)
    print(f"ranks {args.ranks} in {args.clients} client processes, {res['elapsed']:.0f} s (offered {offered:,}/s); "
          f"accepted {res['ok']:,} of {res['sent']:,} envelopes = {rate:,.0f}/s "
          f"({'keeps up' if rate >= 0.98 * offered else 'falls behind'})")
    print(f"a round (each client's ranks post once) took median {rounds[len(rounds) // 2]:.2f} s, p99 "
          f"{rounds[min(len(rounds) - 1, int(0.99 * len(rounds)))]:.2f} s; {late} of {len(rounds)} over their 1 s")
    print(f"bot process: CPU {cpu:.0f}% of one core ({bot_cpu_s / max(res['ok'], 1) * 1e6:.0f} us a envelope: "
          f"one core would take about {res['ok'] / max(bot_cpu_s, 1e-9):,.0f} envelopes/s), RSS {rss:.0f} MB at the "
          f"end; the clients used {res['cpu'] / res['elapsed'] * 100:.0f}% of a core; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    slow = sorted(res["slow_sends"])
    if decided and slow:
        tip = slow[min(len(slow), math.ceil(HISTORY / 2)) - 1]
        print(f"straggler decision: {decided[0] - tip:.1f} s after the sample that tipped its pace "
              f"(median of {HISTORY}; then {CHECKS} checks 1 s apart), {decided[0] - slow[0]:.1f} s after its first "
              f"slow sample")
    else:
        print("straggler decision: NOT seen")
    print(f"one check of the rules over {args.ranks} ranks (pure, this process): {pure_check_ms(args.ranks):.1f} ms; "
          f"the view adds {pure_view_us(args.ranks):.1f} us to an envelope's ingest")


if __name__ == "__main__":
    main()
