"""What health checkpoints and a rewind cost a real MindSpore training (CPU), with the defaults a user gets
(checkpoint_ring every_steps 100, keep 5; msmon's train cell with its runtime clip).

    .venv/bin/python bench/bench_rewind.py [--steps 600] [--hidden 64 1024] [--repeats 3]

For each model size (the toy MLP 32-H-1; H=1024 has ~35k parameters, H=64 ~2k):
- step time: the median step time with the ring off and on, measured in one run each, interleaved `repeats`
  times; the ratio is the ring's overhead per step, saves included (one in every_steps);
- per save: the time JobControl's health checkpoint takes (the .ckpt and msmon's state), against the step time;
- the step hook alone: JobControl.step_end on a step that saves nothing (microseconds);
- rewind latency: from the rewind asked at a step boundary to the start of the first step of the new attempt
  (reading and checking the checkpoint, the dataset reset, restoring the parameters, msmon's state).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import mindspore as ms  # noqa: E402
import mindspore.dataset as ds  # noqa: E402
import numpy as np  # noqa: E402
from mindspore import nn  # noqa: E402

from notifier.mindspore import MonitorCallback, TrainStepWithGradNorm  # noqa: E402
from notifier.mindspore.toy import MLP, regression_data  # noqa: E402

BATCH = 64


class Src:
    def __init__(self, steps: int) -> None:
        self.x, self.y = regression_data()
        self.steps, self.n = steps, len(self.x) // BATCH

    def __getitem__(self, i: int):  # noqa: ANN204
        b = int(i) % self.n
        return self.x[b * BATCH:(b + 1) * BATCH], self.y[b * BATCH:(b + 1) * BATCH]

    def __len__(self) -> int:
        return self.steps


class Clock(ms.train.Callback):  # type: ignore[misc]
    """Step times (begin to begin), the rewind's latency, the hook's cost."""

    def __init__(self, cb: MonitorCallback, rewind_at: int | None) -> None:
        self.cb, self.rewind_at = cb, rewind_at
        self.begins: list[float] = []
        self.asked: float | None = None
        self.latency: float | None = None

    def on_train_step_begin(self, run_context):  # noqa: ANN001, ANN201
        now = time.perf_counter()
        self.begins.append(now)
        if self.asked is not None and self.latency is None:
            self.latency = now - self.asked

    def on_train_step_end(self, run_context):  # noqa: ANN001, ANN201
        if self.rewind_at is not None and self.cb.control.last_step == self.rewind_at and self.asked is None:
            self.cb.control.request("rewind", "bench")
            self.asked = time.perf_counter()


def train(steps: int, hidden: int, ring: bool, rewind_at: int | None, folder: str) -> dict[str, float]:
    ms.set_seed(1)
    net = MLP(hidden=hidden)
    opt = nn.SGD(net.trainable_params(), learning_rate=0.05 if hidden <= 64 else 0.005)  # a wide MLP needs a smaller LR
    model = ms.Model(TrainStepWithGradNorm(nn.WithLossCell(net, nn.MSELoss()), opt))
    mc = {"monitor_on": True, "step_interval": 1, "log_interval": 0,
          "checkpoint_ring": {"enable": ring, "every_steps": 100, "dir": os.path.join(folder, "ring")}}
    cb = MonitorCallback({"monitor_config": mc}, run_id="bench", device=0, checkpoint_dir=folder)
    saves: list[float] = []
    save = cb.control.health._save

    def timed(step: int, rc: object) -> None:
        t = time.perf_counter()
        save(step, rc)
        saves.append(time.perf_counter() - t)

    cb.control.health._save = timed  # type: ignore[method-assign]
    clock = Clock(cb, rewind_at)
    data = ds.GeneratorDataset(Src(steps), ["x", "y"], shuffle=False)
    model.train(1, data, callbacks=[clock, cb], dataset_sink_mode=False)
    dts = np.diff(clock.begins[50:])  # after compilation and warm-up
    hook = _hook_cost(cb)
    return {"step": float(np.median(dts)), "save": statistics.median(saves) if saves else 0.0,
            "latency": clock.latency or 0.0, "hook": hook}


def _hook_cost(cb: MonitorCallback) -> float:
    """JobControl.step_end on steps that save nothing: the median of 2,000 calls (seconds)."""
    ctl = cb.control
    ring = ctl.ring
    if ring is None:
        return 0.0
    last = ring.entries[-1].step if ring.entries else 0
    times = []
    for k in range(1, 2001):
        step = last + 1 + (k % 49)  # never a multiple of every_steps past the last save
        t = time.perf_counter()
        ctl.step_end(step)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--hidden", type=int, nargs="+", default=[64, 1024])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    import logging

    logging.getLogger("msmon").setLevel(logging.WARNING)
    print(f"MindSpore {ms.__version__}, CPU, GRAPH mode; {args.steps} steps per run, ring every 100 steps, keep 5; "
          f"{args.repeats} interleaved runs each")
    for hidden in args.hidden:
        off, on, saves, lat, hooks = [], [], [], [], []
        for _ in range(args.repeats):
            with tempfile.TemporaryDirectory() as d:
                off.append(train(args.steps, hidden, False, None, d)["step"])
            with tempfile.TemporaryDirectory() as d:
                r = train(args.steps, hidden, True, args.steps // 2 + 20, d)
                on.append(r["step"])
                saves.append(r["save"])
                lat.append(r["latency"])
                hooks.append(r["hook"])
        params = 32 * hidden + hidden + hidden + 1
        s_off, s_on = statistics.median(off), statistics.median(on)
        ratios = [b / a for a, b in zip(off, on, strict=True)]
        hook, save = statistics.median(hooks), statistics.median(saves)
        print(f"MLP 32-{hidden}-1 ({params:,} parameters):")
        print(f"  median step time: ring off {s_off * 1e3:.2f} ms, on {s_on * 1e3:.2f} ms; on/off per interleaved pair "
              f"{statistics.median(ratios):.2f} (from {min(ratios):.2f} to {max(ratios):.2f}: the shared machine's "
              "noise, see the direct figures below)")
        print(f"  the ring's own cost per step, measured directly: hook + one save / 100 = "
              f"{(hook + save / 100) * 1e6:.0f} us = {(hook + save / 100) / s_off:.1%} of a step of this toy")
        print(f"  one health checkpoint: {statistics.median(saves) * 1e3:.1f} ms = "
              f"{statistics.median(saves) / s_off:.1f} step times; one every 100 steps: "
              f"{statistics.median(saves) / (100 * s_off):.1%} per step on average)")
        print(f"  step hook on a step that saves nothing: {statistics.median(hooks) * 1e6:.2f} us "
              f"({statistics.median(hooks) / s_off:.4%} of a step)")
        print(f"  rewind latency, asked at a step boundary to the first new step: "
              f"{statistics.median(lat) * 1e3:.1f} ms (min {min(lat) * 1e3:.1f}, max {max(lat) * 1e3:.1f})")


if __name__ == "__main__":
    main()
