"""Generate the MindSpore CPU backtest traces: real training, one CSV per scenario, and their labels.

    .venv/bin/python bench/gen_backtest_traces.py [--out data/backtest/mindspore-cpu] [--only NAME ...]

About 4 minutes on 2 cores (issue 13's four classes: 55 s); the trainings run one after the other.
Every trace is the same small job
(the divergence recipe in shared/notes): a noisy regression (x ~ N(0, 1)^32, y = x.w + 0.5 noise, a
pool of 16,384 samples, seed = the scenario's seed), an MLP 32-64-1 trained with SGD on MSE in GRAPH mode,
batches of 512 in order, LR warmed up over 100 steps to 0.05 then constant, through msmon's
TrainStepWithGradNorm (loss, LR and grad norm from the compiled step). The data loader waits
LOADER_SECONDS per batch (a sleep; longer in the slowdown), so the job is input-bound.

Each step's row is written as msmon CSV columns `step,loss,learning_rate,grad_norm,time`. `time` is
the measured wall clock since the start plus (LOADER_SCALE - 1) x the loader's waits so far: the trace
is what this job would log if its loader took 100x longer (0.3 s a batch instead of 3 ms), so that
the throughput rules, which judge spans of >= 10 s, run on a few thousand steps. The job's own timing
noise (scheduler, GC, this shared VM's other load: stalls of up to ~0.1 s) keeps its real size, as it
would in a job with 0.3 s steps; stretching all of the clock instead would turn it into 10 s stalls.

Issue 24 adds a second family, `LM_SCENARIOS` (`lm-*`): a small Transformer LM (notifier.mindspore.toy.TinyLM)
on a learnable token stream with AdamW, a fine-tune's constant LR, warmup + cosine, WSD, other seeds and widths,
gradient accumulation's micro-step loss wave, dynamic loss scaling (overflow and loss_scale columns), and the
faults those runs must still catch (data/backtest/mindspore-cpu/README.md); about 12 minutes of one core.

Labels (labels.csv): fault_step as injected; diverge_step by the backtest's rule
(`msmon.offline.backtest.engine.divergence_step`: first step from the fault whose loss is NaN/Inf or >= 2x the
median of the 100 steps before it), leaving out the corrupt batches' own losses.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import math
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import mindspore as ms  # noqa: E402
import mindspore.dataset as ds  # noqa: E402
import numpy as np  # noqa: E402
from mindspore import nn, ops  # noqa: E402

from msmon.offline.backtest.engine import LABEL_COLUMNS, divergence_step  # noqa: E402
from msmon.offline.readers import Row  # noqa: E402
from notifier.mindspore import TrainStepWithGradNorm, TrainStepWithGradNormLossScale, parse_outputs  # noqa: E402
from notifier.mindspore.toy import TinyLM  # noqa: E402
from tests.fakes.ms_helpers import MLP, regression_data  # noqa: E402 - the same model and data as the tests

ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")

OUT = ROOT / "data" / "backtest" / "mindspore-cpu"
POOL, BATCH = 16_384, 512
LR, WARMUP = 0.05, 100
LOADER_SECONDS = 0.003
LOADER_SCALE = 100.0
STEPS, FAULT = 3000, 2005  # the fault begins between two samples of step_interval 10


@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str
    notes: str
    seed: int = 1
    kind: str = "training"  # as in the labels: clean, training or timing
    steps: int = STEPS
    fault_step: int | None = FAULT
    lr_factor: Callable[[int], float] = lambda step: 1.0  # x the schedule, from the fault step on
    corrupt_steps: int = 0  # batches from the fault step on whose labels are x CORRUPT_FACTOR
    nan_label: bool = False  # one NaN label in the fault step's batch
    slow_factor: float = 1.0  # the loader waits this many times longer from the fault step on
    grad_factor: Callable[[int], float] | None = None  # x the gradients from the fault step on (the LR logged flat)
    shard_noise: float = 0.0  # label noise (std) added from the fault step on: a noisier data shard
    throughput_only: bool = False  # log the step's real samples/s and no time column
    diverges: bool = True  # False: a level shift, not a divergence (no diverge_step; caught or missed)
    # The language-model family (issue 24): a small Transformer LM (notifier.mindspore.toy.TinyLM) on a
    # learnable token stream, AdamW, the shapes of real runs' first steps and schedules.
    lm: LmSpec | None = None

    def lr(self, step: int) -> float:
        if self.lm is not None:
            return self._lm_lr(step, self.lm.schedule)
        base = LR * min(1.0, 0.1 + 0.9 * (step - 1) / WARMUP)
        if self.fault_step is not None and step >= self.fault_step:
            base *= self.lr_factor(step - self.fault_step)
        return base

    def _lm_lr(self, step: int, schedule: str) -> float:
        if schedule == "constant":
            base = LM_LR
        elif schedule == "cosine":  # linear warmup, then cosine to a tenth
            k = max(step - LM_WARMUP, 0) / max(self.steps - LM_WARMUP, 1)
            base = LM_LR * (step / LM_WARMUP if step <= LM_WARMUP else 0.1 + 0.45 * (1 + math.cos(math.pi * k)))
        else:  # wsd: warmup 50 steps, stable, then a linear decay to a tenth over the last fifth of the run
            decay = int(0.8 * self.steps)
            base = LM_LR * (min(1.0, step / 50) if step < decay else 1.0 - 0.9 * (step - decay) / (self.steps - decay))
        if self.fault_step is not None and step >= self.fault_step:
            base *= self.lr_factor(step - self.fault_step)
        return base

    def optimizer_lr(self, step: int) -> float:
        """The LR the optimizer applies: the logged one, x the hidden factor of a fault the log does not show."""
        lm = self.lm
        hidden = lm.hidden_lr if lm is not None else None
        f = self.fault_step
        return self.lr(step) * (hidden(step - f) if hidden is not None and f is not None and step >= f else 1.0)

    def loader_seconds(self, step: int) -> float:
        slow = self.fault_step is not None and step >= self.fault_step
        return LOADER_SECONDS * (self.slow_factor if slow else 1.0)

    def grad_scale(self, step: int) -> float:
        f = self.fault_step
        return self.grad_factor(step - f) if self.grad_factor and f is not None and step >= f else 1.0

    def shard_switched(self, step: int) -> bool:
        return self.shard_noise > 0 and self.fault_step is not None and step >= self.fault_step

    def corrupt(self, step: int) -> bool:
        f = self.fault_step
        return f is not None and f <= step < f + self.corrupt_steps


@dataclasses.dataclass(frozen=True)
class LmSpec:
    """How a language-model trace differs from the plain one (see `train_lm`)."""

    schedule: str = "constant"  # constant (a fine-tune: one LR from step 1), cosine (warmup + cosine), wsd
    d: int = 32  # model width; layers 2, heads 2, vocabulary LM_VOCAB, sequences of LM_SEQ, batches of LM_BATCH
    sources: int = 1  # > 1: that many micro-batches per step from token streams of different entropy, the loss
    #                   logged the current micro-step's (see _LmLoss): a micro-step loss log's wave
    loss_scale: bool = False  # TrainStepWithGradNormLossScale + DynamicLossScaleUpdateCell (overflow, scale logged)
    hidden_lr: Callable[[int], float] | None = None  # x the optimizer's LR from the fault step on, the LR logged as
    #                                                   scheduled (a fault the logged LR does not show)
    overflow_from: bool = False  # gradients Inf on every step from the fault step on (every step skipped)
    nan_loss: bool = False  # the loss NaN on the fault step only


LM_VOCAB, LM_SEQ, LM_BATCH, LM_LR = 48, 32, 16, 1e-3
LM_WARMUP = 100
LM_SCALE0, LM_SCALE_WINDOW = 2.0 ** 110, 60  # the dynamic loss scale: start, and good steps before it doubles
LM_HEADROOM = 2.0 ** 24  # see _Headroom


CORRUPT_FACTOR = 10.0
SHARD_NOISE_STD = 0.866  # with the pool's own 0.5: label noise std 1.0, an MSE floor of 1.0 instead of 0.25

SCENARIOS: tuple[Scenario, ...] = (
    Scenario("clean-seed1", "clean run", seed=1, kind="clean", fault_step=None),
    Scenario("clean-seed2", "clean run", seed=2, kind="clean", fault_step=None),
    Scenario("clean-seed3", "clean run", seed=3, kind="clean", fault_step=None),
    Scenario("lr-jump", "LR x4 from the fault step on (0.05 -> 0.2), as after a resume with the wrong LR",
             lr_factor=lambda k: 4.0),
    Scenario("lr-creep", "LR x1.005 per step from the fault step on (doubles every 139 steps)", steps=2600,
             lr_factor=lambda k: 1.005 ** k),
    Scenario("corrupt-burst", f"20 batches with labels x{CORRUPT_FACTOR:g} from the fault step on (a shard in the "
             "wrong unit); diverge_step leaves their own losses out", corrupt_steps=20),
    Scenario("loader-slowdown", "the data loader waits 1.7x longer per batch from the fault step on (5.1 ms "
             "instead of 3 ms; 0.51 s instead of 0.3 s in the trace's time); no divergence", kind="timing",
             slow_factor=1.7),
    Scenario("nan", "one NaN label in the fault step's batch: the loss is NaN from there on", steps=2200,
             nan_label=True),
    # issue 13's classes: an early fault, a creep the LR does not show, a level shift, real throughput noise
    Scenario("early-grad-x10", "gradients x10 from step 250 on, the logged LR unchanged (an accumulation bug "
             "early in a fine-tune)", steps=400, fault_step=250, grad_factor=lambda k: 10.0),
    Scenario("grad-creep", "gradients x1.003 per step from the fault step on, the logged LR flat (the grad norm "
             "doubles every 231 steps)", steps=2000, fault_step=1005, grad_factor=lambda k: 1.003 ** k),
    Scenario("shard-switch", f"from the fault step on the batches come from a noisier shard (label noise std "
             f"{SHARD_NOISE_STD:g} more): the loss settles at a new level about 4x the old and stays; a level shift, "
             "no diverge_step", steps=2000, fault_step=1005, shard_noise=SHARD_NOISE_STD, diverges=False),
    Scenario("clean-throughput", "clean run logging each step's real samples/s (batch / the step's wall time, "
             "the loader's 3 ms waits unscaled) and no time column", seed=4, kind="clean", fault_step=None,
             throughput_only=True),
)

# Issue 24: a small Transformer LM as users run it: a fine-tune at one LR from step 1, warmup + cosine, WSD, other
# seeds and widths, a micro-step loss wave, dynamic loss scaling; and the faults those runs must still catch.
LM_SCENARIOS: tuple[Scenario, ...] = (
    Scenario("lm-const-s1", "LM, constant LR from step 1 (a fine-tune)", seed=11, kind="clean", fault_step=None,
             steps=2000, lm=LmSpec()),
    Scenario("lm-const-s2-d48", "LM d48, constant LR from step 1", seed=12, kind="clean", fault_step=None,
             steps=1500, lm=LmSpec(d=48)),
    Scenario("lm-cosine-s3", "LM, warmup 100 steps + cosine to a tenth", seed=13, kind="clean", fault_step=None,
             steps=2000, lm=LmSpec(schedule="cosine")),
    Scenario("lm-wsd-s4", "LM d24, warmup 50 + stable + linear decay over the last fifth (WSD)", seed=14,
             kind="clean", fault_step=None, steps=1500, lm=LmSpec(schedule="wsd", d=24)),
    Scenario("lm-accum4-s5", "LM, gradient accumulation of 4 micro-batches from 4 token streams of different "
             "entropy, the loss logged the current micro-step's (a wave of period 4, as MindFormers logs it)", seed=15,
             kind="clean", fault_step=None, steps=1500, lm=LmSpec(sources=4)),
    Scenario("lm-lossscale-s6", "LM, dynamic loss scaling: the scale searches down for 7 steps, then overflows every "
             "~60 steps and halves (overflow and loss_scale logged)", seed=16, kind="clean", fault_step=None,
             steps=1500, lm=LmSpec(loss_scale=True)),
    Scenario("lm-lr-jump", "LM at a constant LR 1e-3, x12 from the fault step on (unannounced; the LR logged)",
             seed=11, steps=1300, fault_step=1005, lr_factor=lambda k: 12.0, lm=LmSpec()),
    Scenario("lm-early-x30", "LM, updates x30 from step 150 (the optimizer's LR x30, the logged LR flat: an early "
             "fault a fine-tune's first steps must not hide)", seed=11, steps=400, fault_step=150,
             lm=LmSpec(hidden_lr=lambda k: 30.0)),
    Scenario("lm-early-x16", "LM, updates x16 from step 150 (the optimizer's LR x16, the logged LR flat)",
             seed=12, steps=400, fault_step=150, lm=LmSpec(hidden_lr=lambda k: 16.0)),
    Scenario("lm-grad-creep", "LM, gradients x1.004 per step from step 1000 (a gradient scale creeping, the logged "
             "LR flat; AdamW normalizes it away, so the loss does not show it)", seed=12, steps=1500,
             fault_step=1000, diverges=False, grad_factor=lambda k: 1.004 ** k, lm=LmSpec()),
    Scenario("lm-overflow-stuck", "LM with dynamic loss scaling, gradients Inf on every step from the fault step "
             "on: every step skipped, the scale collapsing to 1", seed=16, steps=800, fault_step=500,
             diverges=False, lm=LmSpec(loss_scale=True, overflow_from=True)),
    Scenario("lm-lossscale-nan", "LM with dynamic loss scaling, the loss NaN on the fault step (an ERROR at once, "
             "not a normal skip)", seed=16, steps=900, fault_step=800, lm=LmSpec(loss_scale=True, nan_loss=True)),
)


def _batches(sc: Scenario) -> Callable[[], Iterator[tuple[Any, Any, Any]]]:
    x, y = regression_data(n=POOL, seed=sc.seed)
    nb = POOL // BATCH
    rng = np.random.default_rng(sc.seed + 1000)  # the noisier shard's extra noise

    def gen() -> Iterator[tuple[Any, Any, Any]]:
        for i in range(sc.steps):
            step, b = i + 1, i % nb
            xb, yb = x[b * BATCH:(b + 1) * BATCH], y[b * BATCH:(b + 1) * BATCH]
            if sc.corrupt(step):
                yb = yb * CORRUPT_FACTOR
            if sc.nan_label and step == sc.fault_step:
                yb = yb.copy()
                yb[0, 0] = np.nan
            if sc.shard_switched(step):
                yb = yb + (sc.shard_noise * rng.standard_normal(yb.shape)).astype(np.float32)
            time.sleep(sc.loader_seconds(step))
            yield xb, yb, np.array(sc.grad_scale(step), np.float32)

    return gen


class _Recorder(ms.train.Callback):  # type: ignore[misc]
    """Keeps (step, loss, lr, grad norm, time) at every step end; time as in the module's docstring."""

    def __init__(self, sc: Scenario) -> None:
        super().__init__()
        self.sc = sc
        self.rows: list[Row] = []
        self.t0 = self.last = time.perf_counter()
        self.waited = 0.0  # the loader's waits up to this step

    def on_train_step_end(self, run_context: Any) -> None:
        c = run_context.original_args()
        step = int(c.cur_step_num)
        loss, lr, grad = parse_outputs(c.net_outputs)
        self.waited += self.sc.loader_seconds(step)
        now = time.perf_counter()
        if self.sc.throughput_only:
            self.rows.append(Row(step, loss=loss, lr=lr, grad_norm=grad, throughput=BATCH / (now - self.last)))
        else:
            t = now - self.t0 + (LOADER_SCALE - 1.0) * self.waited
            self.rows.append(Row(step, loss=loss, lr=lr, grad_norm=grad, time=t))
        self.last = now


class _GradScale(nn.Cell):  # type: ignore[misc]
    """The identity forward; backward, the gradient x `scale`: every parameter's gradient is scaled while
    the loss and the optimizer's LR stay as they are (a fault the logged LR does not show)."""

    def construct(self, x: Any, scale: Any) -> Any:
        return x

    def bprop(self, x: Any, scale: Any, out: Any, dout: Any) -> Any:
        return dout * scale, ops.zeros_like(scale)


class _ScaledLoss(nn.Cell):  # type: ignore[misc]
    """MSE of the MLP's prediction, its gradients scaled by the batch's third column."""

    def __init__(self, net: Any) -> None:
        super().__init__()
        self.net, self.scale, self.mse = net, _GradScale(), nn.MSELoss()

    def construct(self, x: Any, y: Any, scale: Any) -> Any:
        return self.mse(self.scale(self.net(x), scale), y)


def train(sc: Scenario) -> list[Row]:
    """Train the scenario's job on the CPU; one row per step."""
    ms.set_seed(sc.seed)
    net = MLP()
    opt = nn.SGD(net.trainable_params(), learning_rate=[sc.lr(s) for s in range(1, sc.steps + 1)])
    model = ms.Model(TrainStepWithGradNorm(_ScaledLoss(net), opt))
    data = ds.GeneratorDataset(_batches(sc), column_names=["x", "y", "grad_scale"], shuffle=False)
    rec = _Recorder(sc)
    model.train(1, data, callbacks=[rec], dataset_sink_mode=False)
    return rec.rows


def _markov(seed: int, n: int, temperature: float) -> Any:
    """`n` token sequences (LM_SEQ + 1) from a random sparse Markov chain: each token has 4 successors, their
    probabilities Dirichlet-drawn and sharpened (temperature < 1) or flattened (> 1). A language the LM learns."""
    rng = np.random.default_rng(seed)
    cum = np.zeros((LM_VOCAB, LM_VOCAB))
    for i in range(LM_VOCAB):
        succ = rng.choice(LM_VOCAB, 4, replace=False)
        p = rng.dirichlet(np.ones(4)) ** (1.0 / temperature)
        cum[i, succ] = p / p.sum()
    cum = cum.cumsum(1)
    toks = np.zeros((n, LM_SEQ + 1), np.int32)
    cur = rng.integers(0, LM_VOCAB, n)
    for t in range(LM_SEQ + 1):
        toks[:, t] = cur
        cur = np.minimum((rng.random(n)[:, None] > cum[cur]).sum(1), LM_VOCAB - 1)
    return toks


def _lm_batches(sc: Scenario) -> Callable[[], Iterator[tuple[Any, ...]]]:
    lm = sc.lm
    assert lm is not None
    temps = (1.0,) if lm.sources == 1 else tuple(0.75 + 0.25 * i for i in range(lm.sources))
    streams = [_markov(sc.seed * 10 + i, sc.steps * LM_BATCH // len(temps) + LM_BATCH, t)
               for i, t in enumerate(temps)]

    k = len(streams)
    chunk = LM_BATCH // k

    def gen() -> Iterator[tuple[Any, ...]]:
        for i in range(sc.steps):
            step = i + 1
            # one optimizer step's micro-batches: a chunk of each stream (their mean gradient is the update)
            toks = np.concatenate([src[i * chunk:(i + 1) * chunk] for src in streams])
            f = sc.fault_step
            at = f is not None and step >= f
            grad = np.float32(np.inf if lm.overflow_from and at else sc.grad_scale(step))
            mult = np.float32(np.nan if lm.nan_loss and step == f else 1.0)
            time.sleep(sc.loader_seconds(step))
            yield (toks[:, :-1], toks[:, 1:], np.array(grad, np.float32), np.array(mult, np.float32),
                   np.array(i % k, np.int32))

    return gen


class _Headroom(_GradScale):
    """`_GradScale` whose backward goes through LM_HEADROOM x the gradient (and divides it back: exact, powers of
    two): in float32 the loss-scaled gradients overflow at about 2^104 instead of 2^127, where the dynamic scale
    itself would have become Inf, so the scale overflows and halves every ~LM_SCALE_WINDOW steps, as an fp16 run's
    does against 65504."""

    def bprop(self, x: Any, scale: Any, out: Any, dout: Any) -> Any:
        return dout * scale * LM_HEADROOM / LM_HEADROOM, ops.zeros_like(scale)


class _LmLoss(nn.Cell):  # type: ignore[misc]
    """TinyLM's loss x the batch's `mult` (NaN on a poisoned step), its gradients x the batch's `grad`.

    With `sources` > 1 the batch is that many micro-batches (chunks) of different streams, as gradient
    accumulation adds them up: the gradient is that of their mean loss, while the loss returned (and logged) is
    micro-batch `pick`'s alone, the current micro-step's, as MindFormers logs it under accumulation."""

    def __init__(self, d: int, headroom: bool = False, sources: int = 1) -> None:
        super().__init__()
        self.lm, self.scale = TinyLM(LM_VOCAB, d, 2, 2), _Headroom() if headroom else _GradScale()
        self.sources = sources
        self.each = nn.CrossEntropyLoss(reduction="none")

    def construct(self, tokens: Any, labels: Any, grad: Any, mult: Any, pick: Any) -> Any:
        if self.sources == 1:
            return self.scale(self.lm(tokens, labels), grad) * mult
        lm = self.lm
        logits = lm.head(lm.encoder(lm.embed(tokens))).reshape(-1, lm.vocab)
        per = self.each(logits, labels.reshape(-1)).reshape(self.sources, -1).mean(axis=1)
        mean = per.mean()
        shown = ops.gather(per, pick, 0)
        return self.scale(mean + ops.stop_gradient(shown - mean), grad) * mult


class _LmRecorder(_Recorder):
    """`_Recorder` for the LM: the LR as scheduled (what the job logs), and the loss-scaling cell's overflow
    flag and scale when it has them."""

    def on_train_step_end(self, run_context: Any) -> None:
        super().on_train_step_end(run_context)
        c = run_context.original_args()
        row = self.rows[-1]
        row.lr = self.sc.lr(row.step)
        lm = self.sc.lm
        if lm is not None and lm.loss_scale:
            out = c.net_outputs
            row.overflow = bool(out[1].asnumpy())
            row.loss_scale = float(out[2].asnumpy())


def train_lm(sc: Scenario) -> list[Row]:
    """Train the LM scenario on the CPU: AdamW (weight decay 0.01), LR as `sc.optimizer_lr`; one row per step."""
    lm = sc.lm
    assert lm is not None
    ms.set_seed(sc.seed)
    net = _LmLoss(lm.d, headroom=lm.loss_scale, sources=lm.sources)
    opt = nn.AdamWeightDecay(net.trainable_params(), learning_rate=[sc.optimizer_lr(s) for s in range(1, sc.steps + 1)],
                             weight_decay=0.01)
    if lm.loss_scale:
        scale = nn.DynamicLossScaleUpdateCell(LM_SCALE0, 2, LM_SCALE_WINDOW)
        cell = TrainStepWithGradNormLossScale(net, opt, scale)
    else:
        cell = TrainStepWithGradNorm(net, opt)
    data = ds.GeneratorDataset(_lm_batches(sc), column_names=["tokens", "labels", "grad", "mult", "pick"],
                               shuffle=False)
    rec = _LmRecorder(sc)
    ms.Model(cell).train(1, data, callbacks=[rec], dataset_sink_mode=False)
    return rec.rows


def _num(v: float | None, fmt: str) -> str:
    if v is None:
        return ""
    return format(v, fmt) if math.isfinite(v) else str(v)


def write_trace(path: Path, rows: Sequence[Row], throughput_only: bool = False) -> None:
    """msmon CSV: the step's time, or (`throughput_only`) its samples/s and no time; `overflow` (1/0) and
    `loss_scale` when the rows have them."""
    scaling = any(r.overflow is not None for r in rows)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(("step", "loss", "learning_rate", "grad_norm", "throughput" if throughput_only else "time")
                   + (("overflow", "loss_scale") if scaling else ()))
        for r in rows:
            last = _num(r.throughput, ".6g") if throughput_only else _num(r.time, ".4f")
            extra = (int(bool(r.overflow)), _num(r.loss_scale, ".6g")) if scaling else ()
            w.writerow((r.step, _num(r.loss, ".6g"), _num(r.lr, ".6g"), _num(r.grad_norm, ".6g"), last) + extra)


def label_row(sc: Scenario, rows: Sequence[Row]) -> dict[str, str]:
    diverge = None
    if sc.kind == "training" and sc.fault_step is not None and sc.diverges:
        corrupt = range(sc.fault_step, sc.fault_step + sc.corrupt_steps)
        diverge = divergence_step(rows, sc.fault_step, skip=corrupt)
    return {"trace": f"{sc.name}.csv", "kind": sc.kind, "fault_step": str(sc.fault_step or ""),
            "diverge_step": str(diverge or ""), "format": "csv", "notes": f"{sc.notes}; seed {sc.seed}"}


def generate(scenarios: Sequence[Scenario], out: Path, log: Callable[[str], None] = print) -> list[dict[str, str]]:
    """Train each scenario, write OUT/NAME.csv, and return the label rows (not written)."""
    out.mkdir(parents=True, exist_ok=True)
    labels = []
    for sc in scenarios:
        t = time.perf_counter()
        rows = train_lm(sc) if sc.lm is not None else train(sc)
        write_trace(out / f"{sc.name}.csv", rows, sc.throughput_only)
        labels.append(label_row(sc, rows))
        log(f"{sc.name}: {len(rows)} steps in {time.perf_counter() - t:.1f} s; labels {labels[-1]}")
    return labels


def write_labels(path: Path, labels: Sequence[dict[str, str]]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=LABEL_COLUMNS)
        w.writeheader()
        w.writerows(labels)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--only", nargs="*", default=None, metavar="NAME", help="these scenarios (labels.csv is not "
                   "rewritten)")
    args = p.parse_args(argv)
    every = SCENARIOS + LM_SCENARIOS
    chosen = [s for s in every if args.only is None or s.name in args.only]
    if args.only is not None and len(chosen) != len(args.only):
        p.error(f"unknown scenario; scenarios are {', '.join(s.name for s in every)}")
    print(f"MindSpore {ms.__version__}, numpy {np.__version__}, python {sys.version.split()[0]}; writing {args.out}")
    labels = generate(chosen, args.out)
    if args.only is None:
        write_labels(args.out / "labels.csv", labels)
    print(f"done; {sum(os.path.getsize(p) for p in args.out.iterdir()) / 1e6:.2f} MB in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
