"""A 2-rank data-parallel MindSpore job on the CPU (started by msrun), reporting to an msmon bot.

Environment: MSMON_BOT_URL, MSMON_JOB_TOKEN, MSMON_CKPT_DIR, MSMON_SPOOL_DIR. Trains the toy
regression with gradients averaged across ranks; every step is a collective, so a command applied
on one rank only would hang the other.

Knobs (tests/e2e/test_rank_actions.py): MSMON_DP_ACTIONS, monitor_config `actions:` as JSON (an
empty MSMON_BOT_URL: no bot at all); MSMON_DP_SPIKE=RANK:STEP:COUNT, that rank's labels shifted by 3 for
COUNT steps from STEP (a bad shard: a loss spike on that rank only); MSMON_DP_CSV, a folder for each rank's
CSV of samples (`dp-run-<rank>.csv`)."""

from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))

import mindspore as ms  # noqa: E402
import mindspore.dataset as ds  # noqa: E402
from mindspore.communication import get_group_size, get_rank, init  # noqa: E402

from notifier.mindspore import MonitorCallback  # noqa: E402
from notifier.mindspore.toy import model, regression_data  # noqa: E402


class Batches:
    """Random-access batches (what sharding needs): index i -> batch i % n of the data."""

    def __init__(self, steps: int, batch: int = 128, rank: int = 0) -> None:
        self.x, self.y = regression_data()
        self.steps, self.batch, self.n = steps, batch, len(self.x) // batch
        spike = os.environ.get("MSMON_DP_SPIKE", "")
        at_rank, self.spike_from, count = (int(v) for v in spike.split(":")) if spike else (-1, 0, 0)
        self.spike_to = self.spike_from + count if at_rank == rank else -1
        self.taken = 0  # batches this rank's shard has read: the k-th is step k's (one worker, in order)

    def __getitem__(self, i: int):  # noqa: ANN204
        b = i % self.n
        x, y = self.x[b * self.batch:(b + 1) * self.batch], self.y[b * self.batch:(b + 1) * self.batch]
        self.taken += 1
        if self.spike_from <= self.taken < self.spike_to:
            y = y + 3.0
        return x, y

    def __len__(self) -> int:
        return self.steps


class Pace(ms.train.Callback):
    def on_train_step_end(self, run_context):  # noqa: ANN001, ANN201
        time.sleep(0.01)


def main() -> None:
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    init()
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    rank, size = get_rank(), get_group_size()
    data = ds.GeneratorDataset(Batches(2 * 4000, rank=rank), column_names=["x", "y"], shuffle=False,
                               num_shards=size, shard_id=rank)
    m, _, _ = model(lr=0.02)
    cfg: dict = {"monitor_config": {"monitor_on": True, "step_interval": 1, "log_interval": 0, "bot": {
        "url": os.environ["MSMON_BOT_URL"], "token_env": "MSMON_JOB_TOKEN", "heartbeat_interval": 0.5,
        "spool_dir": os.environ["MSMON_SPOOL_DIR"]}}}
    if not os.environ["MSMON_BOT_URL"]:
        del cfg["monitor_config"]["bot"]
    if os.environ.get("MSMON_DP_CSV"):
        cfg["monitor_config"]["csv"] = {"enable": True,
                                        "path": os.path.join(os.environ["MSMON_DP_CSV"], "{run_id}-{device}.csv")}
    actions = json.loads(os.environ.get("MSMON_DP_ACTIONS") or "[]")
    if actions:
        cfg["monitor_config"]["actions"] = actions
        cfg["monitor_config"]["alert"] = {"rules": {"loss_spike": {"consecutive": 1}}}
    cb = MonitorCallback(cfg, run_id="dp-run", device=rank, checkpoint_dir=os.environ["MSMON_CKPT_DIR"])
    m.train(1, data, callbacks=[Pace(), cb], dataset_sink_mode=False)
    print(f"rank {rank} finished at step {cb.control.last_step}", flush=True)


if __name__ == "__main__":
    main()
