"""What one tick of the bot's periodic passes costs as what it stores grows: the watchdog, the escalator and the
cross-rank rules, at 1,000, 10,000 and 100,000 stored runs / firing alerts / ranks, with a fixed small number
changed between two ticks. A pass that grows with what changed stays flat along a row; one that grows with what
is stored grows tenfold per column.

    .venv/bin/python bench/bench_growth.py [--sizes 1000,10000,100000] [--changed 10]

Each figure is the CPU time of the pass's thread (time.thread_time: what other processes on the machine do moves it
far less than wall time; the load average is printed with it) and, for the passes that read SQLite, the instructions
SQLite's virtual machine ran for it (its progress handler: the same on any machine, whatever the load; a scan of N
rows is at least N of them); for the rank rules' tick of one run, the lines of Python it ran (sys.settrace), as
load-free a count.

1. Watchdog (bot/ingest/watchdog.py, every 2 s): a SQLite store of N runs (inserted directly, heard from an hour
   ago and judged by a first pass), then `--changed` runs heard from; the median of 5 passes.
2. Escalator (bot/escalation/scheduler.py, every 1 s): N firing alerts (ten rules on each of N/10 runs), one route
   with an escalation policy that takes them (none due yet): the median of 5 passes after the first.
3. Cross-rank rules (bot/ranks, every ranks.period): N ranks in runs of 64, each with a full history; one check
   of every rule over them (pure, as bot/ranks/watch.py calls it) when every run reported since the previous
   check, and when one run (64 ranks) did: the median of 5.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

from bench_bounds import fill_runs  # noqa: E402

from bot.config import BotConfig, RanksConfig, load_bot_config  # noqa: E402
from bot.ingest.envelope import Ingest  # noqa: E402
from bot.ingest.watchdog import Watchdog  # noqa: E402
from bot.metrics import BotMetrics  # noqa: E402
from bot.ranks import check  # noqa: E402
from bot.ranks.view import RankViews  # noqa: E402
from bot.shared import BotState  # noqa: E402
from bot.store.sqlite import Store  # noqa: E402
from msmon.contract.wire import Envelope, Event, Sample, Severity, Status, encode  # noqa: E402

Figure = tuple[float, int | None]  # (ms of CPU, SQLite VM instructions or None)


def python_lines(fn: Callable[[], object]) -> int:
    """The lines of Python one call of `fn` runs (sys.settrace's line events: the same on any machine; a loop over N
    runs is at least N of them)."""
    n = [0]

    def trace(frame: Any, event: str, arg: object) -> Any:
        if event == "line":
            n[0] += 1
        return trace

    sys.settrace(trace)
    try:
        fn()
    finally:
        sys.settrace(None)
    return n[0]


def median_ms(fn: Callable[[], object], reps: int = 5, db: sqlite3.Connection | None = None) -> Figure:
    """The median CPU time of `reps` calls, and the median of the SQLite VM instructions they ran on `db`."""
    times, steps = [], []
    count = [0]

    def step() -> int:
        count[0] += 1
        return 0

    for _ in range(reps):
        count[0] = 0
        if db is not None:
            db.set_progress_handler(step, 1)
        t = time.thread_time()
        fn()
        times.append(time.thread_time() - t)
        if db is not None:
            db.set_progress_handler(None, 1)
        steps.append(count[0])
    return statistics.median(times) * 1e3, (int(statistics.median(steps)) if db is not None else None)


def watchdog(tmp: str, runs: int, changed: int) -> Figure:
    path = os.path.join(tmp, f"dog-{runs}.sqlite")
    fill_runs(path, runs)
    now = [time.time()]
    cfg = BotConfig(state_path=path)
    store = Store(path)
    state = BotState(cfg, store, BotMetrics(), lambda: now[0])
    dog = Watchdog(cfg, store, Ingest(state), lambda: now[0])
    dog.started -= 7200  # the bot has run for two hours: no start-up grace ends during the measurement
    dog.check()  # the first pass reads every run (job_gone for all: an hour silent), as on start

    def tick() -> None:
        now[0] += 2.0
        for i in range(changed):
            store.touch_run(f"run-{(i * 7919) % runs:06d}", "p", {}, "0", 200, now[0], heartbeat=True)
        dog.check()

    return median_ms(tick, db=store.db)


def escalator(tmp: str, firing: int) -> Figure:
    from bot.escalation.scheduler import Escalator
    from bot.store.sqlite import AlertRow

    cfg = load_bot_config({"bot": {
        "state_path": os.path.join(tmp, f"esc-{firing}.sqlite"),
        "escalations": {"page": {"levels": [{"after": 86400, "mention": ["@oncall"]}]}},
        "routes": [{"receiver": "console", "channel": "c", "escalation": "page"}]}})
    state = BotState(cfg, Store(cfg.state_path), BotMetrics())
    now = time.time()
    with state.store.tx():
        for r in range(max(firing // 10, 1)):
            state.store.touch_run(f"run-{r}", "p", {}, "0", 5, now)
        state.store.save_alerts([AlertRow(f"run-{i // 10}|rule{i % 10}|0", f"run-{i // 10}", f"rule{i % 10}", "0",
                                          "ERROR", "firing", 5, now, event=encode(Event(
                                              run_id=f"run-{i // 10}", device="0", step=5, time=now,
                                              rule=f"rule{i % 10}", severity=Severity.ERROR, status=Status.FIRING,
                                              value=3.0, threshold=2.0, message="m")).decode())
                                 for i in range(firing)])
    esc = Escalator(state)
    esc.sync()  # the first pass starts an escalation for each
    return median_ms(esc.sync, db=state.store.db)


def ranks(n: int, quiet: bool, per_run: int = 64) -> Figure:
    """One check over N ranks in runs of `per_run`: every run reported since the previous check, or (`quiet`) one."""
    cfg = RanksConfig(history=4, max_runs=max(n // per_run + 1, 1), max_ranks=per_run)
    views = RankViews(cfg.max_runs, cfg.max_ranks, cfg.history)
    now = 1000.0
    for k in range(cfg.history):
        for r in range(n):
            run = f"run-{r // per_run}"
            views.envelope(Envelope(run_id=run, device=str(r % per_run), sent_at=now, rank=r % per_run,
                                    samples=[Sample(run_id=run, device=str(r % per_run), step=k, time=now,
                                                    loss=2.0 + 0.001 * (r % 7), local_grad_norm=1.0,
                                                    step_time=0.1)]), now)
    if not quiet:
        return median_ms(lambda: check(views, cfg, now))
    check(views, cfg, now)  # the check before: every run judged once
    later = [now]

    def tick() -> None:
        later[0] += 1.0
        for r in range(per_run):  # one run's ranks reported since
            views.envelope(Envelope(run_id="run-0", device=str(r), sent_at=later[0], rank=r, samples=[Sample(
                run_id="run-0", device=str(r), step=99, time=later[0], loss=2.0, local_grad_norm=1.0,
                step_time=0.1)]), later[0])
        check(views, cfg, later[0], since=later[0] - 1.0)

    ms = median_ms(tick)[0]
    return ms, python_lines(tick)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,10000,100000")
    ap.add_argument("--changed", type=int, default=10)
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    rows: dict[str, list[Figure]] = {}
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        rows[f"watchdog pass, {args.changed} runs heard from"] = [watchdog(tmp, n, args.changed) for n in sizes]
        rows["escalator pass, nothing due"] = [escalator(tmp, n) for n in sizes]
    rows["cross-rank rules, every run reported"] = [ranks(n, quiet=False) for n in sizes]
    rows["cross-rank rules, one run of 64 reported"] = [ranks(n, quiet=True) for n in sizes]
    load = max(load, os.getloadavg()[0])
    print(f"one tick of each periodic pass against what is stored ({', '.join(f'{n:,}' for n in sizes)} runs / "
          f"firing alerts / ranks), median of 5: ms of CPU [SQLite VM instructions; for one run of 64: "
          f"Python lines run], Python "
          f"{sys.version.split()[0]}, load average (1 min) up to {load:.2f} on {os.cpu_count()} CPUs")
    print(f"{'':<42}" + "".join(f"{n:>22,}" for n in sizes) + f"{'100k / 1k':>12}")
    for name, values in rows.items():
        cells = [f"{ms:.2f}" + (f" [{vm:,}]" if vm is not None else "") for ms, vm in values]
        print(f"{name:<42}" + "".join(f"{c:>22}" for c in cells) + f"{values[-1][0] / max(values[0][0], 1e-9):>11.1f}x")


if __name__ == "__main__":
    main()
