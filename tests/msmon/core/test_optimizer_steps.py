"""The rules see one optimizer step as one step, whatever the log's granularity, and read an LR schedule as one
(issue 37).

The logs per micro-step are the repository's real MindSpore CPU LM traces (data/backtest/mindspore-cpu, one row per
optimizer step) written out as MindFormers writes them under gradient accumulation: k rows per optimizer step with
its LR and grad norm repeated and each micro-batch's own loss (a wave of period k, +-8%)."""

from __future__ import annotations

import copy
import csv
import logging
import random
from pathlib import Path
from typing import Any

import pytest
import yaml

from msmon.contract.wire import Event, Severity, Status
from msmon.core.accumulation import Infer
from msmon.offline.readers import Row, read_log
from msmon.offline.replay import replay
from notifier import Monitor
from tests.conftest import ROOT

CPU = ROOT / "data" / "backtest" / "mindspore-cpu"


def _config(step_interval: int = 1, **training: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = yaml.safe_load((ROOT / "config" / "monitor.yaml").read_text())
    mc = cfg["monitor_config"]
    mc["tensorboard"] = {"enable": False}
    mc["step_interval"] = step_interval
    mc["training"] = training
    return cfg


def _micro_steps(name: str, k: int, lr_times: tuple[int, float] | None = None) -> list[Row]:
    """Trace `name` as k rows per optimizer step (see the module's doc); `lr_times` (step, x): the logged LR x from
    that optimizer step on."""
    rng = random.Random(5)
    wave = [0.92 + 0.16 * i / (k - 1) for i in range(k)]
    rows: list[Row] = []
    with open(CPU / f"{name}.csv") as f:
        for r in csv.DictReader(f):
            opt, lr = int(r["step"]), float(r["learning_rate"])
            if lr_times is not None and opt >= lr_times[0]:
                lr *= lr_times[1]
            for i in range(k):
                rows.append(Row(step=(opt - 1) * k + i + 1, loss=float(r["loss"]) * wave[i] * (1 + rng.gauss(0, 0.01)),
                                lr=lr, grad_norm=float(r["grad_norm"]), time=float(r["time"]) + 0.05 * i))
    return rows


def _alerts(rows: list[Row], cfg: dict[str, Any]) -> list[Event]:
    logging.getLogger("msmon").setLevel(logging.CRITICAL)
    try:
        return [e for e in replay(rows, Monitor(copy.deepcopy(cfg), "t", sinks=[]))
                if e.status is Status.FIRING and not e.repeat]
    finally:
        logging.getLogger("msmon").setLevel(logging.NOTSET)


@pytest.mark.parametrize("k, start", [(4, 1), (8, 0), (16, 1)])
def test_rows_per_optimizer_step_are_read_from_the_log(k: int, start: int) -> None:
    infer = Infer()
    answer = None
    for step in range(start, start + 200):
        opt = (step - start) // k
        answer = infer.feed(step, 1e-4 * (opt + 1), 0.5 + 0.01 * opt)  # a warmup's staircase
        if answer is not None:
            break
    assert answer == (k, (start + k - 1) % k)


@pytest.mark.parametrize("rows", [
    [(s, 1e-3, 0.5 + 0.001 * s) for s in range(1, 200)],  # one row per optimizer step
    [(s, 1e-3, 1.0) for s in range(1, 200)],  # a constant LR and a clipped grad norm
    [(10 * s, 1e-3 * (s // 4 + 1), 0.5 + (s // 4)) for s in range(1, 200)],  # every 10th step
    [(s, 1e-3, None) for s in range(1, 200)],  # no grad norm
])
def test_no_accumulation_is_read_where_the_rows_do_not_show_one(rows: list[tuple[int, float, float | None]]) -> None:
    infer = Infer()
    answers = [infer.feed(*r) for r in rows]
    assert infer.settle()[0] == 1 and answers[-1] == (1, 0)


@pytest.mark.parametrize("step_interval", [1, 10])
@pytest.mark.parametrize("name, k", [("lm-cosine-s3", 4), ("lm-wsd-s4", 8), ("lm-const-s1", 8), ("lm-cosine-s3", 16)])
def test_a_clean_run_logged_per_micro_step_raises_nothing(name: str, k: int, step_interval: int) -> None:
    """Before: lr_schedule WARNING at step 5-9 on the warmup's first stair (and its reminders all run), and 13-17
    grad_norm_creep WARNINGs at k 8 (the micro-steps' repeated grad norms fitted as a trend)."""
    assert _alerts(_micro_steps(name, k), _config(step_interval)) == []


@pytest.mark.parametrize("declared", [None, 4])
def test_an_lr_jump_under_accumulation_is_flagged_at_its_optimizer_step(declared: int | None) -> None:
    """LR x16 at optimizer step 300, after the warmup's staircase (accumulation 4, one row per micro-step): a
    WARNING at its optimizer step, with the accumulation declared or read from the rows. Declared, step() numbers
    micro-steps from 0 and optimizer steps from 0 (micro-steps 0-3 are optimizer step 0), so it is step 299 there."""
    cfg = _config(1, **({} if declared is None else {"grad_accumulation_steps": declared}))
    rows = _micro_steps("lm-cosine-s3", 4, lr_times=(300, 16.0))
    if declared is not None:  # step() numbers micro-steps from 0 when accumulation is declared
        rows = [Row(step=r.step - 1, loss=r.loss, lr=r.lr, grad_norm=r.grad_norm, time=r.time) for r in rows]
    lr = [e for e in _alerts(rows, cfg) if e.rule == "lr_schedule"]
    assert lr and lr[0].step == (300 if declared is None else 299) and lr[0].severity is Severity.WARNING, lr


def _lr_events(lrs: list[float], **training: Any) -> list[Event]:
    mon = Monitor(_config(1, grad_accumulation_steps=1, **training), "t", sinks=[])
    events: list[Event] = []
    for i, lr in enumerate(lrs):
        events.extend(e for e in mon.step(i + 1, loss=2.0, lr=lr, grad_norm=1.0, time=float(i))
                      if e.rule == "lr_schedule" and e.status is Status.FIRING)
    return events


def test_a_change_while_another_is_held_is_its_own_alert() -> None:
    """An unannounced change held (right or wrong) must not swallow the next: LR 1e-3, 2e-3 from step 200 (held),
    x16 from step 400: two alerts, each at its step, the second no reminder of the first."""
    lrs = [1e-3] * 199 + [2e-3] * 200 + [3.2e-2] * 300
    events = _lr_events(lrs)
    assert [(e.step, e.repeat) for e in events][:2] == [(200, False), (400, False)], events
    assert "on top of the one at step 200" in events[1].message


def test_a_warmup_as_long_as_the_run_is_a_warning_from_mid_run() -> None:
    """total_steps 2000, the LR rising in stairs of 4 steps all the run: one WARNING episode from step 1001 on (the
    stairs' holds do not resolve it), long before the end."""
    lrs = [1e-5 * (1 + s // 4) for s in range(2000)]
    events = _lr_events(lrs, total_steps=2000)
    assert events and events[0].step == 1001 and events[0].severity is Severity.WARNING
    assert [e for e in events if not e.repeat] == events[:1], events


@pytest.mark.parametrize("first", [1, 0])
def test_a_staircase_warmup_without_a_grad_norm_is_a_schedule(first: int) -> None:
    """A log with no grad norm cannot show its accumulation; the LR's stairs (8 rows each, warmup to step 800, then
    constant) are still a warmup, not a change, whether the first stair is the peak's 1/100 or 0 (MindFormers'
    linear warmup starts at 0; a rise from 0 divided by zero in the message before)."""
    lrs = [1e-5 * (first + min(s, 799) // 8) for s in range(3000)]
    assert _lr_events(lrs) == []


def test_the_micro_step_rows_are_folded_into_optimizer_steps_for_the_rules(tmp_path: Path) -> None:
    """A replayed per-micro-step log: the rules' samples are optimizer steps, the loss each step's mean."""
    rows = _micro_steps("lm-const-s1", 4)[:400]
    mon = Monitor(_config(1), "t", sinks=[])
    replay(rows, mon)
    steps = [s.step for s in mon.recent()]
    assert steps[-1] == 100 and len(steps) == 100
    first = sum(r.loss for r in rows[:4] if r.loss is not None) / 4
    assert mon.recent()[0].loss == pytest.approx(first)
    assert read_log  # the readers give the same Row objects replay takes


def _creep_events(loss: Any, grad: Any, steps: int = 2000) -> list[Event]:
    """grad_norm_creep's alerts on `steps` optimizer steps of loss(step) and grad(step), with 1% noise on each."""
    rng = random.Random(7)
    mon = Monitor(_config(1, grad_accumulation_steps=1), "t", sinks=[])
    events: list[Event] = []
    for s in range(1, steps + 1):
        events.extend(e for e in mon.step(s, loss=loss(s) * (1 + rng.gauss(0, 0.01)), lr=1e-3,
                                          grad_norm=grad(s) * (1 + rng.gauss(0, 0.01)), time=float(s))
                      if e.rule == "grad_norm_creep" and e.status is Status.FIRING)
    return events


def _smooth(a: float, b: float, start: int, end: int) -> Any:
    """a before `start`, b after `end`, a smooth (log-linear) path between."""
    def f(s: int) -> float:
        x = min(max((s - start) / (end - start), 0.0), 1.0)
        return a * (b / a) ** x
    return f


def test_a_grad_norm_rising_while_the_loss_leaves_its_plateau_is_learning() -> None:
    """A small LM leaving its plateau at step 600: the loss 5.47 -> 4.67 over 200 steps while the grad norm rises
    0.23 -> 3.5 and settles at 1.2. Before: grad_norm_creep ERROR at the rise, reminders after it."""
    loss = _smooth(5.47, 4.67, 600, 800)
    rise, settle = _smooth(0.23, 3.5, 600, 780), _smooth(3.5, 1.2, 780, 900)
    assert _creep_events(loss, lambda s: rise(s) if s < 780 else settle(s)) == []


def test_a_grad_norm_climbing_while_the_loss_is_flat_is_a_creep() -> None:
    """The 13B case: the loss flat at 1.82, the grad norm +0.4% a step from step 1000: flagged within 230 steps."""
    events = _creep_events(lambda s: 1.82, lambda s: 0.8 * 1.004 ** max(s - 1000, 0))
    assert events and 1000 < events[0].step <= 1230, events


@pytest.mark.parametrize("declared", [None, 2])
def test_a_nan_in_a_micro_step_is_sampled_at_once(declared: int | None) -> None:
    """Accumulation 2 logged per micro-step, step_interval 10, the loss NaN from optimizer step 289 (no sampled
    step): nonfinite ERROR at 289, not at the next sampled optimizer step 290 (the corpus run
    r0025-nan-warmup_cosine-a2-micro)."""
    rows = _micro_steps("lm-const-s1", 2)[:700]
    nan = [Row(step=r.step - (declared is not None), loss=float("nan") if r.step > 2 * 288 else r.loss, lr=r.lr,
               grad_norm=r.grad_norm, time=r.time) for r in rows]
    cfg = _config(10, **({} if declared is None else {"grad_accumulation_steps": declared}))
    first = [e for e in _alerts(nan, cfg) if e.rule == "nonfinite"][0]
    assert first.step == (289 if declared is None else 288) and first.severity is Severity.ERROR


def _sgdr(step: int, decay: float = 0.8, first: int = 114, warmup: int = 20) -> float:
    """Warmup, then cosine restarts with the period doubling and each restart's peak x `decay` (the corpus's
    sgdr schedule: bench/corpus/gen.py)."""
    import math

    if step <= warmup:
        return 0.01 * step / warmup
    t, period, peak = step - warmup, first, 0.01
    while t >= period:
        t, period, peak = t - period, period * 2, peak * decay
    return 1e-5 + 0.5 * (peak - 1e-5) * (1 + math.cos(math.pi * t / period))


@pytest.mark.parametrize("every", [1, 4, 10])
def test_warm_restarts_whose_peaks_decay_are_a_schedule(every: int) -> None:
    """SGDR with peaks 0.8, 0.64 of the first, logged every step, every 4th (sink mode) or sampled every 10th: the
    restarts rise from the bottom of a decay to a level below the last restart's: a schedule. Before: an
    lr_schedule WARNING at each restart (corpus runs r0010-clean-sgdr-a2-opt, r0020-clean-sgdr-a2-sink)."""
    lrs = [_sgdr(s) if s % every == 0 else _sgdr(s - s % every) for s in range(1, 1000)]
    assert _lr_events(lrs[::every] if every > 1 else lrs) == []


def test_an_lr_jump_in_the_middle_of_a_restart_cycle_is_still_a_change() -> None:
    """x5 at step 400, in the middle of the second cycle's decay (not from its bottom): flagged at its step."""
    lrs = [_sgdr(s) * (5.0 if s >= 400 else 1.0) for s in range(1, 1000)]
    events = _lr_events(lrs)
    assert events and events[0].step == 400, events


def test_steps_skipped_by_loss_scaling_do_not_hide_the_accumulation() -> None:
    """fp16 loss scaling searching down at the start: the first optimizer steps' rows carry an Inf grad norm
    (overflow). They say nothing about the rows per optimizer step; the ones after still show 16 (the corpus run
    r0060-clean-wsd-a16-micro was read as 1 row per step, and its grad norm creep fitted on micro-steps)."""
    infer = Infer()
    answer = None
    for step in range(1, 400):
        opt = (step - 1) // 16
        answer = infer.skip(step) if opt < 10 else infer.feed(step, 1e-4, 0.5 + 0.01 * opt)
        if answer is not None:
            break
    assert answer == (16, 0)
    stuck = Infer()  # every step overflowing from the first: answered, the rows are not held back for ever
    assert [a for a in (stuck.skip(s) for s in range(1, 400)) if a is not None][0] == (1, 0)


def test_an_lr_decayed_to_exactly_zero_while_the_run_goes_on_is_flagged() -> None:
    """No total_steps declared: the LR decays linearly to exactly 0 at step 400 and the run trains on at 0 (decay
    steps set too short): a WARNING once it has been 0 for 5% of the run and 3 samples (before: 10 samples and 10%,
    so never at step_interval 10 in a 250-step run: corpus run r0013-lr_zero-wsd-a8-micro). A cosine that reaches 0
    at its last step: nothing (llm.c's GPT-2, at 0 for its last 1.8%, is in tests/msmon/offline/test_real_traces.py)."""
    lrs = [1e-3 * max(0.0, 1 - s / 400) for s in range(1, 1000)]
    events = _lr_events(lrs)
    assert events and events[0].step == 422 and events[0].severity is Severity.WARNING, events
    import math

    assert _lr_events([1e-3 * 0.5 * (1 + math.cos(math.pi * s / 999)) for s in range(1, 1000)]) == []
