"""The house's second step (bot/ by the flow, one representation per hop) against the tree before it, in CPU
instructions (valgrind's callgrind: the count does not move with the load on the machine).

    .venv/bin/python bench/bench_house.py [--before b97e5d3]

Each arm runs in a fresh process under callgrind, once with a few and once with many units of work; the
difference divided by the difference in units is the cost of one unit, start-up and imports taken out.
Both trees are imported from their own source (the old one from a `git worktree` of `--before`), with the
same Python, packages and inputs:

- envelope: what `POST /v1/ingest` does per envelope once the request is read: decode the body, then
  `Ingest.envelope` (the run, the metric windows, the events through the stages, alert and outbox rows, the
  commit) on the SQLite store; the traffic of 64 ranks of 8 runs, 10 samples an envelope, and one event in
  four envelopes (a WARNING repeated on every rank, suppressed after the first, a new ERROR now and then);
- command: a chat command submitted (parse, permission, store) and every rank's poll answered.

Needs valgrind (Debian: apt-get install valgrind). About two minutes.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNS, RANKS = 8, 8


def child(arm: str, units: int) -> None:  # runs under callgrind, with sys.path[0] = the tree measured
    import msgspec

    from bot.config import load_bot_config
    from bot.metrics import BotMetrics
    from msmon.contract.wire import Envelope, Event, Sample, Severity, Status, encode

    try:  # the tree after: bot/ by the flow
        from bot.ingest.envelope import Ingest
        from bot.shared import BotState
        from bot.store import open_store
        old = False
    except ImportError:  # the tree before
        from bot.state import BotState  # type: ignore[no-redef,import-not-found]
        from bot.stores import open_store  # type: ignore[no-redef,import-not-found]

        from bot.ingest import Ingest  # type: ignore[no-redef]
        old = True
    from bot.commands import jobs
    from bot.commands.origin import Origin
    from bot.commands.service import CommandService

    tmp = tempfile.mkdtemp()
    cfg = load_bot_config({"bot": {"port": 0, "state_path": os.path.join(tmp, "s.sqlite"), "overload": {
        "enable": False}, "commands": {"allow": [{"project": "p", "users": ["cli:ana"]}]}}})
    clock = [1000.0]
    state = BotState(cfg, open_store(cfg), BotMetrics(), lambda: clock[0])
    ingest, service = Ingest(state), CommandService(state)

    def body(i: int) -> bytes:
        run, rank = f"run-{i % RUNS}", (i // RUNS) % RANKS
        step = 10 * (i // (RUNS * RANKS)) + 10
        samples = [Sample(run_id=run, device=str(rank), step=step + k, loss=2.0, learning_rate=1e-4, grad_norm=1.0,
                          time=clock[0]) for k in range(10)]
        events = []
        if i % 4 == 0:
            sev = Severity.ERROR if i % 64 == 0 else Severity.WARNING
            rule = "grad_norm" if sev is Severity.WARNING else f"loss_spike_{i}"
            events = [Event(run_id=run, device=str(rank), step=step, time=clock[0], rule=rule, severity=sev,
                            status=Status.FIRING, value=3.0, threshold=2.0, message="grad norm 3 over 2")]
        return encode(Envelope(run_id=run, device=str(rank), sent_at=clock[0], project="p", rank=rank,
                               samples=samples, events=events))

    def one_envelope(raw: bytes) -> None:
        env = msgspec.json.decode(raw, type=Envelope)
        ingest.envelope(env, raw) if old else ingest.envelope(env)

    for i in range(RUNS * RANKS):  # every run and rank known before the measured part
        one_envelope(body(i))
    if arm == "envelope":
        bodies = [body(RUNS * RANKS + i) for i in range(units)]
        for raw in bodies:
            clock[0] += 0.01
            one_envelope(raw)
    else:
        for i in range(units):
            clock[0] += 1.0
            service.submit(f"save-checkpoint run-{i % RUNS}", Origin(source="cli", user="cli:ana"))
            for rank in range(RANKS):
                jobs.poll(state, f"run-{i % RUNS}", str(rank), 0)
    shutil.rmtree(tmp, ignore_errors=True)


def instructions(tree: str, arm: str, units: int) -> int:
    with tempfile.TemporaryDirectory() as out:
        cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}/cg.out", sys.executable,
               os.path.abspath(__file__), "--child", arm, str(units), "--tree", tree]
        env = {**os.environ, "PYTHONHASHSEED": "0"}  # the same hashes, so the same work, in every run
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=tree, env=env)
        found = re.search(r"Collected : (\d+)", done.stderr)
        if done.returncode or not found:
            raise SystemExit(f"{arm} in {tree} failed:\n{done.stderr[-3000:]}")
        return int(found.group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", default="b97e5d3", help="the commit before the change (a git worktree of it)")
    ap.add_argument("--arm", choices=["envelope", "command"], action="append", help="only these (default: both)")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--tree", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:  # one arm in the tree measured, under callgrind
        sys.path.insert(0, args.tree)
        child(args.child[0], int(args.child[1]))
        return
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed: apt-get install valgrind")
    old = os.path.join(tempfile.gettempdir(), f"msmon-before-{args.before}")
    if not os.path.isdir(old):
        subprocess.run(["git", "worktree", "add", "-f", old, args.before], cwd=HERE, check=True, capture_output=True)
    plan = {"envelope": (200, 1000), "command": (10, 50)}
    print(f"Instructions per unit (callgrind; before = {args.before}, after = the working tree):")
    print(f"{'arm':<10} {'before':>12} {'after':>12} {'after/before':>13}")
    for arm, (lo, hi) in plan.items():
        if args.arm and arm not in args.arm:
            continue
        per = {}
        for name, tree in (("before", old), ("after", HERE)):
            per[name] = (instructions(tree, arm, hi) - instructions(tree, arm, lo)) / (hi - lo)
        print(f"{arm:<10} {per['before']:>12,.0f} {per['after']:>12,.0f} {per['after'] / per['before']:>13.2f}")


if __name__ == "__main__":
    main()
