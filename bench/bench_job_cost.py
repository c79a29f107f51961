"""What recording one training step costs the training process, in CPU instructions (valgrind's callgrind),
msmon beside the loggers a job would otherwise use, all in one run.

    .venv/bin/python bench/bench_job_cost.py [--steps 500,2500] [--peers-python /tmp/msmon-peers/bin/python]

Every arm runs the same loop in a fresh process under `valgrind --tool=callgrind` (the training process
only: a logger's own service process, as wandb's, is not counted): loss, LR, grad norm and throughput
recorded at every step. The process's instructions at the two step counts are differenced, so imports,
start-up and the final flush cancel out, and divided by the difference in steps: instructions per
recorded step. The loop alone (the synthetic metrics, no logger) is measured too and taken out of every
arm. Timings on a shared 2-core VM swing by tens of percent from run to run; instruction counts do not.

Arms (the first group is msmon's Monitor.step, all 12 rules on, step_interval 1):
  msmon rules           outputs off
  msmon + CSV           the CSV sink
  msmon + TensorBoard   the TensorBoard sink
  msmon + log lines     a log line every step (log_interval 1; the default is 100), to a handler that
                        formats it and writes it to /dev/null
  msmon all outputs     CSV + TensorBoard + a log line every step
  msmon all, log every 100th  CSV + TensorBoard + log lines at the default log_interval 100
  tensorboardX direct   SummaryWriter.add_scalar for the 4 scalars
  wandb offline         wandb.init(mode="offline"); wandb.log({4 scalars}, step=i)
  swanlab local         swanlab.init(mode="local"); swanlab.log({4 scalars}, step=i)
With --per-rule, also msmon with alerting off and each rule alone (outputs off): a rule's arm minus the
alerting-off arm is what that rule costs a step, plus the ~2k every rule shares (the alert loop's set-up).
The peers run with --peers-python (a virtual environment with wandb, swanlab and tensorboardX
installed: `python -m venv /tmp/msmon-peers && /tmp/msmon-peers/bin/pip install wandb swanlab
tensorboardX`); a peer that does not import there is reported as such. tensorboardX runs in the
project's venv too (msmon's tests read TensorBoard files back with it installed).

Needs valgrind (Debian: `apt-get install valgrind`). About 10 minutes on 2 cores with the peers.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

BUDGET = 300_000  # the goal for msmon with every output on, instructions per recorded step

MSMON_ARMS = {
    "msmon rules": dict(csv=False, tb=False, log=0),
    "msmon + CSV": dict(csv=True, tb=False, log=0),
    "msmon + TensorBoard": dict(csv=False, tb=True, log=0),
    "msmon + log lines": dict(csv=False, tb=False, log=1),
    "msmon all outputs": dict(csv=True, tb=True, log=1),
    "msmon all, log every 100th": dict(csv=True, tb=True, log=100),
}
PEER_ARMS = ("tensorboardX direct", "wandb offline", "swanlab local")


def rule_names() -> list[str]:
    """msmon's rules, imported only where msmon runs: the peers' arms run in a Python without msmon's dependencies
    (importing them at the top made every peer arm fail: no msgspec there)."""
    from msmon.core.detectors import RULES

    return list(RULES)


def rule_arms() -> tuple[str, ...]:
    """--per-rule: msmon with alerting off, then each rule alone (outputs off): what each rule costs a step."""
    return ("msmon alerting off", *(f"rule {name}" for name in rule_names()))


# -- the child: one arm, one step count, run under callgrind ---------------------------------------------

def metrics(i: int) -> tuple[float, float, float, float]:
    """A healthy run's numbers at step i, the same for every arm (no random module: nothing to seed)."""
    loss = 2.0 + 3.0 * (i + 10) ** -0.3 + 0.03 * math.sin(i * 0.7)
    lr = 3e-4 * min(1.0, (i + 1) / 500)
    grad = 1.0 + 0.1 * math.sin(i * 1.3)
    return loss, lr, grad, 4096.0


def child(arm: str, steps: int, out: str) -> None:
    t = 1_700_000_000.0
    if arm == "loop":
        for i in range(steps):
            loss, lr, grad, tokens = metrics(i)
            t += 0.2
        return
    if arm.startswith(("msmon", "rule ")):
        import logging

        from notifier import Monitor

        opts = MSMON_ARMS.get(arm, dict(csv=False, tb=False, log=0))
        log = logging.getLogger("msmon")
        log.setLevel(logging.INFO)
        log.propagate = False
        handler = logging.StreamHandler(open(os.devnull, "w"))  # noqa: SIM115 - the process's life
        handler.setFormatter(logging.Formatter("%(asctime)s msmon %(levelname)s %(message)s"))
        log.addHandler(handler)
        cfg = {"monitor_config": {
            "monitor_on": True, "step_interval": 1, "log_interval": opts["log"],
            "alert": {"grad_norm_threshold": 10.0, "baseline_steps": 100},
            "training": {"total_steps": 100_000, "warmup_steps": 500, "target_loss": 2.1},
            "csv": {"enable": opts["csv"], "path": os.path.join(out, "{run_id}.csv")},
            "tensorboard": {"enable": opts["tb"], "log_dir": os.path.join(out, "tb")},
        }}
        if arm == "msmon alerting off":
            cfg["monitor_config"]["alert"]["enable"] = False
        elif arm.startswith("rule "):
            cfg["monitor_config"]["alert"]["rules"] = {r: {"enable": f"rule {r}" == arm} for r in rule_names()}
        mon = Monitor(cfg, "bench")
        step = mon.step
        for i in range(steps):
            loss, lr, grad, tokens = metrics(i)
            t += 0.2
            step(i, loss=loss, lr=lr, grad_norm=grad, tokens=tokens, time=t)
        mon.close()
        return
    if arm == "tensorboardX direct":
        from tensorboardX import SummaryWriter

        w = SummaryWriter(logdir=os.path.join(out, "tbx"), flush_secs=5)
        for i in range(steps):
            loss, lr, grad, tokens = metrics(i)
            t += 0.2
            w.add_scalar("train/loss", loss, i, walltime=t)
            w.add_scalar("train/learning_rate", lr, i, walltime=t)
            w.add_scalar("train/grad_norm", grad, i, walltime=t)
            w.add_scalar("throughput/tokens_per_s", tokens / 0.2, i, walltime=t)
        w.close()
        return
    if arm == "wandb offline":
        os.environ.update(WANDB_MODE="offline", WANDB_SILENT="true", WANDB_DIR=out)
        import wandb  # type: ignore[import-not-found]

        run = wandb.init(project="bench", mode="offline", dir=out)
        for i in range(steps):
            loss, lr, grad, tokens = metrics(i)
            t += 0.2
            run.log({"loss": loss, "lr": lr, "grad_norm": grad, "tokens_per_s": tokens / 0.2}, step=i)
        run.finish()
        return
    if arm == "swanlab local":
        import swanlab  # type: ignore[import-not-found]

        swanlab.init(project="bench", mode="local", log_dir=out)
        for i in range(steps):
            loss, lr, grad, tokens = metrics(i)
            t += 0.2
            swanlab.log({"loss": loss, "lr": lr, "grad_norm": grad, "tokens_per_s": tokens / 0.2}, step=i)
        swanlab.finish()
        return
    raise SystemExit(f"unknown arm {arm!r}")


# -- the parent: callgrind per arm and step count ---------------------------------------------------------

def instructions(python: str, arm: str, steps: int) -> int | str:
    """The process's instructions (callgrind's 'Collected'), or why there are none."""
    out = tempfile.mkdtemp(prefix="msmon-cost-")
    try:
        cmd = ["valgrind", "--tool=callgrind", "--trace-children=no", f"--callgrind-out-file={out}/cg.out",
               python, os.path.abspath(__file__), "--child", arm, "--steps", str(steps), "--out", out]
        env = dict(os.environ, PYTHONHASHSEED="0", PYTHONDONTWRITEBYTECODE="1")
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
        first = re.search(r"==(\d+)==", p.stderr)  # the training process (a child it forks reports its own)
        found = first and re.search(rf"=={first.group(1)}== Collected : (\d+)", p.stderr)
        if p.returncode != 0 or not found:
            last = (p.stderr.strip().splitlines() or ["?"])[-1]
            return f"failed ({last[:120]})"
        return int(found.group(1))
    finally:
        shutil.rmtree(out, ignore_errors=True)


def imports(python: str, module: str) -> bool:
    return subprocess.run([python, "-c", f"import {module}"], capture_output=True).returncode == 0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", default="500,2500", help="the two step counts to difference")
    ap.add_argument("--peers-python", default="/tmp/msmon-peers/bin/python")
    ap.add_argument("--arms", default="", help="subset of the arms, separated by semicolons")
    ap.add_argument("--per-rule", action="store_true",
                    help="also msmon with alerting off and each rule alone (a rule's cost: its arm minus alerting off)")
    ap.add_argument("--jobs", type=int, default=2, help="callgrind processes at once")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, int(args.steps), args.out)
        return
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed: apt-get install valgrind")
    lo, hi = (int(x) for x in args.steps.split(","))
    ours = sys.executable
    peers = args.peers_python if os.path.exists(args.peers_python) else ""
    plan: dict[str, tuple[str, str]] = {"loop": (ours, "")}
    plan.update({arm: (ours, "") for arm in MSMON_ARMS})
    if args.per_rule:
        plan.update({arm: (ours, "") for arm in rule_arms()})
    for arm, module in zip(PEER_ARMS, ("tensorboardX", "wandb", "swanlab"), strict=True):
        python = ours if arm == "tensorboardX direct" else peers
        if not python or not imports(python, module):
            plan[arm] = ("", f"not measured: {module} does not import in {python or args.peers_python}")
        else:
            plan[arm] = (python, "")
    if args.arms:
        keep = {"loop", *args.arms.split(";")}
        plan = {k: v for k, v in plan.items() if k in keep}
    jobs = [(arm, n) for arm, (py, why) in plan.items() if not why for n in (lo, hi)]
    with ThreadPoolExecutor(args.jobs) as pool:
        got = dict(zip(jobs, pool.map(lambda j: instructions(plan[j[0]][0], *j), jobs), strict=True))
    print(f"Instructions per recorded step in the training process (callgrind; {lo:,} vs {hi:,} steps "
          f"differenced; loss, LR, grad norm, throughput at every step; Python {sys.version.split()[0]})")
    loop = got[("loop", lo)], got[("loop", hi)]
    if isinstance(loop[0], str) or isinstance(loop[1], str):
        raise SystemExit(f"the bare loop failed: {loop}")
    per_loop = (loop[1] - loop[0]) / (hi - lo)
    print(f"{'the loop alone (taken out below)':<34} {per_loop:>12,.0f}")
    for arm, (_, why) in plan.items():
        if arm == "loop":
            continue
        if why:
            print(f"{arm:<34} {why}")
            continue
        a, b = got[(arm, lo)], got[(arm, hi)]
        if isinstance(a, str) or isinstance(b, str):
            print(f"{arm:<34} {a if isinstance(a, str) else b}")
            continue
        per = (b - a) / (hi - lo) - per_loop
        note = ""
        if arm == "msmon all outputs":
            note = f"  goal <= {BUDGET:,}: {'met' if per <= BUDGET else 'NOT met'}"
        print(f"{arm:<34} {per:>12,.0f}{note}")


if __name__ == "__main__":
    main()
