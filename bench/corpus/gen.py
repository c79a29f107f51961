"""Generate the detection corpus (issue 37): real MindSpore CPU training runs over a matrix of the runs users have,
clean and with every fault class injected at a random step, each written as a trace the backtest reads.

    nice -n 10 .venv/bin/python bench/corpus/gen.py --out /work/corpus --count 100 [--seed 37] [--only 3 7 ...]
        [--budget-min 40]

Each run is one small language model trained for real in GRAPH mode: an MLP LM (token embedding of width `width`,
the two previous tokens concatenated, a ReLU layer of 4 x width, a head over VOCAB = 128 tokens; weights initialised
small: N(0, 0.003^2) under Adam/AdamW, 0.05 under SGD, which at 0.003 never leaves the plateau), trained on a
synthetic token stream from a random low-rank Markov chain (the next token's logits U_a . W_b^T; entropy ~3.3 nats
against ln 128 = 4.85). From its small initialisation an Adam run sits on a plateau at the unigram loss (~4.65) with a
small grad norm for 100-300 optimizer steps, then leaves it: the loss falls to ~3.6 while the grad norm rises 2-3x
and settles at its new level (the "learning read as a coming divergence" of issue 37); an SGD run learns at once.

Gradient accumulation is real: one optimizer step is `accum` micro-batches of MICRO_BATCH examples, the update is
the gradient of their mean loss (computed in one graph call), and each micro-batch's own loss is returned. The log
is written as the run's `logging` says:

- `micro`: one row per micro-step, steps numbered in micro-steps, the micro-batch's own loss (MindFormers' log
  under accumulation); LR and grad norm repeat over the accum rows of one optimizer step;
- `opt`: one row per optimizer step, the mean loss of its micro-batches;
- `every_k`: a row every `log_every` (2 or 5) optimizer steps (MindFormers' per_print_times), steps numbered in
  optimizer steps;
- `sink`: a row every `log_every` (2 or 4) optimizer steps as a sink-mode callback sees them, with gaps: single rows
  missing and one or two blocks of 5-20 rows missing (evaluation, checkpointing).

A coarse log (every_k, sink) has an accumulation of 1, 2 or 4 (8 and 16 would cost too much training for its rows).
Runs are short for the 2-core machine they are made on: 250-1000 optimizer steps, 200-2000 rows.

Optimizers: SGD with momentum 0.9 (MindSpore nn.Momentum), Adam, AdamW (nn.AdamWeightDecay, weight decay 0.01).
Loss scaling (fp16 emulated on a float32 CPU): MindSpore's dynamic-scale rule (start 2^24, halve on overflow, double
after 50 good steps) against an fp16-like headroom: a step overflows when the unscaled grad norm x the scale is
2^20 or more (or not finite); its update is really skipped (the optimizer is not called), and the row logs
overflow 1, the scale, and a grad norm of inf, as an fp16 run's scaled gradients would.

Schedules (optimizer steps N, warmup W, peak P): constant; warmup_cosine (to P/10); cosine_to_zero (to exactly 0 at
N); wsd (stable until 0.8 N, linear to P/10); step_decay (x0.3 at 0.5 N and 0.75 N); sgdr (cosine restarts, period
N/7 doubling, each restart's peak x `restart_decay`). Extras: resume_reset (at a random step the optimizer is rebuilt:
moments reset, the step count continuing), resume_keep (a restart with the state kept: a 30-300 s gap in the time
column), finetune (the logged run starts from a model pretrained 200 steps on a related chain, with a fresh
optimizer), batch_ramp (a quarter of each micro-batch for the first 10% of the run, half until 20%).

Faults, injected at a random optimizer step F (`fault_opt_step` in the manifest):
- lr_jump: the LR x m (3, 5, 10 or 16) from F on, logged (unannounced);
- grad_creep: the gradients x 1.004^(s - F) from F on (logged grad norm creeps; the logged LR flat);
- bad_batch: 1-3 optimizer steps from F with one micro-batch's targets uniform random (a corrupt shard);
- diverge: the optimizer's LR x 1.04^(s - F), the logged LR as scheduled (a hidden blow-up), until the loss is
  non-finite; the run stops 5 steps after;
- nan: the loss x NaN at F (a poisoned batch): NaN weights from there, the run stops 5 steps after (with loss
  scaling the step is an overflow and is skipped, as fp16 training skips it);
- warmup_total: the schedule's warmup set to the total steps, to a peak of m x P (15-40): the LR still rising over the
  whole run. F = 0.1 N, where a normal warmup is over;
- lr_zero: the LR decays linearly to exactly 0 at F (40-70% of the run) and stays 0 (decay steps set too short):
  training stalls;
- data_repeat: from F on the loader repeats the same 4 optimizer steps' batches (a stuck shard, an epoch of 4).

Labels (the backtest's, `labels-*.csv`): `fault_step` is the first logged step at or after the fault's first
micro-step (in the log's own step numbers), `diverge_step` the backtest's divergence rule from there (bad_batch's
corrupt micro-batches left out). The manifest (`manifest.csv`, one row per run) adds the cell, the split, the fault
in optimizer steps, the accumulation factor and what a user could declare (`decl_*`: msmon's
`training.grad_accumulation_steps` for this log, `total_steps`, `warmup_steps`). The split (`tune` / `heldout`) is
a hash of the run's name: tune thresholds on `tune`, only score `heldout`.

The time column is not this shared machine's clock (six other jobs load it): it is a nominal step time per run x
a 3% jitter per step, so that the timing rules see a steady job and the corpus measures the training rules.

Deterministic from `--seed`: every spec and data stream is drawn from (seed, run index); MindSpore's own seed is set
per run. A run takes 3-20 s on one core; runs are written as they finish (an interrupted generation resumes where
it stopped: runs whose CSV and record exist are kept).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import hashlib
import importlib.util
import json
import math
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if importlib.util.find_spec("msmon") is None:  # PYTHONPATH may name another tree of msmon (a "before" export)
    sys.path.insert(0, str(ROOT))

import mindspore as ms  # noqa: E402
import numpy as np  # noqa: E402
from mindspore import nn, ops  # noqa: E402
from mindspore.common.initializer import Normal  # noqa: E402

from msmon.offline.backtest.engine import LABEL_COLUMNS, divergence_step  # noqa: E402
from msmon.offline.readers import Row  # noqa: E402

VOCAB, RANK, CHAIN_SCALE = 128, 8, 2.0
INIT = {"sgd_momentum": 0.05, "adam": 0.003, "adamw": 0.003}  # weights' initial std (SGD stays on the plateau at 0.003)
MICRO_BATCH = 32
SCHEDULES = ("constant", "warmup_cosine", "cosine_to_zero", "wsd", "step_decay", "sgdr")
FAULTS = ("clean", "lr_jump", "grad_creep", "bad_batch", "diverge", "nan", "warmup_total", "lr_zero", "data_repeat")
LOGGINGS = ("micro", "opt", "every_k", "sink")
ACCUMS = (1, 2, 4, 8, 16)
OPTIMIZERS = ("sgd_momentum", "adam", "adamw")
EXTRAS = ("none", "none", "resume_reset", "resume_keep", "finetune", "batch_ramp")
WIDTHS = (16, 32, 64)
BASE_LR = {"sgd_momentum": 0.3, "adam": 5e-3, "adamw": 5e-3}
MAX_OPT_STEPS = {1: 1000, 2: 800, 4: 500, 8: 300, 16: 250}  # bounds a run's cost (examples per step grow)
SCALE0, SCALE_WINDOW, HEADROOM = 2.0 ** 24, 50, 2.0 ** 20
CREEP = 1.004
DIVERGE_GROWTH = 1.04
STOP_AFTER_NONFINITE = 5
MANIFEST_COLUMNS = (
    "run", "split", "cell", "kind", "fault", "schedule", "accum", "logging", "log_every", "optimizer", "loss_scale",
    "extra", "width", "seed", "opt_steps", "warmup", "peak_lr", "fault_opt_step", "fault_param", "fault_step",
    "diverge_step", "diverge_opt_step", "rows", "rows_per_opt_step", "decl_grad_accumulation_steps",
    "decl_total_steps", "decl_warmup_steps", "seconds", "notes")


@dataclasses.dataclass(frozen=True)
class Spec:
    """One run of the corpus, fully determined by (corpus seed, index)."""

    index: int
    seed: int
    fault: str
    schedule: str
    accum: int
    logging: str
    log_every: int
    optimizer: str
    loss_scale: bool
    extra: str
    width: int
    opt_steps: int
    warmup: int
    peak_lr: float
    fault_opt: int | None
    fault_param: float
    extra_at: int  # the resume step (resume_*)
    restart_decay: float  # sgdr
    step_seconds: float

    @property
    def name(self) -> str:
        return f"r{self.index:04d}-{self.fault}-{self.schedule}-a{self.accum}-{self.logging}"

    @property
    def split(self) -> str:
        return split_of(self.name)

    @property
    def kind(self) -> str:
        return "clean" if self.fault == "clean" else "training"

    @property
    def cell(self) -> str:
        return f"{self.schedule}/a{self.accum}/{self.logging}/{self.fault}"

    def rows_per_opt_step(self) -> float:
        return float(self.accum) if self.logging == "micro" else 1.0 / self.log_every

    # -- the LR -------------------------------------------------------------------------------------------------
    def scheduled_lr(self, s: int) -> float:
        """The LR the log shows at optimizer step s (1-based): the schedule, x an lr_jump from the fault on."""
        n, w, p = self.opt_steps, self.warmup, self.peak_lr
        if self.fault == "warmup_total":
            base = p * self.fault_param * s / n
        elif self.fault == "lr_zero":
            z = self.fault_opt or n
            base = p * min(1.0, s / w) if s <= w else p * max(0.0, (z - s) / (z - w))
        elif s <= w:
            base = p * s / w
        else:
            base = p * _decay(self.schedule, (s - w) / max(n - w, 1), self.restart_decay)
        if self.fault == "lr_jump" and self.fault_opt is not None and s >= self.fault_opt:
            base *= self.fault_param
        return base

    def hidden_lr_factor(self, s: int) -> float:
        if self.fault == "diverge" and self.fault_opt is not None and s >= self.fault_opt:
            return float(DIVERGE_GROWTH ** (s - self.fault_opt))
        return 1.0

    def grad_factor(self, s: int) -> float:
        if self.fault == "grad_creep" and self.fault_opt is not None and s >= self.fault_opt:
            return float(CREEP ** (s - self.fault_opt))
        return 1.0


def _decay(schedule: str, k: float, restart_decay: float) -> float:
    """The schedule after warmup, k in [0, 1] of the remaining steps, as a fraction of the peak."""
    if schedule == "constant":
        return 1.0
    if schedule == "warmup_cosine":
        return 0.1 + 0.45 * (1 + math.cos(math.pi * k))
    if schedule == "cosine_to_zero":
        return 0.5 * (1 + math.cos(math.pi * min(k, 1.0)))
    if schedule == "wsd":
        return 1.0 if k < 0.75 else 1.0 - 0.9 * (k - 0.75) / 0.25
    if schedule == "step_decay":
        return 1.0 if k < 0.5 else 0.3 if k < 0.75 else 0.09
    if schedule == "sgdr":  # periods 1, 2, 4 (in sevenths of the run)
        t, period, peak = k * 7.0, 1.0, 1.0
        while t >= period and period < 4:
            t, period, peak = t - period, period * 2, peak * restart_decay
        return peak * (0.05 + 0.475 * (1 + math.cos(math.pi * min(t / period, 1.0))))
    raise ValueError(f"unknown schedule {schedule!r}; schedules are {', '.join(SCHEDULES)}")


def split_of(name: str) -> str:
    """`tune` or `heldout`, from a hash of the run's name (never from its results)."""
    return "heldout" if hashlib.sha256(("split" + name).encode()).digest()[0] % 2 else "tune"


def spec_for(index: int, corpus_seed: int = 37) -> Spec:
    """The run at `index`: half the runs are clean (even indexes), the others cycle through the faults; every other
    dimension is drawn from (corpus_seed, index)."""
    rng = np.random.default_rng([corpus_seed, index])
    fault = "clean" if index % 2 == 0 else FAULTS[1 + (index // 2) % (len(FAULTS) - 1)]
    schedule = SCHEDULES[(index // 2 + index // 16) % len(SCHEDULES)]
    if fault == "warmup_total":
        schedule = "constant"  # (the LR is the misconfigured warmup's: see Spec.scheduled_lr)
    if fault == "lr_zero":
        schedule = "wsd"
    accum = int(rng.choice(ACCUMS))
    logging = str(rng.choice(LOGGINGS, p=(0.35, 0.25, 0.2, 0.2)))
    if logging == "micro" and accum == 1:
        logging = "opt"
    if logging in ("every_k", "sink") and accum > 4:  # a coarse log of a costly step: too few rows for the time
        accum = int(rng.choice((1, 2, 4)))
    log_every = {"micro": 1, "opt": 1, "every_k": int(rng.choice((2, 5))), "sink": int(rng.choice((2, 4)))}[
        logging]
    rows_target = int(rng.integers(800, 2001))
    rows_per = accum if logging == "micro" else 1.0 / log_every
    cap = MAX_OPT_STEPS[accum] if logging in ("micro", "opt") else 1000
    opt_steps = int(min(cap, max(250 if logging == "micro" else 600, rows_target / rows_per)))
    optimizer = str(rng.choice(OPTIMIZERS))
    extra = str(rng.choice(EXTRAS))
    width = int(rng.choice(WIDTHS))
    warmup = 0 if schedule == "constant" else int(max(10, opt_steps * rng.uniform(0.02, 0.1)))
    if fault == "lr_zero":
        warmup = int(max(10, opt_steps * 0.05))
    peak = BASE_LR[optimizer] * float(rng.choice((0.5, 1.0, 2.0)))
    fault_opt: int | None = None
    param = 0.0
    if fault == "warmup_total":
        fault_opt, param = max(2, round(0.1 * opt_steps)), float(rng.uniform(15, 40))
    elif fault == "lr_zero":
        fault_opt = int(opt_steps * rng.uniform(0.4, 0.7))
    elif fault != "clean":
        fault_opt = int(opt_steps * rng.uniform(0.25, 0.75))
        if fault == "lr_jump":
            param = float(rng.choice((3, 5, 10, 16)))
        elif fault == "bad_batch":
            param = float(rng.integers(1, 4))
    extra_at = int(opt_steps * rng.uniform(0.3, 0.7))
    if fault_opt is not None and abs(extra_at - fault_opt) < 50:
        extra_at = max(60, fault_opt - 100)
    return Spec(index=index, seed=corpus_seed * 10_000 + index, fault=fault, schedule=schedule, accum=accum,
                logging=logging, log_every=log_every, optimizer=optimizer, loss_scale=bool(rng.random() < 0.3),
                extra=extra, width=width, opt_steps=opt_steps, warmup=warmup, peak_lr=peak, fault_opt=fault_opt,
                fault_param=param, extra_at=extra_at, restart_decay=float(rng.choice((1.0, 0.8))),
                step_seconds=float(rng.uniform(0.2, 1.5)))


# -- data -------------------------------------------------------------------------------------------------------

def chain(seed: int) -> Any:
    """A random low-rank Markov chain over VOCAB tokens: row a is the next token's distribution after a."""
    rng = np.random.default_rng(seed)
    u, w = rng.standard_normal((VOCAB, RANK)), rng.standard_normal((VOCAB, RANK))
    logits = CHAIN_SCALE * u @ w.T / math.sqrt(RANK)
    p = np.exp(logits - logits.max(1, keepdims=True))
    return p / p.sum(1, keepdims=True)


class Sampler:
    """Examples (the two previous tokens, the next one) from a chain, drawn from its own generator."""

    def __init__(self, p: Any, seed: int) -> None:
        cum = np.cumsum(p, 1)
        cum[:, -1] = 1.0
        self.flat = (cum + np.arange(VOCAB)[:, None]).ravel()
        self.rng = np.random.default_rng(seed)

    def _next(self, cur: Any) -> Any:
        return np.minimum(np.searchsorted(self.flat, cur + self.rng.random(len(cur))) - cur * VOCAB, VOCAB - 1)

    def draw(self, n: int) -> tuple[Any, Any]:
        a = self.rng.integers(0, VOCAB, n)
        b = self._next(a)
        return np.stack([a, b], 1).astype(np.int32), self._next(b).astype(np.int32)


# -- the model and the step (MindSpore) --------------------------------------------------------------------------

class MlpLM(nn.Cell):  # type: ignore[misc]
    """The LM: two previous tokens' embeddings -> ReLU layer of 4 x width -> logits; per-example cross-entropy."""

    def __init__(self, width: int, init: float) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, width, embedding_table=Normal(init))
        self.hidden = nn.Dense(2 * width, 4 * width, weight_init=Normal(init), activation="relu")
        self.head = nn.Dense(4 * width, VOCAB, weight_init=Normal(init))
        self.ce = nn.CrossEntropyLoss(reduction="none")

    def construct(self, x: Any, y: Any) -> Any:
        return self.ce(self.head(self.hidden(self.emb(x).reshape(x.shape[0], -1))), y)


class MeanLoss(nn.Cell):  # type: ignore[misc]
    """The optimizer step's loss: the mean over its micro-batches' live examples, x `mult` (the gradient factor of
    grad_creep; NaN for a poisoned batch)."""

    def __init__(self, net: Any) -> None:
        super().__init__()
        self.net = net

    def construct(self, x: Any, y: Any, m: Any, mult: Any) -> Any:
        return (self.net(x, y) * m).sum() / m.sum() * mult


class Step(nn.Cell):  # type: ignore[misc]
    """One optimizer step over `accum` micro-batches: returns each micro-batch's loss, the global grad norm (before
    the update) and whether the step overflowed (emulated fp16: the unscaled norm x the scale >= HEADROOM, or not
    finite); the update is skipped on overflow. `ctl` = (gradient factor, LR, loss scale, 1: scaled)."""

    def __init__(self, net: Any, opt: Any, accum: int) -> None:
        super().__init__()
        self.net, self.opt, self.loss, self.accum = net, opt, MeanLoss(net), accum
        self.weights = opt.parameters
        self.grad = ops.GradOperation(get_by_list=True)

    def construct(self, x: Any, y: Any, m: Any, ctl: Any) -> Any:
        mult, lr, scale, scaled = ctl[0], ctl[1], ctl[2], ctl[3]
        ce = self.net(x, y) * m
        per = ce.reshape(self.accum, -1).sum(1) / m.reshape(self.accum, -1).sum(1) * mult
        grads = self.grad(self.loss, self.weights)(x, y, m, mult)
        norm = ops.sqrt(ops.addn([ops.reduce_sum(ops.square(g)) for g in grads]))
        overflow = ops.logical_and(scaled > 0.5, ops.logical_not(norm * scale < HEADROOM))
        if not overflow:
            ops.assign(self.opt.learning_rate, lr)
            self.opt(grads)
        return ops.concat((per, norm.reshape(1), overflow.astype(ms.float32).reshape(1)))


class PlainStep(Step):
    """`Step` without loss scaling: the update always applied (no control flow)."""

    def construct(self, x: Any, y: Any, m: Any, ctl: Any) -> Any:
        mult, lr = ctl[0], ctl[1]
        ce = self.net(x, y) * m
        per = ce.reshape(self.accum, -1).sum(1) / m.reshape(self.accum, -1).sum(1) * mult
        grads = self.grad(self.loss, self.weights)(x, y, m, mult)
        norm = ops.sqrt(ops.addn([ops.reduce_sum(ops.square(g)) for g in grads]))
        ops.assign(self.opt.learning_rate, lr)
        norm = ops.depend(norm, self.opt(grads))
        return ops.concat((per, norm.reshape(1), ops.zeros(1, ms.float32)))


def _build(width: int, optimizer: str, accum: int, scaled: bool) -> tuple[Any, Callable[[], Any]]:
    """The network and a factory of its compiled train step for a fresh optimizer (a resume rebuilds it)."""
    net = MlpLM(width, INIT[optimizer])

    def step_cell() -> Any:
        params = net.trainable_params()
        lr0 = ms.Tensor(1e-3, ms.float32)
        if optimizer == "sgd_momentum":
            opt = nn.Momentum(params, learning_rate=lr0, momentum=0.9)
        elif optimizer == "adam":
            opt = nn.Adam(params, learning_rate=lr0)
        else:
            opt = nn.AdamWeightDecay(params, learning_rate=lr0, weight_decay=0.01)
        return (Step if scaled else PlainStep)(net, opt, accum)

    return net, step_cell


@dataclasses.dataclass
class OptStep:
    """What one optimizer step logged."""

    s: int
    losses: list[float]
    grad_norm: float
    lr: float
    overflow: bool | None
    loss_scale: float | None
    time: float
    bad_micro: int | None = None  # the corrupt micro-batch of a bad_batch step


def train(spec: Spec) -> list[OptStep]:
    """Train the run on the CPU; one OptStep per optimizer step (the run may stop early after a NaN)."""
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU", runtime_num_threads=1)
    ms.set_seed(spec.seed)
    rng = np.random.default_rng(spec.seed + 1)
    p = chain(spec.seed)
    net, step_cell = _build(spec.width, spec.optimizer, spec.accum, spec.loss_scale)
    k, b = spec.accum, MICRO_BATCH

    def run_steps(cell: Any, sampler: Sampler, steps: int, lr: float) -> None:  # the fine-tune's pretraining
        ones, ctl = ms.Tensor(np.ones(k * b, np.float32)), ms.Tensor(np.array([1.0, lr, 1.0, 0.0], np.float32))
        xs, ys = sampler.draw(steps * k * b)
        for i in range(steps):
            cell(ms.Tensor(xs[i * k * b:(i + 1) * k * b]), ms.Tensor(ys[i * k * b:(i + 1) * k * b]), ones, ctl)

    if spec.extra == "finetune":
        run_steps(step_cell(), Sampler(p, spec.seed + 2), 200, BASE_LR[spec.optimizer])
        p = 0.5 * p + 0.5 * chain(spec.seed + 5000)  # the fine-tune's data: related, not the same
    sampler = Sampler(p, spec.seed + 3)
    cell = step_cell()
    scale = SCALE0
    good = 0
    t = 0.0
    repeat: list[tuple[Any, Any]] = []
    out: list[OptStep] = []
    nonfinite = 0
    xs, ys = sampler.draw(spec.opt_steps * k * b)
    masks: dict[int, Any] = {}
    for s in range(1, spec.opt_steps + 1):
        if spec.extra == "resume_reset" and s == spec.extra_at:
            cell = step_cell()  # a resume that restores the weights but not the optimizer's moments
        x, y = xs[(s - 1) * k * b:s * k * b], ys[(s - 1) * k * b:s * k * b]
        f = spec.fault_opt
        bad = None
        if spec.fault == "bad_batch" and f is not None and f <= s < f + spec.fault_param:
            bad = int(rng.integers(0, k))
            y = y.copy()
            y[bad * b:(bad + 1) * b] = rng.integers(0, VOCAB, b)
        if spec.fault == "data_repeat" and f is not None and s >= f:
            if len(repeat) < 4:
                repeat.append((x, y))
            x, y = repeat[(s - f) % 4] if len(repeat) == 4 else repeat[-1]
        live = b
        if spec.extra == "batch_ramp":
            live = b // 4 if s <= 0.1 * spec.opt_steps else b // 2 if s <= 0.2 * spec.opt_steps else b
        if live not in masks:
            m = np.zeros((k, b), np.float32)
            m[:, :live] = 1.0
            masks[live] = ms.Tensor(m.ravel())
        mult = spec.grad_factor(s) * (math.nan if spec.fault == "nan" and s == f else 1.0)
        lr = spec.scheduled_lr(s)
        ctl = np.array([mult, lr * spec.hidden_lr_factor(s), scale, float(spec.loss_scale)], np.float32)
        got = cell(ms.Tensor(x), ms.Tensor(y), masks[live], ms.Tensor(ctl)).asnumpy()
        losses = [float(v) for v in got[:k]]
        if spec.fault == "grad_creep":  # the factor scales the gradient; the loss logged is the model's own
            losses = [v / spec.grad_factor(s) for v in losses]
        grad = float(got[k])
        overflow = bool(got[k + 1] > 0.5) if spec.loss_scale else None
        used = scale if spec.loss_scale else None
        if spec.loss_scale:
            if overflow:
                grad, scale, good = math.inf, max(scale / 2, 1.0), 0
            else:
                good += 1
                if good >= SCALE_WINDOW:
                    scale, good = scale * 2, 0
        dt = spec.step_seconds * max(0.5, 1.0 + 0.03 * float(rng.standard_normal()))
        if spec.extra == "resume_keep" and s == spec.extra_at:
            dt += float(rng.uniform(30, 300))
        t += dt
        out.append(OptStep(s, losses, grad, lr, overflow, used, t, bad))
        nonfinite = nonfinite + 1 if not all(math.isfinite(v) for v in losses) else 0
        if nonfinite > STOP_AFTER_NONFINITE:
            break
    return out


# -- the trace --------------------------------------------------------------------------------------------------

def rows_of(spec: Spec, steps: Sequence[OptStep]) -> tuple[list[Row], set[int]]:
    """The log the run writes (see the module's docstring), and the steps of rows that are a corrupt micro-batch's
    own loss (left out of the divergence rule)."""
    rows: list[Row] = []
    corrupt: set[int] = set()
    rng = np.random.default_rng(spec.seed + 4)
    dropped: set[int] = set()
    if spec.logging == "sink":
        for _ in range(int(rng.integers(1, 3))):
            start = int(rng.integers(1, max(2, spec.opt_steps)))
            dropped.update(range(start, start + spec.log_every * int(rng.integers(5, 21))))
    for st in steps:
        scaled = st.overflow is not None
        extra: dict[str, Any] = {"overflow": st.overflow, "loss_scale": st.loss_scale} if scaled else {}
        if spec.logging == "micro":
            k = spec.accum
            for j, loss in enumerate(st.losses):
                step = (st.s - 1) * k + j + 1
                if st.bad_micro == j:
                    corrupt.add(step)
                rows.append(Row(step, loss=loss, lr=st.lr, grad_norm=st.grad_norm,
                                time=st.time - spec.step_seconds * (k - 1 - j) / k, **extra))
            continue
        if spec.logging in ("every_k", "sink") and st.s % spec.log_every:
            continue
        if spec.logging == "sink" and (st.s in dropped or rng.random() < 0.03):
            continue
        loss = float(np.mean(st.losses))
        if st.bad_micro is not None:
            corrupt.add(st.s)
        rows.append(Row(st.s, loss=loss, lr=st.lr, grad_norm=st.grad_norm, time=st.time, **extra))
    return rows, corrupt


def row_step(spec: Spec, opt_step: int) -> int:
    """The log's step number of an optimizer step's first row (micro-steps under `micro` logging)."""
    return (opt_step - 1) * spec.accum + 1 if spec.logging == "micro" else opt_step


def opt_step_of(logging: str, accum: int, step: int) -> int:
    """The optimizer step a logged step number belongs to."""
    return (step - 1) // accum + 1 if logging == "micro" else step


def _num(v: float | None, fmt: str) -> str:
    if v is None:
        return ""
    return format(v, fmt) if math.isfinite(v) else str(v)


def write_trace(path: Path, rows: Sequence[Row]) -> None:
    """msmon CSV: step, loss, learning_rate, grad_norm, time (+ overflow, loss_scale under loss scaling)."""
    scaling = any(r.overflow is not None for r in rows)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(("step", "loss", "learning_rate", "grad_norm", "time") + (("overflow", "loss_scale") if scaling
                                                                              else ()))
        for r in rows:
            extra = (int(bool(r.overflow)), _num(r.loss_scale, ".6g")) if scaling else ()
            w.writerow((r.step, _num(r.loss, ".6g"), _num(r.lr, ".6g"), _num(r.grad_norm, ".6g"),
                        _num(r.time, ".3f")) + extra)


def record(spec: Spec, rows: Sequence[Row], corrupt: set[int], seconds: float) -> dict[str, str]:
    """The run's manifest row."""
    fault_step = diverge = diverge_opt = None
    if spec.fault_opt is not None:
        first = row_step(spec, spec.fault_opt)
        fault_step = next((r.step for r in rows if r.step >= first), None)
        if fault_step is not None:
            diverge = divergence_step(rows, fault_step, skip=corrupt)
            diverge_opt = None if diverge is None else opt_step_of(spec.logging, spec.accum, diverge)
    notes = (f"{spec.optimizer}, width {spec.width}, peak LR {spec.peak_lr:g}, warmup {spec.warmup}, "
             f"{'loss scaling, ' if spec.loss_scale else ''}{spec.extra}")
    decl_warmup = spec.opt_steps if spec.fault == "warmup_total" else spec.warmup
    values: dict[str, Any] = {
        "run": spec.name, "split": spec.split, "cell": spec.cell, "kind": spec.kind, "fault": spec.fault,
        "schedule": spec.schedule, "accum": spec.accum, "logging": spec.logging, "log_every": spec.log_every,
        "optimizer": spec.optimizer, "loss_scale": int(spec.loss_scale), "extra": spec.extra, "width": spec.width,
        "seed": spec.seed, "opt_steps": spec.opt_steps, "warmup": spec.warmup, "peak_lr": f"{spec.peak_lr:g}",
        "fault_opt_step": spec.fault_opt, "fault_param": f"{spec.fault_param:g}" if spec.fault_param else "",
        "fault_step": fault_step, "diverge_step": diverge, "diverge_opt_step": diverge_opt, "rows": len(rows),
        "rows_per_opt_step": f"{spec.rows_per_opt_step():g}",
        "decl_grad_accumulation_steps": spec.accum if spec.logging == "micro" else 1,
        "decl_total_steps": spec.opt_steps, "decl_warmup_steps": decl_warmup, "seconds": f"{seconds:.1f}",
        "notes": notes,
    }
    return {c: "" if values[c] is None else str(values[c]) for c in MANIFEST_COLUMNS}


def generate_one(spec: Spec, out: Path) -> dict[str, str]:
    t0 = time.perf_counter()
    steps = train(spec)
    rows, corrupt = rows_of(spec, steps)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    write_trace(out / "runs" / f"{spec.name}.csv", rows)
    rec = record(spec, rows, corrupt, time.perf_counter() - t0)
    (out / "runs" / f"{spec.name}.json").write_text(json.dumps(rec, indent=1) + "\n", encoding="utf-8")
    return rec


def read_records(out: Path) -> list[dict[str, str]]:
    return [json.loads(p.read_text(encoding="utf-8")) for p in sorted((out / "runs").glob("*.json"))]


def write_index(out: Path, records: Sequence[dict[str, str]]) -> None:
    """manifest.csv and the backtest's labels: labels-all.csv, labels-tune.csv, labels-heldout.csv."""
    with open(out / "manifest.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=MANIFEST_COLUMNS)
        w.writeheader()
        w.writerows(records)
    for split in ("all", "tune", "heldout"):
        with open(out / f"labels-{split}.csv", "w", newline="", encoding="utf-8") as f:
            lw = csv.DictWriter(f, fieldnames=LABEL_COLUMNS)
            lw.writeheader()
            for r in records:
                if split in ("all", r["split"]):
                    lw.writerow({"trace": f"runs/{r['run']}.csv", "kind": r["kind"], "fault_step": r["fault_step"],
                                 "diverge_step": r["diverge_step"], "format": "csv",
                                 "notes": f"{r['cell']}; {r['notes']}"})


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="the corpus folder (runs/, manifest.csv, labels-*.csv)")
    p.add_argument("--count", type=int, default=100, help="runs 0 .. COUNT-1 (default: %(default)s)")
    p.add_argument("--seed", type=int, default=37, help="the corpus seed (default: %(default)s)")
    p.add_argument("--only", type=int, nargs="*", default=None, metavar="INDEX", help="these run indexes only")
    p.add_argument("--budget-min", type=float, default=None, help="stop starting new runs after this many minutes")
    p.add_argument("--redo", action="store_true", help="regenerate runs that already exist")
    args = p.parse_args(argv)
    out: Path = args.out
    (out / "runs").mkdir(parents=True, exist_ok=True)
    indexes = args.only if args.only is not None else list(range(args.count))
    t0 = time.monotonic()
    for i in indexes:
        spec = spec_for(i, args.seed)
        done = (out / "runs" / f"{spec.name}.json").exists() and (out / "runs" / f"{spec.name}.csv").exists()
        if done and not args.redo:
            continue
        if args.budget_min is not None and time.monotonic() - t0 > 60 * args.budget_min:
            print(f"budget of {args.budget_min:g} min spent; stopping before run {i} (rerun to go on)", flush=True)
            break
        try:
            rec = generate_one(spec, out)
        except Exception:  # noqa: BLE001 - one broken run must not stop the corpus; its traceback says why
            traceback.print_exc()
            print(f"{spec.name}: FAILED (above); the other runs go on", flush=True)
            continue
        write_index(out, read_records(out))
        print(f"{rec['run']} [{rec['split']}] {rec['rows']} rows in {rec['seconds']} s; fault_step "
              f"{rec['fault_step'] or '-'} diverge {rec['diverge_step'] or '-'}", flush=True)
    write_index(out, read_records(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
