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

    .venv/bin/python bench/bench_ranks.py --instructions [--tree DIR]

instead counts the CPU instructions of the bot process per envelope with valgrind's callgrind (the count does not
move with the load on this shared machine, unlike the CPU time above): the bot (`serve`, the tree in DIR, this
one unless said) under callgrind takes the transport's traffic for `--ranks` ranks of one run from `--clients`
kept-alive connections posting back to back (a heartbeat folded into every third envelope of a rank, a long poll
per 20 envelopes, held until its wait, shortened to 0.05 s, runs out): every rank's first envelope is sent
uncounted, then `--rounds` more of each are counted (callgrind_control reads the count before and after), less
what the bot does on its own meanwhile (its count over 10 s with nothing sent, per second). User space only
(the kernel's TCP and file writes are not counted: the CPU-time figure's
kernel share, printed above, says how much that is). The timed passes (the rank rules' check, the overload
watch) are off: their cost per second is printed by the timed run (3.).
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
from msmon.contract.wire import Envelope, Heartbeat, Poll, Sample, encode  # noqa: E402

TOKEN = "bench-token"
RUN = "bench-ranks"
SLOW_RANK = 17
HISTORY, CHECKS = 4, 2
POLL_WAIT = 20.0  # BotTransport's poll_wait


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _envelope(rank: int, step: int, step_time: float, heartbeat: bool = True) -> bytes:
    now = time.time()
    return encode(Envelope(run_id=RUN, device=str(rank), sent_at=now, rank=rank, host=f"node-{rank // 8}",
                           samples=[Sample(run_id=RUN, device=str(rank), step=step, time=now,
                                           loss=2.0 + 0.001 * (rank % 7), grad_norm=1.0, local_grad_norm=1.0,
                                           step_time=step_time, samples_per_s=32 / step_time)],
                           heartbeats=[Heartbeat(run_id=RUN, device=str(rank), time=now, step=step)] if heartbeat
                           else []))


def _heartbeat(rank: int, step: int) -> bytes:
    return encode(Heartbeat(run_id=RUN, device=str(rank), time=time.time(), step=step, rank=rank,
                            host=f"node-{rank // 8}"))


def _poll(rank: int) -> bytes:
    return encode(Poll(run_id=RUN, device=str(rank), wait=POLL_WAIT))


# What a rank's BotTransport sends (notifier/transport/), per pattern:
#   transport - now: kept-alive connections (one per thread: sender, heartbeat, poll), an envelope a second, a
#               heartbeat in every third envelope (due within two flushes of its 5 s), a long poll held open
#   old       - before: the same with a new connection per request and every heartbeat a request of its own
#   bench     - what this bench did before: kept-alive, a heartbeat in every envelope, no long polls, 32 in flight
PATTERNS = ("transport", "old", "bench")


def _client(url: str, ranks: range, seconds: float, slow_at: float, out: multiprocessing.Queue,  # type: ignore[type-arg]
            pattern: str = "transport") -> None:
    """Ranks `ranks`, each as its own job would: an envelope a second on its own timer (a late one goes at once, no
    catch-up burst), heartbeats and long polls as `pattern` says."""
    import resource

    import aiohttp

    base = url.rsplit("/v1/", 1)[0]
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}

    async def run() -> None:
        sent = ok = beats = polls = 0
        slow_sends: list[float] = []
        rtts: list[float] = []
        rounds: list[float] = []
        stop = time.time() + seconds
        fresh = pattern == "old"  # a new connection per request
        sem = asyncio.Semaphore(32 if pattern == "bench" else 1 << 30)
        conn = aiohttp.TCPConnector(limit=0, force_close=fresh)
        async with aiohttp.ClientSession(connector=conn) as http:
            async def post(path: str, body: bytes, timeout: float = 30.0) -> int:
                try:
                    async with http.post(base + path, data=body, headers=headers,
                                         timeout=aiohttp.ClientTimeout(total=timeout)) as r:
                        await r.read()
                        return r.status
                except (aiohttp.ClientError, asyncio.TimeoutError):
                    return 0

            async def sender(rank: int) -> None:
                nonlocal sent, ok
                k = 0
                t0 = time.time() + (rank % 1000) / 1000  # the ranks' clocks are not in step
                await asyncio.sleep(max(t0 - time.time(), 0))
                while time.time() < stop:
                    start = time.time()
                    slow = start - (stop - seconds) >= slow_at
                    st = 0.5 if slow and rank == SLOW_RANK else 0.1
                    folded = pattern == "bench" or (pattern == "transport" and k % 3 == 2)
                    async with sem:
                        status = await post("/v1/ingest", _envelope(rank, 10 * k, st, heartbeat=folded))
                    rtts.append(time.time() - start)
                    sent += 1
                    ok += status == 202
                    if st > 0.2:
                        slow_sends.append(time.time())
                    k += 1
                    await asyncio.sleep(max(t0 + k - time.time(), 0))

            async def beater(rank: int) -> None:
                nonlocal beats
                await asyncio.sleep(5.0 + (rank % 1000) / 200)
                while time.time() < stop:
                    await post("/v1/heartbeat", _heartbeat(rank, 0))
                    beats += 1
                    await asyncio.sleep(5.0)

            async def poller(rank: int) -> None:
                nonlocal polls
                while time.time() < stop:
                    polls += 1
                    status = await post("/v1/commands/poll", _poll(rank), POLL_WAIT + 10)
                    if status != 200:
                        await asyncio.sleep(1.0)

            tasks = [asyncio.ensure_future(sender(r)) for r in ranks]
            if pattern == "old":
                tasks += [asyncio.ensure_future(beater(r)) for r in ranks]
            side = [asyncio.ensure_future(poller(r)) for r in ranks] if pattern != "bench" else []
            t_start = time.time()
            await asyncio.gather(*tasks)
            for t in side:
                t.cancel()
            await asyncio.gather(*side, return_exceptions=True)
            ru = resource.getrusage(resource.RUSAGE_SELF)
            rounds.append(time.time() - t_start)
            out.put({"sent": sent, "ok": ok, "elapsed": seconds, "slow_sends": slow_sends, "rtts": rtts,
                     "rounds": rounds, "beats": beats, "polls": polls, "cpu": ru.ru_utime + ru.ru_stime})

    asyncio.run(run())


def _proc_cpu(pid: int) -> float:
    return sum(_proc_times(pid))


def _proc_times(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of process `pid` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def _sched(pid: int) -> tuple[float, float]:
    """(seconds on a CPU, seconds runnable but waiting for one) of every thread of `pid`, from
    /proc/<pid>/task/*/schedstat: where a process that is not busy spends the time it is not idle."""
    run = wait = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                ran, waited, _ = (int(x) for x in f.read().split())
        except (OSError, ValueError):
            continue
        run, wait = run + ran, wait + waited
    return run / 1e9, wait / 1e9


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


HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


async def _drive(port: int, ranks: int, first: int, count: int, clients: int) -> int:
    """Envelopes `first`..`first + count - 1` of the sequence (rank i % ranks, its (i // ranks)-th envelope) from
    `clients` kept-alive connections, back to back; a long poll per 20 envelopes. How many were accepted (202)."""
    import aiohttp

    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    base = f"http://127.0.0.1:{port}"
    ok = 0
    polls: list[asyncio.Task[None]] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        async def poll(rank: int) -> None:
            body = encode(Poll(run_id=RUN, device=str(rank), wait=0.05))
            async with http.post(base + "/v1/commands/poll", data=body, headers=headers) as r:
                await r.read()

        async def conn(c: int) -> None:
            nonlocal ok
            for i in range(first + c, first + count, clients):
                rank, k = i % ranks, i // ranks
                body = _envelope(rank, 10 * k, 0.1, heartbeat=k % 3 == 2)
                async with http.post(base + "/v1/ingest", data=body, headers=headers) as r:
                    await r.read()
                    ok += r.status == 202
                if i % 20 == 0:
                    polls.append(asyncio.ensure_future(poll(rank)))

        await asyncio.gather(*(conn(c) for c in range(clients)))
        await asyncio.gather(*polls)
    return ok


def _counted(pid: int) -> int:
    """The instructions callgrind has counted so far in process `pid` (callgrind_control, through vgdb)."""
    out = subprocess.run(["callgrind_control", "-e", "Ir", str(pid)], capture_output=True, text=True, timeout=120)
    found = re.findall(r"^\s*Th\s+\d+\s+([\d,]+)", out.stdout, re.MULTILINE)  # a line per thread
    if not found:
        raise SystemExit(f"callgrind_control gave no count:\n{out.stdout}{out.stderr}")
    return sum(int(x.replace(",", "")) for x in found)


def _bot_yaml(tmp: str, port: int, ranks_period: float, extra: str = "") -> str:
    """The bench bot's bot.yaml in `tmp` (SQLite there, the bench token for every project, `ranks.period` as
    given, the straggler rule's history and checks of this bench); its path."""
    path = os.path.join(tmp, "bot.yaml")
    with open(path, "w") as f:
        f.write(f"bot:\n  port: {port}\n  state_path: {tmp}/bot.sqlite\n"
                f"  tokens: [{{project: '*', env: BENCH_TOKEN}}]\n"
                f"  console: {{charts: false}}\n  max_request_bytes: 1048576\n{extra}"
                f"  ranks: {{period: {ranks_period}, history: {HISTORY}, straggler_checks: {CHECKS}, "
                f"max_ranks: 100000}}\n")
    return path


def instructions_per_envelope(tree: str, ranks: int, rounds: int, clients: int, idle: float = 10.0
                              ) -> tuple[float, float, float]:
    """(instructions per envelope, of which the bot's timed tasks, per second idle): the bot (tree `tree`) under
    callgrind, every rank's first envelope sent (not counted), then `rounds` more of each counted; what the bot
    does on its own in a second (counted over `idle` seconds with nothing sent) times the counted part's length
    is taken out."""
    with tempfile.TemporaryDirectory() as tmp:
        port = _free_port()
        cfg_path = _bot_yaml(tmp, port, ranks_period=3600.0, extra="  overload: {enable: false}\n")
        env = {**os.environ, "BENCH_TOKEN": TOKEN, "PYTHONPATH": tree, "PYTHONHASHSEED": "0"}
        code = f"import sys; sys.path.insert(0, {tree!r}); from bot.server import serve; sys.exit(serve({cfg_path!r}))"
        bot = subprocess.Popen(["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/cg.out", sys.executable,
                                "-c", code], env=env, cwd=tree, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                               text=True)
        try:
            assert bot.stdout is not None
            for line in bot.stdout:
                if "listening on" in line:
                    break
            else:
                raise SystemExit("the bot did not start under callgrind")
            asyncio.run(_drive(port, ranks, 0, ranks, clients))  # every rank known, not counted
            a, t0 = _counted(bot.pid), time.monotonic()
            time.sleep(idle)
            b, t1 = _counted(bot.pid), time.monotonic()
            ok = asyncio.run(_drive(port, ranks, ranks, ranks * rounds, clients))
            c, t2 = _counted(bot.pid), time.monotonic()
        finally:
            bot.terminate()
            bot.wait(300)
        if ok != ranks * rounds:
            raise SystemExit(f"only {ok} of {ranks * rounds} envelopes accepted")
        per_s = (b - a) / (t1 - t0)
        background = per_s * (t2 - t1)
        return (c - b - background) / ok, background / ok, per_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=float(os.environ.get("MSMON_BENCH_SECONDS", "180")))
    ap.add_argument("--clients", type=int, default=2, help="client processes the ranks are spread over")
    ap.add_argument("--profile", metavar="FILE", help="run the bot under cProfile, its stats written to FILE")
    ap.add_argument("--perf", metavar="FILE", help="sample the bot with `perf record -g` while the ranks run (its C "
                    "stacks: the interpreter, SQLite, msgspec, the kernel's TCP), written to FILE")
    ap.add_argument("--pattern", choices=PATTERNS, default="transport",
                    help="what each rank sends: as the transport does now (default), as it did before (old), or as "
                         "this bench did before (bench)")
    ap.add_argument("--instructions", action="store_true", help="count the bot's CPU instructions per envelope under "
                    "callgrind instead (see above); --ranks 1000 --clients 8 --rounds 2 unless said")
    ap.add_argument("--tree", default=HERE, help="with --instructions: the source tree of the bot measured")
    ap.add_argument("--rounds", type=int, default=2, help="with --instructions: envelopes per rank measured")
    args = ap.parse_args()
    if args.instructions:
        clients = args.clients if args.clients != 2 else 8
        per, background, per_s = instructions_per_envelope(os.path.abspath(args.tree), args.ranks, args.rounds, clients)
        print(f"bot instructions per envelope (callgrind, user space; {args.ranks} ranks of one run, {clients} "
              f"kept-alive connections, a heartbeat in every third envelope, a long poll per 20; tree {args.tree}): "
              f"{per:,.0f} (the bot's timed tasks, {per_s / 1e6:.1f}M instructions a second idle, taken out: "
              f"{background:,.0f} an envelope)")
        return
    port = _free_port()
    with tempfile.TemporaryDirectory() as tmp:
        cfg_path = _bot_yaml(tmp, port, ranks_period=1.0)
        env = {**os.environ, "BENCH_TOKEN": TOKEN, "PYTHONPATH": os.path.dirname(os.path.dirname(
            os.path.abspath(__file__)))}
        code = f"import sys; from bot.server import serve; sys.exit(serve({cfg_path!r}))"
        if args.profile:
            code = (f"import cProfile, sys; from bot.server import serve; p = cProfile.Profile(); p.enable(); "
                    f"serve({cfg_path!r}); p.disable(); p.dump_stats({os.path.abspath(args.profile)!r})")
        bot = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
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
        times0, t0 = _proc_times(bot.pid), time.time()
        cpu0 = sum(times0)
        perf = subprocess.Popen(["perf", "record", "-q", "-g", "-o", args.perf, "-p", str(bot.pid)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) if args.perf else None
        sched0 = _sched(bot.pid)
        q: multiprocessing.Queue = multiprocessing.Queue()  # type: ignore[type-arg]
        parts = [range(i, args.ranks, args.clients) for i in range(args.clients)]
        clients = [multiprocessing.Process(target=_client, args=(url, part, args.seconds, args.seconds / 2, q,
                                                                 args.pattern)) for part in parts]
        for c in clients:
            c.start()
        got = [q.get(timeout=args.seconds + 900) for _ in clients]
        for c in clients:
            c.join()
        user_s, sys_s = (b - a for a, b in zip(times0, _proc_times(bot.pid), strict=True))
        bot_cpu_s = user_s + sys_s
        if perf is not None:
            perf.send_signal(2)
            perf.wait(60)
        bot_wall = time.time() - t0
        ran, waited = (b - a for a, b in zip(sched0, _sched(bot.pid), strict=True))
        res = {"sent": sum(g["sent"] for g in got), "ok": sum(g["ok"] for g in got),
               "elapsed": max(g["elapsed"] for g in got), "slow_sends": sum((g["slow_sends"] for g in got), []),
               "rtts": sorted(r for g in got for r in g["rtts"]), "beats": sum(g["beats"] for g in got),
               "polls": sum(g["polls"] for g in got), "cpu": sum(g["cpu"] for g in got)}
        time.sleep(3 * 1.0 + 1)  # the last checks
        cpu = (_proc_cpu(bot.pid) - cpu0) / (time.time() - t0) * 100
        rss = _proc_rss_mb(bot.pid)
        bot.terminate()
        bot.wait(30)
    offered = args.ranks
    rate = res["ok"] / res["elapsed"]
    rtts = res["rtts"]
    per_env = bot_cpu_s / max(res["ok"], 1)
    print(f"pattern {args.pattern}: ranks {args.ranks} in {args.clients} client processes, {res['elapsed']:.0f} s "
          f"(offered {offered:,} envelopes/s); accepted {res['ok']:,} of {res['sent']:,} = {rate:,.0f}/s "
          f"({'keeps up' if rate >= 0.98 * offered else 'falls behind'}); besides: {res['beats']:,} heartbeat "
          f"requests, {res['polls']:,} long polls")
    print(f"an envelope's POST -> 202: median {rtts[len(rtts) // 2] * 1e3:.0f} ms, p99 "
          f"{rtts[min(len(rtts) - 1, int(0.99 * len(rtts)))] * 1e3:.0f} ms")
    print(f"bot process: CPU {cpu:.0f}% of one core; {per_env * 1e6:.0f} us of bot CPU per envelope (everything the "
          f"ranks sent, heartbeats and polls included, over the envelopes: one core would take about "
          f"{1 / max(per_env, 1e-9):,.0f} envelopes/s with this pattern; {user_s / bot_cpu_s * 100:.0f}% of it in user "
          f"space, {sys_s / bot_cpu_s * 100:.0f}% in the kernel), "
          f"{bot_cpu_s / bot_wall / args.ranks * 1e6:.0f} us of bot CPU per rank per second; RSS {rss:.0f} MB at the "
          f"end; the clients used "
          f"{res['cpu'] / res['elapsed'] * 100:.0f}% of a core; load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} cores")
    print(f"where the bot's time went: {ran / bot_wall * 100:.0f}% of the run on a CPU, {waited / bot_wall * 100:.0f}% "
          f"runnable but waiting for a CPU (the run queue: other processes on these {os.cpu_count()} cores), the "
          f"rest idle or blocked")
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
