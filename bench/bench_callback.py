"""MonitorCallback overhead on real MindSpore training of a small Transformer (CPU, GRAPH mode).

    .venv/bin/python bench/bench_callback.py [--rounds 6] [--steps 40]

Arms, interleaved round by round on the same model and data (so drift hits them all alike):
  none      - no callback
  msmon     - MonitorCallback: all metrics, step_interval 1, CSV and TensorBoard on
  loss_mon  - MindSpore's own LossMonitor(per_print_times=1), for reference (prints go to /dev/null)
All arms train the same train cell (TrainStepWithGradNorm), so the grad norm's own cost, measured
separately below (vs a plain TrainOneStepCell), is not counted as callback overhead. Step time is the
wall time between consecutive step ends, taken by a timing callback that runs first.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from notifier.mindspore import MonitorCallback, TrainStepWithGradNorm  # noqa: E402
from notifier.mindspore.toy import TinyLM, token_data  # noqa: E402

VOCAB, SEQ, BATCH, D, HEADS, LAYERS = 512, 64, 8, 128, 4, 2


def data(steps: int) -> ds.Dataset:
    return token_data(steps, BATCH, SEQ, VOCAB)


class StepTimer(ms.train.Callback):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.ends: list[float] = []

    def on_train_step_end(self, run_context: Any) -> None:
        self.ends.append(time.perf_counter())

    def step_times(self, skip: int = 3) -> list[float]:
        return [b - a for a, b in zip(self.ends[skip:], self.ends[skip + 1:], strict=False)]


class TimedMonitorCallback(MonitorCallback):
    """MonitorCallback that also clocks its own on_train_step_end (the direct cost, free of step noise)."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.spent: list[float] = []

    def on_train_step_end(self, run_context: Any) -> None:
        t0 = time.perf_counter()
        super().on_train_step_end(run_context)
        self.spent.append(time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=40, help="steps per arm per round")
    args = ap.parse_args()
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    logging.getLogger("msmon").setLevel(logging.WARNING)
    ms.set_seed(0)
    net = TinyLM(VOCAB, D, HEADS, LAYERS)
    opt = nn.Adam(net.trainable_params(), learning_rate=1e-4)
    model = ms.Model(TrainStepWithGradNorm(net, opt))
    ms.set_seed(0)
    plain_net = TinyLM(VOCAB, D, HEADS, LAYERS)
    plain = ms.Model(nn.TrainOneStepCell(plain_net, nn.Adam(plain_net.trainable_params(), learning_rate=1e-4)))
    tmp = tempfile.mkdtemp(prefix="msmon-bench-")
    cfg = {"monitor_config": {"monitor_on": True, "step_interval": 1, "log_interval": 0,
                              "training": {"seq_length": SEQ},
                              "csv": {"enable": True, "path": os.path.join(tmp, "{run_id}.csv")},
                              "tensorboard": {"enable": True, "log_dir": os.path.join(tmp, "tb")}}}
    monitor_cb = TimedMonitorCallback(cfg, run_id="bench", checkpoint_dir=tmp)
    arms = {
        "none": (model, []),
        "msmon": (model, [monitor_cb]),
        "loss_mon": (model, [ms.train.LossMonitor(per_print_times=1)]),
        "plain_cell": (plain, []),
    }
    times: dict[str, list[float]] = {k: [] for k in arms}
    model.train(1, data(5), dataset_sink_mode=False)  # compile outside the measurement
    plain.train(1, data(5), dataset_sink_mode=False)
    for _ in range(args.rounds):
        for name, (m, cbs) in arms.items():
            timer = StepTimer()
            with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
                m.train(1, data(args.steps), callbacks=[timer, *cbs], dataset_sink_mode=False)
            times[name] += timer.step_times()
    monitor_cb.monitor.close()
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"Small Transformer LM (d{D}, {LAYERS} layers, seq {SEQ}, batch {BATCH}), CPU GRAPH mode, "
          f"{args.rounds} rounds x {args.steps} steps per arm, MindSpore {ms.__version__}")
    print(f"median step time: none {med['none'] * 1e3:.2f} ms | msmon {med['msmon'] * 1e3:.2f} ms | "
          f"LossMonitor {med['loss_mon'] * 1e3:.2f} ms | plain TrainOneStepCell {med['plain_cell'] * 1e3:.2f} ms")
    print(f"MonitorCallback / no callback  = {med['msmon'] / med['none']:.4f}  "
          f"(overhead {100 * (med['msmon'] / med['none'] - 1):+.2f}%)")
    print(f"LossMonitor / no callback      = {med['loss_mon'] / med['none']:.4f}  "
          f"(overhead {100 * (med['loss_mon'] / med['none'] - 1):+.2f}%)")
    own = statistics.median(monitor_cb.spent)
    p99 = statistics.quantiles(monitor_cb.spent, n=100)[98]
    print(f"MonitorCallback's own time per step: median {own * 1e6:.1f} us, p99 {p99 * 1e6:.1f} us = "
          f"{100 * own / med['none']:.3f}% of a step")
    print(f"TrainStepWithGradNorm / plain TrainOneStepCell = {med['none'] / med['plain_cell']:.4f}  "
          f"(the in-graph grad norm and LR)")


if __name__ == "__main__":
    main()
