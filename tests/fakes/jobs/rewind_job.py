"""A MindSpore job with an injected fault, for rewind (tests/notifier/mindspore/test_rewind.py, bench/bench_rewind.py):
single process, or several ranks under msrun (data parallel, gradients averaged every step).

The toy regression (notifier/mindspore/toy.py) through msmon's train cell, with each batch's index as a third
column (the loss cell ignores it), so the job records which batches each step trained on.

Environment:
- MSMON_RW_OUT: a folder; each rank writes rank_<N>.json there at the end: `losses` [[step, loss], ...],
  `batches` [[step, batch index], ...] (the batch each step trained on), `results` (every ActionResult), `ring`,
  `weights` (the sha256 of every parameter of the train network at the end: weights, optimizer state, clip norm);
- MSMON_RW_STEPS: batches in the dataset (default 700); MSMON_RW_PACE: seconds slept after each step;
- MSMON_RW_FAULT: `batches:START:COUNT:SCALE` (batches START..START+COUNT-1 have their inputs multiplied by SCALE:
  a burst of bad data) or `lr:START:COUNT:FACTOR` (the LR multiplied by FACTOR for MindSpore's steps START..
  START+COUNT-1, then put back);
- MSMON_RW_ACTIONS: monitor_config `actions:` as JSON (e.g. a rewind on a loss_spike ERROR);
- MSMON_RW_REWIND_AT=STEP[:PARAMS-JSON]: the job asks for a rewind from code at that step (an operator's command
  without a bot); MSMON_RW_PAUSE_AT=STEP: the job pauses itself at that step and asks for a rewind while paused,
  skipping 100 batches, then a resume;
- MSMON_RW_ASK: a JSON list of [STEP, ACTION, PARAMS]: the job asks for each action from code at that step, on every
  rank (so every rank applies it at the next step boundary, as a chat command's apply step does);
- MSMON_RW_CORRUPT=RANK:KIND:CKPT:STEP: at step STEP, rank RANK damages its ring checkpoint of step CKPT (KIND:
  truncated, zero, random, missing or flipped, one byte in the middle);
- MSMON_RW_DUMP=STEP: the train network's parameters are written to dump_<STEP>.npz at that step, and to
  dump_rewound.npz right after a rewind (what the checkpoints are compared with, bit for bit);
- MSMON_RW_RING: checkpoint_ring as JSON (default every 50 steps, keep 5); MSMON_RW_REWIND: rewind as JSON;
- MSMON_BOT_URL, MSMON_JOB_TOKEN, MSMON_SPOOL_DIR: a bot (multi-rank rule actions go through it); MSMON_RW_RUN.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))

import mindspore as ms  # noqa: E402
import mindspore.dataset as ds  # noqa: E402
import numpy as np  # noqa: E402
from mindspore import nn, ops  # noqa: E402

from notifier.mindspore import MonitorCallback, TrainStepWithGradNorm  # noqa: E402
from notifier.mindspore.toy import MLP, regression_data  # noqa: E402

BATCH = 64


class Batches:
    """Random-access batches cycling through the data; index i is batch i (a fault's batches scaled)."""

    def __init__(self, steps: int) -> None:
        self.x, self.y = regression_data()
        self.steps, self.n = steps, len(self.x) // BATCH
        fault = os.environ.get("MSMON_RW_FAULT", "")
        kind, *rest = fault.split(":") if fault else ("", "0", "0", "1")
        self.bad = (int(rest[0]), int(rest[0]) + int(rest[1]), float(rest[2])) if kind == "batches" else None

    def __getitem__(self, i: int):  # noqa: ANN204
        i = int(i)
        b = i % self.n
        x = self.x[b * BATCH:(b + 1) * BATCH]
        if self.bad is not None and self.bad[0] <= i < self.bad[1]:
            x = x * np.float32(self.bad[2])
        return x, self.y[b * BATCH:(b + 1) * BATCH], np.array(i, np.int32)

    def __len__(self) -> int:
        return self.steps


class IndexedLoss(nn.Cell):  # type: ignore[misc]
    def __init__(self, net: nn.Cell) -> None:
        super().__init__()
        self.net, self.loss = net, nn.MSELoss()

    def construct(self, x, y, index):  # noqa: ANN001, ANN201, ARG002
        return self.loss(self.net(x), y)


class Record(ms.train.Callback):  # type: ignore[misc]
    """Which batch each step trained on, the loss, and the LR fault; before msmon's callback in the list (so a
    rewind applied at this step's boundary has not renumbered it yet)."""

    def __init__(self, mon: MonitorCallback, opt: nn.Optimizer) -> None:
        self.mon, self.opt = mon, opt
        self.losses: list[list[float]] = []
        self.batches: list[list[int]] = []
        fault = os.environ.get("MSMON_RW_FAULT", "")
        kind, *rest = fault.split(":") if fault else ("", "0", "0", "1")
        self.lr = (int(rest[0]), int(rest[0]) + int(rest[1]), float(rest[2])) if kind == "lr" else None
        self._base: float | None = None
        self.pace = float(os.environ.get("MSMON_RW_PACE", "0") or 0)
        self._index = -1

    def on_train_step_begin(self, run_context):  # noqa: ANN001, ANN201
        cb = run_context.original_args()
        self._index = int(cb.train_dataset_element[2].asnumpy())
        if self.lr is not None:
            n = int(cb.cur_step_num)
            lr = self.opt.learning_rate
            if n == self.lr[0]:
                self._base = float(lr.asnumpy())
                ops.assign(lr, ms.Tensor(self._base * self.lr[2], ms.float32))
            elif n == self.lr[1] and self._base is not None:
                ops.assign(lr, ms.Tensor(self._base, ms.float32))

    def on_train_step_end(self, run_context):  # noqa: ANN001, ANN201
        step = self.mon._last_step + 1  # msmon's number for this step (renumbered after a rewind)
        out = run_context.original_args().net_outputs
        self.losses.append([step, float(out[0].asnumpy())])
        self.batches.append([step, self._index])
        if self.pace:
            time.sleep(self.pace)


def main() -> None:
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    multi = "MS_WORKER_NUM" in os.environ or "RANK_SIZE" in os.environ
    rank, size = 0, 1
    if multi:
        from mindspore.communication import get_group_size, get_rank, init

        init()
        ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
        rank, size = get_rank(), get_group_size()
    steps = int(os.environ.get("MSMON_RW_STEPS", "700"))
    data = ds.GeneratorDataset(Batches(steps * size), column_names=["x", "y", "index"], shuffle=False,
                               num_shards=size if multi else None, shard_id=rank if multi else None)
    ms.set_seed(1)
    net = MLP()
    opt = nn.SGD(net.trainable_params(), learning_rate=0.05)
    model = ms.Model(TrainStepWithGradNorm(IndexedLoss(net), opt))
    out = os.environ["MSMON_RW_OUT"]
    ring = json.loads(os.environ.get("MSMON_RW_RING") or "{}")
    mc: dict = {"monitor_on": True, "step_interval": 1, "log_interval": 0,
                "alert": {"rules": {"loss_spike": {"consecutive": 2}}},
                "checkpoint_ring": {"enable": True, "every_steps": 50, "keep": 5,
                                    "dir": os.path.join(out, "ring", "{run_id}-{device}"), **ring},
                "rewind": {"report_after": 100, **json.loads(os.environ.get("MSMON_RW_REWIND") or "{}")}}
    if os.environ.get("MSMON_BOT_URL"):
        mc["bot"] = {"url": os.environ["MSMON_BOT_URL"], "token_env": "MSMON_JOB_TOKEN", "heartbeat_interval": 0.5,
                     "spool_dir": os.environ.get("MSMON_SPOOL_DIR", os.path.join(out, "spool"))}
    actions = json.loads(os.environ.get("MSMON_RW_ACTIONS") or "[]")
    if actions:
        mc["actions"] = actions
    cb = MonitorCallback({"monitor_config": mc}, run_id=os.environ.get("MSMON_RW_RUN", "rw-run"), device=rank,
                         checkpoint_dir=os.path.join(out, "ckpt"))
    rec = Record(cb, opt)
    results: list[dict] = []
    cb.control.on_result = lambda r: results.append({"step": r.step, "action": r.action, "ok": r.ok,
                                                     "applied": r.applied, "detail": r.detail, "path": r.path,
                                                     "source": r.source})
    at = os.environ.get("MSMON_RW_REWIND_AT", "")
    pause_at = int(os.environ.get("MSMON_RW_PAUSE_AT", "0") or 0)
    asks: dict[int, list[tuple[str, dict]]] = {}
    for ask_step, action, params in json.loads(os.environ.get("MSMON_RW_ASK") or "[]"):
        asks.setdefault(int(ask_step), []).append((action, params))
    corrupt = os.environ.get("MSMON_RW_CORRUPT", "").split(":")

    class Asker(ms.train.Callback):  # type: ignore[misc]
        def on_train_step_end(self, run_context):  # noqa: ANN001, ANN201
            step = cb.control.last_step
            if len(corrupt) == 4 and int(corrupt[0]) == rank and step == int(corrupt[3]) and cb.control.attempt == 0:
                damage(corrupt[1], int(corrupt[2]))
            for i, (action, params) in enumerate(asks.pop(step, []) if cb.control.attempt == 0 else []):
                cb.control.request(action, f"command c{100 + i} from @operator", **params)
            if at and step == int(at.split(":", 1)[0]) and not getattr(self, "done", False):
                self.done = True
                params = json.loads(at.split(":", 1)[1]) if ":" in at else {}
                cb.control.request("rewind", "command c1 from @operator", **params)
            if pause_at and step == pause_at and not getattr(self, "paused", False):
                self.paused = True
                cb.control.request("pause")

                def later() -> None:  # an operator's rewind, then resume, while the job waits paused
                    time.sleep(0.3)
                    cb.control.request("rewind", "command c2 from @operator", skip=100)
                    time.sleep(0.3)
                    cb.control.request("resume", "command c3 from @operator")

                threading.Thread(target=later, daemon=True).start()

    def damage(kind: str, ckpt: int) -> None:
        path = next(e.path for e in cb.control.ring.entries if e.step == ckpt)
        data = open(path, "rb").read()  # noqa: SIM115
        if kind == "missing":
            os.remove(path)
            return
        damaged = {"truncated": data[:len(data) // 2], "zero": b"", "random": np.random.default_rng(7).bytes(len(data)),
                   "flipped": data[:len(data) // 2] + bytes([data[len(data) // 2] ^ 0xFF]) + data[len(data) // 2 + 1:]}
        with open(path, "wb") as f:
            f.write(damaged[kind])
        print(f"rank {rank}: damaged {path} ({kind})", flush=True)

    dump_at = int(os.environ.get("MSMON_RW_DUMP", "0") or 0)
    train_net = model.train_network

    def dump(name: str) -> None:
        np.savez(os.path.join(out, f"{name}_rank{rank}.npz"),
                 **{p.name: p.asnumpy() for p in train_net.get_parameters()})

    if dump_at:
        first = cb._rewound

        def rewound(a: int, b: int, entry: object) -> None:
            first(a, b, entry)
            dump("dump_rewound")

        class Dump(ms.train.Callback):  # type: ignore[misc]
            def on_train_begin(self, run_context):  # noqa: ANN001, ANN201
                cb.control.on_rewind = rewound

            def on_train_step_end(self, run_context):  # noqa: ANN001, ANN201
                if cb.control.last_step == dump_at and cb.control.attempt == 0:
                    dump(f"dump_{dump_at}")

        extra = [Dump()]
    else:
        extra = []
    model.train(1, data, callbacks=[rec, cb, *extra, Asker()], dataset_sink_mode=False)
    ring_now = [e.to_dict() for e in cb.control.ring.entries] if cb.control.ring else []
    digest = hashlib.sha256()
    for p in sorted(train_net.get_parameters(), key=lambda p: p.name):
        digest.update(p.name.encode() + p.asnumpy().tobytes())
    with open(os.path.join(out, f"rank_{rank}.json"), "w", encoding="utf-8") as f:
        json.dump({"losses": rec.losses, "batches": rec.batches, "results": results, "ring": ring_now,
                   "attempt": cb.control.attempt, "weights": digest.hexdigest()}, f)
    print(f"rank {rank} finished at step {cb.control.last_step}", flush=True)


if __name__ == "__main__":
    main()
