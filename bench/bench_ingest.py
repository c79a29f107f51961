"""The bot's ingest path, measured in one run on loopback.

    .venv/bin/python bench/bench_ingest.py [--seconds 5]

1. the bot's resident memory holding 1,000 active runs with full metric windows, and after three
   times as many samples again (bounded by configuration, not by run length).
2. latency from an ERROR's arrival to the Slack API call (slack-sdk against the local Slack API
   server, charts off, rate limits opened), p50/p99, while 1000 events/s arrive;
3. events/s through the whole ingest (bot/ingest/envelope.py: the stages of bot/pipeline, outbox commit), batched
   (100 events per request) and single-event requests, each as a ratio to a bare aiohttp handler
   that accepts the same requests and does nothing, with the same client in the same run. The
   servers run in this process; the client (8 concurrent senders) in a process of its own, as
   training jobs are.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import logging
import multiprocessing
import os
import statistics
import sys
import tempfile
import threading
import time

import aiohttp
from aiohttp import web

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bot.app import build_receivers  # noqa: E402
from bot.config import load_bot_config  # noqa: E402
from bot.receivers.console import ConsoleReceiver  # noqa: E402
from bot.server import BotThread  # noqa: E402
from msmon.contract.wire import Envelope, Event, Sample, Severity, Status, encode  # noqa: E402
from tests.fakes.slack_api import SlackAPIServer  # noqa: E402

TOKEN = "bench-token"


def _event(run: str, device: int, rule: str, sev: Severity, message: str = "bench") -> Event:
    return Event(run_id=run, device=str(device), step=1, time=time.time(), rule=rule, severity=sev,
                 status=Status.FIRING, value=1.0, threshold=0.5, message=message)


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


class BareServer:
    """The baseline: an aiohttp handler that reads the body and answers 202, nothing else."""

    def __init__(self) -> None:
        async def handler(request: web.Request) -> web.Response:
            await request.read()
            return web.json_response({"accepted": True}, status=202)

        app = web.Application(client_max_size=8 << 20)
        app.router.add_post("/v1/ingest", handler)
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            self.runner = web.AppRunner(app)
            self.loop.run_until_complete(self.runner.setup())
            site = web.TCPSite(self.runner, "127.0.0.1", 0)
            self.loop.run_until_complete(site.start())
            self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            ready.set()
            self.loop.run_forever()

        threading.Thread(target=run, daemon=True).start()
        ready.wait(10)
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)


async def _blast(url: str, bodies: list[bytes], seconds: float, clients: int = 8) -> float:
    """Requests per second that `clients` concurrent senders achieve for `seconds`."""
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    done = 0
    deadline = time.monotonic() + seconds

    async def sender(session: aiohttp.ClientSession, k: int) -> None:
        nonlocal done
        i = k
        while time.monotonic() < deadline:
            async with session.post(url + "/v1/ingest", data=bodies[i % len(bodies)], headers=headers) as r:
                assert r.status == 202, await r.text()
            done += 1
            i += clients

    start = time.monotonic()
    async with aiohttp.ClientSession() as s:
        await asyncio.gather(*(sender(s, k) for k in range(clients)))
    return done / (time.monotonic() - start)


def _blast_proc(url: str, bodies: list[bytes], seconds: float, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    out.put(asyncio.run(_blast(url, bodies, seconds)))


def _blast_elsewhere(url: str, bodies: list[bytes], seconds: float) -> float:
    """`_blast` from a separate process (its own interpreter and GIL), like a training job's sender."""
    ctx = multiprocessing.get_context("spawn")
    out: multiprocessing.Queue = ctx.Queue()  # type: ignore[type-arg]
    proc = ctx.Process(target=_blast_proc, args=(url, bodies, seconds, out))
    proc.start()
    rate: float = out.get(timeout=seconds + 60)
    proc.join(30)
    return rate


def _bot(tmp: str, **over: object) -> BotThread:
    cfg = {"port": 0, "state_path": os.path.join(tmp, f"bot-{time.monotonic_ns()}.sqlite"),
           "tokens": [{"project": "*", "env": "MSMON_BENCH_TOKEN"}], "console": {"charts": False},
           "rate_limit": {"per_channel": 1e4, "per_run": 1e4, "global_rate": 1e4, "burst": 1000}, **over}
    return BotThread(load_bot_config({"bot": cfg}), receivers={"console": ConsoleReceiver(None, out=io.StringIO())})


def throughput(tmp: str, seconds: float) -> None:
    batched = [encode(Envelope(run_id=f"r{i}", device="0", sent_at=0.0, events=[
        _event(f"r{i}", d, "loss_spike", Severity.WARNING) for d in range(100)])) for i in range(50)]
    single = [encode(Envelope(run_id=f"s{i}", device="0", sent_at=0.0, events=[
        _event(f"s{i}", 0, "grad_norm", Severity.WARNING)])) for i in range(500)]
    fresh = [encode(Envelope(run_id=f"n{i}", device="0", sent_at=0.0, events=[
        _event(f"n{i}", d, "loss_spike", Severity.WARNING) for d in range(100)])) for i in range(3000)]
    bare = BareServer()
    try:
        rows = []
        for name, bodies, per in (("batched, a storm of repeats", batched, 100),
                                  ("batched, every event new", fresh, 100),
                                  ("single-event requests", single, 1)):
            b = _blast_elsewhere(bare.url, bodies, seconds) * per
            bot = _bot(tmp)  # a fresh bot per arm: one arm's outbox backlog must not slow the next
            try:
                p = _blast_elsewhere(bot.url, bodies, seconds) * per
            finally:
                bot.stop()
            rows.append((name, p, b))
        print("3. ingest throughput, events/s (8 concurrent senders in a client process, on loopback)")
        for name, p, b in rows:
            print(f"   {name:<28} pipeline {p:9.0f}   bare handler {b:9.0f}   ratio {p / b:.2f}")
    finally:
        bare.stop()


def latency(tmp: str, seconds: float) -> None:
    with SlackAPIServer() as slack:
        os.environ["MSMON_BENCH_SLACK"] = "xoxb-bench"
        cfg = load_bot_config({"bot": {
            "port": 0, "state_path": os.path.join(tmp, "lat.sqlite"),
            "tokens": [{"project": "*", "env": "MSMON_BENCH_TOKEN"}],
            "routes": [{"receiver": "slack", "channel": "C0BENCH", "severity": "ERROR"},
                       {"receiver": "console", "channel": "null"}],
            "slack": {"base_url": slack.base_url, "token_env": "MSMON_BENCH_SLACK"}, "console": {"charts": False},
            "rate_limit": {"per_channel": 1e4, "per_run": 1e4, "global_rate": 1e4, "burst": 1000}}})
        receivers = {**build_receivers(cfg), "console": ConsoleReceiver(None, out=io.StringIO())}
        bot = BotThread(cfg, receivers=receivers)
        sent: dict[str, float] = {}

        async def drive() -> None:
            headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
            async with aiohttp.ClientSession() as s:
                t_end = time.monotonic() + seconds
                i = 0
                while time.monotonic() < t_end:
                    tick = time.monotonic()
                    # 100 events per 0.1 s = 1000 events/s: 99 WARNINGs and 1 new ERROR
                    events = [_event(f"w{i}", d, "loss_spike", Severity.WARNING) for d in range(99)]
                    body_w = encode(Envelope(run_id=f"w{i}", device="0", sent_at=0.0, events=events))
                    tag = f"e{i}"
                    body_e = encode(Envelope(run_id=tag, device="0", sent_at=0.0,
                                             events=[_event(tag, 0, "grad_norm", Severity.ERROR, message=tag)]))
                    sent[tag] = time.monotonic()
                    async with s.post(bot.url + "/v1/ingest", data=body_e, headers=headers) as r:
                        assert r.status == 202
                    async with s.post(bot.url + "/v1/ingest", data=body_w, headers=headers) as r:
                        assert r.status == 202
                    i += 1
                    await asyncio.sleep(max(0.0, 0.1 - (time.monotonic() - tick)))

        asyncio.run(drive())
        slack.wait_for(lambda srv: len(srv.messages()) >= len(sent), timeout=30)
        lat = []
        for call in slack.calls_to("chat.postMessage"):
            tag = str(call.params.get("text", "")).split("\n")[1] if "\n" in str(call.params.get("text", "")) else ""
            if tag in sent:
                lat.append(call.time - sent[tag])
        bot.stop()
    q = statistics.quantiles(lat, n=100, method="inclusive")
    print(f"2. ERROR arrival -> Slack chat.postMessage at ~1000 events/s: n={len(lat)}  p50 {q[49] * 1e3:.1f} ms  "
          f"p99 {q[98] * 1e3:.1f} ms")


def memory(tmp: str) -> None:
    bot = _bot(tmp, window_samples=600, max_runs=1000)
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}

    async def feed(rounds: int, offset: int) -> None:
        async with aiohttp.ClientSession() as s:
            for rnd in range(rounds):
                for run in range(1000):
                    samples = [Sample(run_id=f"m{run}", device="0", step=offset + rnd * 200 + k, time=0.0, loss=2.0,
                                      learning_rate=1e-4, grad_norm=1.0, tokens_per_s=1e4) for k in range(200)]
                    body = encode(Envelope(run_id=f"m{run}", device="0", sent_at=0.0, samples=samples))
                    async with s.post(bot.url + "/v1/ingest", data=body, headers=headers) as r:
                        assert r.status == 202

    base = _rss_mb()
    asyncio.run(feed(3, 0))  # 600 samples per run: the windows are full
    full = _rss_mb()
    asyncio.run(feed(9, 600))  # three times as many more
    after = _rss_mb()
    bot.stop()
    print(f"1. resident memory (whole benchmark process): {base:.0f} MB before, {full:.0f} MB with 1,000 runs x 600 "
          f"samples, {after:.0f} MB after 3x more samples (window_samples and max_runs bound it)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=5.0)
    args = ap.parse_args()
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    logging.getLogger("msmon.bot").setLevel(logging.WARNING)
    os.environ["MSMON_BENCH_TOKEN"] = TOKEN
    tmp = tempfile.mkdtemp(prefix="msmon-bench-")
    memory(tmp)  # first: nothing else in the process yet
    latency(tmp, args.seconds)
    throughput(tmp, args.seconds)


if __name__ == "__main__":
    main()
