"""Host reads per sampled step, and MonitorCallback's own time, on real MindSpore training of a small
Transformer LM (CPU, GRAPH mode, a few ms a step), at `step_interval: 1`.

    .venv/bin/python bench/bench_host_reads.py [--rounds 4] [--steps 50]    (under a minute)

Arms, interleaved round by round (so drift hits them all alike), each on its own copy of the model:
  packed         - TrainStepWithGradNorm: loss, LR and norm packed into one tensor, read at once
  packed+defer   - the same with `deferred_read: true` (step N read at the end of step N+1)
  five_tuple     - TrainStepWithGradNorm(packed=False): MindFormers' 5-tuple, loss, LR and norm read one by one
  loss_only      - a plain TrainOneStepCell (the loss alone; the LR read from the optimizer)
  cell:packed / cell:five_tuple - the two train cells with no callback (what packing costs the step)
  b2b:packed / b2b:defer - afterwards, the callback driven back to back through a real training's run
                 context and its recorded outputs: its own work with warm caches (in training every step
                 evicts them, which on a shared 2-core VM multiplies every Python cost, reads included)
Host reads are counted by the callback itself (`MonitorCallback.reads`, every asnumpy of a step goes through
it) and timed by a HostReads that also clocks them; the callback's own time is clocked around its
on_train_step_end. "Beyond the reads" is that time minus the reads' time, step by step.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time
from typing import Any

import mindspore as ms
from mindspore import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench_callback import StepTimer  # noqa: E402

from notifier.mindspore import MonitorCallback, TrainStepWithGradNorm  # noqa: E402
from notifier.mindspore.reads import HostReads  # noqa: E402
from notifier.mindspore.toy import TinyLM, token_data  # noqa: E402

VOCAB, SEQ, BATCH, D, HEADS, LAYERS = 256, 16, 4, 32, 2, 2
TARGET_US = 30.0  # the callback's own work per sampled step beyond its one read


class TimedReads(HostReads):
    """HostReads that also adds up the wall and the thread CPU time its reads take."""

    __slots__ = ("wall", "cpu")

    def __init__(self) -> None:
        super().__init__()
        self.wall = self.cpu = 0.0

    def __call__(self, tensor: Any) -> Any:
        w0, c0 = time.perf_counter(), time.thread_time()
        out = super().__call__(tensor)
        self.cpu += time.thread_time() - c0
        self.wall += time.perf_counter() - w0
        return out


class ReadTimedCallback(MonitorCallback):
    """MonitorCallback that clocks its own on_train_step_end, and the part of it spent in host reads, in wall
    time (what the step waits) and in this thread's CPU time (the work itself, without the time the OS gives
    MindSpore's runtime threads meanwhile: on a shared 2-core machine that is most of the wall time)."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, reads=TimedReads(), **kw)
        self.own: dict[str, list[float]] = {"wall": [], "cpu": []}
        self.read: dict[str, list[float]] = {"wall": [], "cpu": []}

    def on_train_step_end(self, run_context: Any) -> None:
        reads = self.reads
        assert isinstance(reads, TimedReads)
        rw, rc = reads.wall, reads.cpu
        w0, c0 = time.perf_counter(), time.thread_time()
        super().on_train_step_end(run_context)
        c1, w1 = time.thread_time(), time.perf_counter()
        self.own["wall"].append(w1 - w0)
        self.own["cpu"].append(c1 - c0)
        self.read["wall"].append(reads.wall - rw)
        self.read["cpu"].append(reads.cpu - rc)

    def beyond_reads(self, clock: str) -> list[float]:
        return [own - read for own, read in zip(self.own[clock], self.read[clock], strict=True)]


def make_model(cell: str) -> ms.Model:
    ms.set_seed(0)
    net = TinyLM(VOCAB, D, HEADS, LAYERS)
    opt = nn.Adam(net.trainable_params(), learning_rate=1e-4)
    if cell == "loss_only":
        return ms.Model(nn.TrainOneStepCell(net, opt))
    return ms.Model(TrainStepWithGradNorm(net, opt, packed=cell == "packed"))


def config(deferred: bool) -> dict[str, Any]:
    return {"monitor_config": {"monitor_on": True, "step_interval": 1, "log_interval": 0, "deferred_read": deferred,
                               "training": {"seq_length": SEQ}}}


def us(seconds: float) -> str:
    return f"{seconds * 1e6:.1f} us"


class KeepOutputs(ms.train.Callback):  # type: ignore[misc]
    """Keeps a training's step outputs and its run context, to drive a callback through them afterwards."""

    def __init__(self) -> None:
        super().__init__()
        self.outputs: list[Any] = []
        self.context: Any = None

    def on_train_step_end(self, run_context: Any) -> None:
        self.context = run_context
        self.outputs.append(run_context.original_args().net_outputs)


def back_to_back(model: ms.Model, steps: int, deferred: bool) -> ReadTimedCallback:
    """The callback on its own: driven through a real training's run context and real outputs, step after
    step with no training in between, so the caches are its own (in training each step evicts them)."""
    kept = KeepOutputs()
    model.train(1, token_data(steps, BATCH, SEQ, VOCAB), callbacks=[kept], dataset_sink_mode=False)
    cb = ReadTimedCallback(config(deferred), run_id="b2b")
    ctx = kept.context
    params = ctx.original_args()
    cb.on_train_begin(ctx)
    for k, out in enumerate(kept.outputs, 1):
        params.cur_step_num, params.net_outputs = k, out
        cb.on_train_step_end(ctx)
    cb.on_train_end(ctx)
    return cb


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=50, help="steps per arm per round")
    args = ap.parse_args()
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    logging.getLogger("msmon").setLevel(logging.WARNING)
    arms: dict[str, tuple[ms.Model, ReadTimedCallback | None]] = {
        "packed": (make_model("packed"), ReadTimedCallback(config(False), run_id="packed")),
        "packed+defer": (make_model("packed"), ReadTimedCallback(config(True), run_id="defer")),
        "five_tuple": (make_model("five_tuple"), ReadTimedCallback(config(False), run_id="five")),
        "loss_only": (make_model("loss_only"), ReadTimedCallback(config(False), run_id="loss")),
        "cell:packed": (make_model("packed"), None),
        "cell:five_tuple": (make_model("five_tuple"), None),
    }
    for m, _ in arms.values():
        m.train(1, token_data(5, BATCH, SEQ, VOCAB), dataset_sink_mode=False)  # compile outside the measurement
    step_times: dict[str, list[float]] = {k: [] for k in arms}
    for _ in range(args.rounds):
        for name, (m, cb) in arms.items():
            timer = StepTimer()
            m.train(1, token_data(args.steps, BATCH, SEQ, VOCAB), callbacks=[timer, *([cb] if cb else [])],
                    dataset_sink_mode=False)
            step_times[name] += timer.step_times()
    callbacks = {name: cb for name, (_, cb) in arms.items() if cb is not None}
    for cb in callbacks.values():
        cb.monitor.close()
    total = args.rounds * args.steps
    packed_model = arms["packed"][0]
    callbacks["b2b:packed"] = back_to_back(packed_model, total, deferred=False)
    callbacks["b2b:defer"] = back_to_back(packed_model, total, deferred=True)
    med = {k: statistics.median(v) for k, v in step_times.items()}
    print(f"Small Transformer LM (d{D}, {LAYERS} layers, {HEADS} heads, seq {SEQ}, batch {BATCH}, vocab {VOCAB}, "
          f"Adam), CPU GRAPH mode, step_interval 1, {args.rounds} rounds x {args.steps} steps per arm, "
          f"MindSpore {ms.__version__}")
    packed_ms, five_ms = med["cell:packed"] * 1e3, med["cell:five_tuple"] * 1e3
    print(f"median step time, no callback: packed cell {packed_ms:.2f} ms | 5-tuple cell {five_ms:.2f} ms | "
          f"packed / 5-tuple = {packed_ms / five_ms:.4f}")
    report(callbacks, med)


def report(callbacks: dict[str, ReadTimedCallback], step_median: dict[str, float]) -> None:
    """The table (in training, then back to back: b2b), the ratios and the target."""
    own: dict[str, float] = {}
    beyond: dict[str, float] = {}
    for clock in ("wall", "cpu"):
        print(f"[{clock} time] {'arm':<13} {'reads/step':>10} {'callback median':>16} {'p99':>10} "
              f"{'reads median':>13} {'beyond reads median':>20} {'p99':>10} {'step':>9}")
        for name, cb in callbacks.items():
            spent, extra = cb.own[clock], cb.beyond_reads(clock)
            own[f"{name}:{clock}"] = statistics.median(spent)
            beyond[f"{name}:{clock}"] = statistics.median(extra)
            step = f"{step_median[name] * 1e3:.2f}ms" if name in step_median else "-"
            reads = statistics.median(cb.read[clock])
            print(f"{'':<12} {name:<13} {cb.reads.count / cb.monitor.sample_count:>10.2f} "
                  f"{us(statistics.median(spent)):>16} {us(p99(spent)):>10} {us(reads):>13} "
                  f"{us(statistics.median(extra)):>20} {us(p99(extra)):>10} {step:>9}")
    print(f"host reads per sampled step, packed / 5-tuple = "
          f"{callbacks['packed'].reads.count / callbacks['five_tuple'].reads.count:.3f}")
    for clock in ("wall", "cpu"):
        packed = own[f"packed:{clock}"]
        print(f"callback's own {clock} time in training: packed / 5-tuple = {packed / own[f'five_tuple:{clock}']:.3f}, "
              f"deferred / immediate = {own[f'packed+defer:{clock}'] / packed:.3f}")
    for where, arms in (("back to back", ("b2b:packed", "b2b:defer")), ("in training", ("packed", "packed+defer"))):
        worst = max(beyond[f"{arm}:cpu"] for arm in arms)
        print(f"target: the callback's own work beyond its one read <= {TARGET_US:.0f} us per sampled step, {where} "
              f"(CPU time, the slower packed arm): {us(worst)} -> {'met' if worst * 1e6 <= TARGET_US else 'NOT met'}")


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98]


if __name__ == "__main__":
    main()
