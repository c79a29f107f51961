"""Reading MindFormers text logs against msmon's CSV of the same steps, in one run (README "Offline analysis").

    .venv/bin/python bench/bench_mindformers.py [--steps 100000]

The same synthetic run (tests/fakes/analysis_data.py) is written as msmon's CSV and as a MindFormers
msrun worker log (MFLossMonitor's current lines with their progress lines, tests/fakes/mindformers_logs.py);
each is read alone and read + replayed through the full Monitor. Ratios are MindFormers / CSV.

    .venv/bin/python bench/bench_mindformers.py --cost [--python .venv-mf21/bin/python] [--steps 100,500]

What a training step inside MindFormers' Trainer costs the training process on the host, in CPU instructions
(valgrind's callgrind, counting only the steps: instrumentation is turned on after the imports), for MindFormers'
own per-step callback (MFLossMonitor: the log line, a bare MindFormers run's host work per step besides the
compute) and for msmon's (MsmonCallback, built as MindFormers builds it from a callbacks entry: the 5-tuple's five
host reads, Monitor.step with every rule, step_interval 1). Each arm drives the callbacks' hooks with a MindSpore
RunContext whose net_outputs are real MindSpore tensors of MFTrainOneStepCell's 5-tuple (loss, overflow, loss
scale, LR, grad norm), in a fresh process under callgrind: after 10 warm-up steps, `lo` steps, a dump, then
`hi - lo` steps counted alone. The loop alone is taken out. The graph's own step (the compute, the same with or
without a callback) is not in these figures. Needs valgrind and the MindFormers venv (.venv-mf21, which make test
builds).
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

ROOT = Path(__file__).resolve().parents[1]
T = TypeVar("T")
sys.path.insert(0, str(ROOT))

from msmon.offline.readers import read_log  # noqa: E402
from msmon.offline.replay import run_replay  # noqa: E402
from tests.fakes import analysis_data as data  # noqa: E402
from tests.fakes import mindformers_logs as mfl  # noqa: E402


def timed(fn: Callable[[], T]) -> tuple[T, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def rates(path: str) -> tuple[float, float]:
    """(rows/s read alone, rows/s read + replayed)."""
    cfg = {"monitor_config": {"monitor_on": True, "log_interval": 0}}
    n, read_s = timed(lambda: sum(1 for _ in read_log(path)))
    result, replay_s = timed(lambda: run_replay(path, cfg))
    assert result.rows == n
    return n / read_s, n / replay_s


# -- --cost: a step's host cost inside MindFormers' Trainer, in instructions -----------------------------------

COST_ARMS = ("loop", "mindformers", "msmon")


def cost_child(arm: str, steps: int, lo: int) -> None:
    """One arm (runs in the MindFormers venv, under callgrind with instrumentation off until the parent turns it
    on): 10 steps of the callbacks' hooks on real 5-tuples, then `lo` steps, then `steps - lo` more, the parent
    dumping callgrind's counts between them."""
    import math

    import mindspore as ms
    import numpy as np
    from mindspore.train.callback._callback import InternalCallbackParam, RunContext

    callbacks = []
    if "mindformers" in arm:
        from mindformers.core.callback import MFLossMonitor

        mf = MFLossMonitor(per_print_times=1, origin_epochs=1, dataset_size=steps, global_batch_size=4)
        mf.mf_support, mf.mf_calculated = False, True  # the one-off FLOPs count needs the compiled network
        callbacks.append(mf)
    if "msmon" in arm:
        from notifier.mindformers import MsmonCallback

        callbacks.append(MsmonCallback(run_id="bench", log_interval=0))
    rng = np.random.default_rng(0)
    outputs = [(ms.Tensor(np.float32(5.5 - 0.01 * i + 0.05 * rng.standard_normal())), ms.Tensor(False),
                ms.Tensor(np.float32(1.0)), ms.Tensor(np.float32(1e-3 * (0.55 + 0.45 * math.cos(i / 64)))),
                ms.Tensor(np.array([1.3 + 0.1 * rng.standard_normal()], np.float32))) for i in range(64)]
    cb = InternalCallbackParam()
    cb.update(train_network=None, optimizer=None, train_dataset=None, dataset_sink_mode=False, batch_num=steps,
              epoch_num=1, cur_epoch_num=1, initial_step=0, cur_step_num=0, net_outputs=None, mode="train",
              train_dataset_element=(ms.Tensor(np.zeros((4, 33), np.int32)),))
    ctx = RunContext(cb)
    for c in callbacks:
        c.on_train_begin(ctx)
        c.on_train_epoch_begin(ctx)

    def run(first: int, last: int) -> None:
        for step in range(first, last + 1):
            cb.cur_step_num = step
            for c in callbacks:
                c.on_train_step_begin(ctx)
            cb.net_outputs = outputs[step % 64]
            for c in callbacks:
                c.on_train_step_end(ctx)

    run(1, 10)  # first-step work (MindFormers' first line, msmon's first sample) before anything is counted
    for mark, (first, last) in (("lo", (11, 10 + lo)), ("hi", (11 + lo, 10 + steps))):
        wait(f"go-{mark}")  # the parent has turned instrumentation on / dumped the counts so far
        run(first, last)
        print(mark, flush=True)
    wait("go-end")
    for c in callbacks:
        c.on_train_end(ctx)


def wait(name: str) -> None:
    """Poll for the parent's file `name` in the working directory: callgrind takes callgrind_control's commands
    only while the process runs code, so this does not block in a read."""
    import os
    import time

    print(f"wait {name} {os.getpid()}", flush=True)
    while not os.path.exists(name):
        time.sleep(0.02)


def cost(python: str, lo: int, hi: int, jobs: int) -> None:
    import os
    import re
    import shutil
    import subprocess
    from concurrent.futures import ThreadPoolExecutor

    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed: apt-get install valgrind")

    def instructions(arm: str) -> int | str:
        """The instructions of the hi - lo steps (the second part callgrind dumps), or why there are none."""
        out = tempfile.mkdtemp(prefix="msmon-mfcost-")
        try:
            cmd = ["valgrind", "--tool=callgrind", "--trace-children=no", "--instr-atstart=no",
                   f"--callgrind-out-file={out}/cg.out", python, __file__, "--cost-child", arm, "--steps",
                   f"{lo},{hi}"]
            env = dict(os.environ, PYTHONHASHSEED="0", PYTHONDONTWRITEBYTECODE="1", PYTHONPATH=str(ROOT))
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=out)
            assert p.stdout is not None
            for line in p.stdout:
                word = line.split()
                if word[:1] == ["wait"]:
                    name, pid = word[1], word[2]
                    action = {"go-lo": "-i on", "go-hi": "-d", "go-end": "-d"}[name]
                    subprocess.run(["callgrind_control", *action.split(), pid], capture_output=True, timeout=3600)
                    Path(out, name).touch()
            err = p.stderr.read() if p.stderr else ""
            if p.wait() != 0:
                return f"failed ({(err.strip().splitlines() or ['?'])[-1][:160]})"
            parts = sorted(Path(out).glob("cg.out.*"), key=lambda f: int(f.name.rsplit(".", 1)[1]))
            totals = []
            for f in parts:
                m = re.search(r"^(?:totals|summary): (\d+)", f.read_text(), re.M)
                if m:
                    totals.append(int(m.group(1)))
            return totals[1] if len(totals) >= 2 else f"failed (dumps: {totals})"
        finally:
            shutil.rmtree(out, ignore_errors=True)

    with ThreadPoolExecutor(jobs) as pool:
        got = dict(zip(COST_ARMS, pool.map(instructions, COST_ARMS), strict=True))
    print(f"Instructions per step of the callbacks' hooks, in the training process (callgrind, counting steps "
          f"{lo + 11:,}-{hi + 10:,} only; {python})")
    per: dict[str, float] = {}
    for arm in COST_ARMS:
        n = got[arm]
        if isinstance(n, str):
            print(f"{arm:<22} {n}")
            continue
        per[arm] = n / (hi - lo)
    loop = per.get("loop")
    for arm, v in per.items():
        extra = "" if arm == "loop" or loop is None else f"   less the loop: {v - loop:>12,.0f}"
        print(f"{arm:<22} {v:>12,.0f}{extra}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", default=None)
    p.add_argument("--cost", action="store_true", help="a step's host cost inside MindFormers' Trainer (callgrind)")
    p.add_argument("--python", default=str(ROOT / ".venv-mf21" / "bin" / "python"), help="the MindFormers venv's")
    p.add_argument("--jobs", type=int, default=2, help="callgrind processes at once")
    p.add_argument("--cost-child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.cost_child:
        lo, hi = (int(x) for x in args.steps.split(","))
        cost_child(args.cost_child, hi, lo)
        return
    if args.cost:
        lo, hi = (int(x) for x in (args.steps or "100,500").split(","))
        cost(args.python, lo, hi, max(1, min(args.jobs, len(COST_ARMS))))
        return
    args.steps = int(args.steps or 100_000)
    logging.getLogger("msmon").setLevel(logging.CRITICAL)  # the Monitor's start-up summary, once per replay
    records = data.run(args.steps, seed=5)
    with tempfile.TemporaryDirectory() as tmp:
        csv_path = data.write_csv(Path(tmp) / "run.csv", records)
        lines = mfl.current_lines(mfl.steps_from(records), steps_per_epoch=args.steps, epochs=1, between=mfl.NOISE)
        log = mfl.write(Path(tmp) / "msrun_log" / "worker_0.log", lines)
        got = {name: rates(path) for name, path in (("csv", csv_path), ("mindformers", log))}
    for name, (read, replay) in got.items():
        print(f"{name:12} {args.steps:,} rows: read {read:,.0f} rows/s; read + replay {replay:,.0f} rows/s")
    (cr, cp), (mr, mp) = got["csv"], got["mindformers"]
    print(f"mindformers / csv: read {mr / cr:.2f}x, read + replay {mp / cp:.2f}x")


if __name__ == "__main__":
    main()
