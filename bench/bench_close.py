"""What a job's close() costs the bot when the bot refuses the job, and what 32 ranks closing together leave.

    .venv/bin/python bench/bench_close.py            # this tree
    .venv/bin/python bench/bench_close.py --tree DIR # another checkout (e.g. `git archive <rev>` unpacked)

1. Refused: a job whose token is for another project (every envelope a 403) queues 300 ERRORs and
   closes with close(timeout=5): how many refused ingests the bot logged (REFUSED lines) meanwhile.
   The transport's flush() used to hurry every 50 ms, past the backoff: a flood.
2. Closing together: 32 ranks (BotTransport, rank, world 32, heartbeats every 50 ms) report, then all
   close(final=True) at once; after 3 x ranks.missing_after: the rank_missing alerts (want 0) and the
   "ended normally" log lines (want 1: one per run).
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import tempfile
import threading
import time

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--tree", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
args = parser.parse_args()
sys.path.insert(0, args.tree)
os.environ.update(MSMON_TEST_TOKEN="job-token", MSMON_VISION="vision-token")

from msmon.contract.wire import Event, Sample, Severity, Status  # noqa: E402
from notifier.transport import BotTransport  # noqa: E402
from tests.fakes.bot_server import BotServer  # noqa: E402


class Lines(logging.Handler):
    def __init__(self, needle: str) -> None:
        super().__init__()
        self.needle, self.n = needle, 0

    def emit(self, record: logging.LogRecord) -> None:
        self.n += self.needle in record.getMessage()


def bot(tmp: str, **ranks: float) -> BotServer:
    return BotServer({"bot": {"port": 0, "state_path": f"{tmp}/bot.sqlite", "ranks": {"period": 0.2, **ranks},
                              "tokens": [{"project": "llm", "env": "MSMON_TEST_TOKEN"},
                                         {"project": "vision", "env": "MSMON_VISION"}]}})


def refused(tmp: str) -> None:
    b, lines = bot(tmp), Lines("REFUSED")
    logging.getLogger("msmon.bot").addHandler(lines)
    t = BotTransport(b.url, "refused", "0", "vision-token", project="llm", heartbeat_interval=60.0,
                     flush_interval=0.05, backoff=(0.5, 30.0), spool_dir=f"{tmp}/spool")
    for i in range(300):
        t.event(Event(run_id="refused", device="0", step=i, time=time.time(), rule=f"r{i % 7}",
                      severity=Severity.ERROR, status=Status.FIRING, value=math.nan, threshold=0.0, message="NaN"))
    start = time.time()
    t.close(timeout=5.0)
    print(f"refused job, close(timeout=5): {lines.n} refused ingests in {time.time() - start:.1f} s")
    logging.getLogger("msmon.bot").removeHandler(lines)
    b.stop()


def closing_together(tmp: str, n: int = 32) -> None:
    b, ends = bot(tmp, missing_after=1.0), Lines("ended normally")
    logging.getLogger("msmon.bot").addHandler(ends)
    kw = {"world": n} if "world" in BotTransport.__init__.__code__.co_varnames else {}
    ranks = [BotTransport(b.url, "dp", str(r), "job-token", project="llm", rank=r, heartbeat_interval=0.05,
                          flush_interval=0.05, spool_dir=f"{tmp}/spool-{r}", **kw) for r in range(n)]
    for step in range(1, 4):
        for r, t in enumerate(ranks):
            t.sample(Sample(run_id="dp", device=str(r), step=step, time=time.time(), loss=2.0, step_time=0.1))
        time.sleep(0.2)
    for t in ranks:
        t.flush(10)
    closers = [threading.Thread(target=t.close, kwargs={"final": True}) for t in ranks]
    for c in closers:
        c.start()
    for c in closers:
        c.join(15)
    time.sleep(3.0)
    missing = [a for a in b.store.alerts("dp") if a["rule"] == "rank_missing"]
    print(f"{n} ranks closing together: {len(missing)} rank_missing alerts, {ends.n} 'ended normally' lines")
    b.stop()


logging.basicConfig(level=logging.CRITICAL)
logging.getLogger("msmon.bot").setLevel(logging.INFO)  # counted here, not printed
logging.getLogger("msmon.bot").propagate = False
refused(tempfile.mkdtemp())
closing_together(tempfile.mkdtemp())
