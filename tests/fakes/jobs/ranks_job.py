"""A data-parallel MindSpore job on the CPU (started by msrun) whose ranks misbehave on request, for the
bot's cross-rank rules (tests/e2e/test_ranks_msrun.py).

Environment: MSMON_BOT_URL, MSMON_JOB_TOKEN, MSMON_SPOOL_DIR (as tests/fakes/jobs/data_parallel_job.py),
and the knobs:

- MSMON_RANKS_RUN: the run id (default ranks-run); MSMON_RANKS_STEPS: steps per rank (default 400);
  MSMON_RANKS_INTERVAL: step_interval (default 5);
- MSMON_RANKS_SLOW=RANK:SECONDS: that rank's data pipeline sleeps SECONDS per batch (a slow loader or disk);
- MSMON_RANKS_BAD=RANK: that rank's shard is corrupted (its labels are noise: a bad shard, its loss apart);
- MSMON_RANKS_NAN_STEP=N: every rank's labels are NaN from its N-th batch (a NaN on every rank);
- MSMON_RANKS_PID_DIR: each rank writes its pid to rank_<N>.pid there (so a test can stop or kill one);
- MSMON_RANKS_MODE=pynative: PyNative mode (default: graph mode);
- MSMON_RANKS_PACE=SECONDS: every rank sleeps that long after each step (a run long enough to be watched).

Gradients are averaged across ranks (every step is a collective), as in a real data-parallel job.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))

import mindspore as ms  # noqa: E402
import mindspore.dataset as ds  # noqa: E402
import numpy as np  # noqa: E402
from mindspore.communication import get_group_size, get_rank, init  # noqa: E402

from notifier.mindspore import MonitorCallback  # noqa: E402
from notifier.mindspore.toy import model, regression_data  # noqa: E402


def _pair(name: str) -> tuple[int, float]:
    value = os.environ.get(name, "")
    if not value:
        return -1, 0.0
    rank, amount = value.split(":")
    return int(rank), float(amount)


class Pace(ms.train.Callback):  # type: ignore[misc]
    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def on_train_step_end(self, run_context):  # noqa: ANN001, ANN201
        time.sleep(self.seconds)


class Batches:
    """Random-access batches (what sharding needs), with this rank's misbehaviour from the knobs."""

    def __init__(self, steps: int, rank: int, batch: int = 64) -> None:
        self.x, self.y = regression_data()
        self.steps, self.batch, self.n = steps, batch, len(self.x) // batch
        slow_rank, self.sleep = _pair("MSMON_RANKS_SLOW")
        if slow_rank != rank:
            self.sleep = 0.0
        self.bad = os.environ.get("MSMON_RANKS_BAD", "") == str(rank)
        self.nan_from = int(os.environ.get("MSMON_RANKS_NAN_STEP") or 0)
        self.taken = 0

    def __getitem__(self, i: int):  # noqa: ANN204
        b = i % self.n
        x, y = self.x[b * self.batch:(b + 1) * self.batch], self.y[b * self.batch:(b + 1) * self.batch]
        self.taken += 1
        if self.sleep:
            time.sleep(self.sleep)
        if self.bad:
            y = np.random.default_rng(i).standard_normal(y.shape).astype(np.float32) * 3.0
        if self.nan_from and self.taken >= self.nan_from:
            y = np.full_like(y, np.nan)
        return x, y

    def __len__(self) -> int:
        return self.steps


def main() -> None:
    pynative = os.environ.get("MSMON_RANKS_MODE") == "pynative"
    ms.set_context(mode=ms.PYNATIVE_MODE if pynative else ms.GRAPH_MODE, device_target="CPU")
    init()
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    rank, size = get_rank(), get_group_size()
    pid_dir = os.environ.get("MSMON_RANKS_PID_DIR")
    if pid_dir:
        with open(os.path.join(pid_dir, f"rank_{rank}.pid"), "w") as f:
            f.write(str(os.getpid()))
    steps = int(os.environ.get("MSMON_RANKS_STEPS") or 400)
    data = ds.GeneratorDataset(Batches(steps * size, rank), column_names=["x", "y"], shuffle=False,
                               num_shards=size, shard_id=rank)
    m, _, _ = model(lr=0.02)
    cfg = {"monitor_config": {"monitor_on": True, "step_interval": int(os.environ.get("MSMON_RANKS_INTERVAL") or 5),
                              "log_interval": 0, "bot": {
                                  "url": os.environ["MSMON_BOT_URL"], "token_env": "MSMON_JOB_TOKEN",
                                  "heartbeat_interval": 0.5, "spool_dir": os.environ["MSMON_SPOOL_DIR"]}}}
    cb = MonitorCallback(cfg, run_id=os.environ.get("MSMON_RANKS_RUN") or "ranks-run", device=rank)
    pace = float(os.environ.get("MSMON_RANKS_PACE") or 0)
    m.train(1, data, callbacks=[Pace(pace), cb] if pace else [cb], dataset_sink_mode=False)
    print(f"rank {rank} finished at step {cb.control.last_step}", flush=True)


if __name__ == "__main__":
    main()
