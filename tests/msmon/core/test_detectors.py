"""Every rule in RULES, both ways: realistic clean noise raises nothing, an injected fault is caught.

Each detector is fed one `Sample` at a time, as the Monitor does. Where the first finding's step
and numbers are deterministic they are checked exactly, against references computed here
independently (sorted lists, `statistics`, direct least squares with `math.fsum`).
"""

from __future__ import annotations

import functools
import math
import random
import statistics
from collections.abc import Callable, Iterable, Sequence

import pytest

from msmon.contract.wire import Sample, Severity
from msmon.core.detectors import RULES, DetectorContext, Finding, RuleParams
from msmon.core.detectors.base import SKIP, Detector
from msmon.core.detectors.convergence import Convergence, ConvergenceParams, LossForecast, LossForecastParams, Trend
from msmon.core.detectors.grad_norm import (
    GradNormCreep,
    GradNormCreepParams,
    GradNormParams,
    GradNormSpike,
    GradNormSpikeParams,
    GradNormThreshold,
)
from msmon.core.detectors.loss_scale import LossScale, LossScaleParams
from msmon.core.detectors.loss_spike import LossSpike, LossSpikeParams
from msmon.core.detectors.lr_schedule import LrSchedule, LrScheduleParams
from msmon.core.detectors.nonfinite import NonFinite, NonFiniteParams
from msmon.core.detectors.rolling import RollingQuantiles, SlidingFit
from msmon.core.detectors.stall import StepStall, StepStallParams
from msmon.core.detectors.straggler import Straggler, StragglerParams
from msmon.core.detectors.throughput import ThroughputDrop, ThroughputDropParams
from msmon.core.detectors.vanished import VanishedGrad, VanishedGradParams
from msmon.core.gate import AlertGate, GateState

WARNING, ERROR = Severity.WARNING, Severity.ERROR
T0 = 1.7e9
EVERY = 10  # training steps between two samples
N_CLEAN = 10_000  # samples per clean run
TOTAL = N_CLEAN * EVERY  # the run's total_steps
WARMUP = 2_000
PEAK_LR = 3e-4
BASE_STEP_TIME = 0.5
BASE_TOKENS = 4.0e5


def mk(step: int, device: str = "0", **metrics: float | None) -> Sample:
    return Sample(run_id="t", device=device, step=step, time=T0 + BASE_STEP_TIME * step, **metrics)


def loss_curve(step: int) -> float:
    """A healthy loss curve: an irreducible 1.8 plus a power-law decay."""
    return 1.8 + 8.0 * step ** -0.35


def cosine_lr(step: int, warmup: int = WARMUP, total: int = TOTAL) -> float:
    if step <= warmup:
        return PEAK_LR * step / warmup
    return PEAK_LR * 0.5 * (1.0 + math.cos(math.pi * (step - warmup) / (total - warmup)))


def findings(det: Detector, params: RuleParams, samples: Iterable[Sample]) -> list[tuple[int, Finding]]:
    """(step, finding) for every sample the detector flags at WARNING or ERROR."""
    out = []
    for s in samples:
        f = det.update(s, params)
        if f is not None and f.level is not None:
            out.append((s.step, f))
    return out


def ls_fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float, float]:
    """Reference least squares: (slope, line at the last x, t-statistic of the slope)."""
    n = len(xs)
    mx, my = math.fsum(xs) / n, math.fsum(ys) / n
    sxx = math.fsum((x - mx) ** 2 for x in xs)
    sxy = math.fsum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    slope = sxy / sxx
    resid = math.fsum((y - my - slope * (x - mx)) ** 2 for x, y in zip(xs, ys, strict=True)) / (n - 2)
    return slope, my + slope * (xs[-1] - mx), slope / math.sqrt(resid / sxx)


def robust_ref(values: Sequence[float]) -> tuple[float, float]:
    """Reference median and IQR / 1.349 of `values`."""
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return statistics.median(values), (q3 - q1) / 1.349


# -- clean traces -----------------------------------------------------------------------------


@functools.cache
def clean_trace(seed: int = 20240611, loss_noise: float = 0.02, n: int = N_CLEAN) -> tuple[Sample, ...]:
    """One healthy run, one sample every EVERY steps: a power-law loss with Gaussian noise, a
    warmup + cosine LR that ends at exactly 0 on the last step, log-normal grad-norm noise around
    a slowly falling level, throughput with 2% noise, and step times with 2% jitter (the sample
    carries the mean and the slowest of the EVERY steps since the previous sample)."""
    rng = random.Random(seed)
    out = []
    for i in range(1, n + 1):
        step = i * EVERY
        times = [BASE_STEP_TIME * (1.0 + rng.gauss(0.0, 0.02)) for _ in range(EVERY)]
        out.append(mk(
            step,
            loss=loss_curve(step) + rng.gauss(0.0, loss_noise),
            learning_rate=cosine_lr(step, total=n * EVERY),
            grad_norm=1.2 * step ** -0.05 * rng.lognormvariate(0.0, 0.2),
            tokens_per_s=BASE_TOKENS * (1.0 + rng.gauss(0.0, 0.02)),
            step_time=math.fsum(times) / EVERY,
            max_step_time=max(times),
        ))
    return tuple(out)


def straggler_feed(n: int, seed: int, slow_from: int | None = None, factor: float = 1.0,
                   ) -> tuple[dict[str, Straggler], list[tuple[str, Sample]], dict[str, float]]:
    """4 devices sharing one `peers` dict, fed round-robin; device "3" slows by `factor` from round `slow_from`."""
    p = StragglerParams()
    peers: dict[str, float] = {}
    devices = ["0", "1", "2", "3"]
    dets = {d: Straggler(p, DetectorContext(device=d, peers=peers)) for d in devices}
    base = {"0": 0.50, "1": 0.51, "2": 0.49, "3": 0.505}  # small hardware differences
    rng = random.Random(seed)
    feed = []
    for r in range(1, n + 1):
        for d in devices:
            t = base[d] * (1.0 + rng.gauss(0.0, 0.02))
            if d == "3" and slow_from is not None and r >= slow_from:
                t *= factor
            feed.append((d, mk(r * EVERY, device=d, step_time=t)))
    return dets, feed, peers


def _single(params: RuleParams, det: Detector, trace: Iterable[Sample]) -> tuple[RuleParams, list]:
    return params, [(det, s) for s in trace]


def _clean_default(rule: str, ctx: DetectorContext | None = None) -> tuple[RuleParams, list]:
    pcls, dcls = RULES[rule]
    p = pcls()
    return _single(p, dcls(p, ctx or DetectorContext()), clean_trace())


def _clean_grad_norm() -> tuple[RuleParams, list]:
    p = GradNormParams(error=5.0)  # the rule is off by default; warning defaults to 2.5
    return _single(p, GradNormThreshold(p, DetectorContext()), clean_trace())


def _clean_lr() -> tuple[RuleParams, list]:
    p = LrScheduleParams()
    return _single(p, LrSchedule(p, DetectorContext(total_steps=TOTAL, warmup_steps=WARMUP)), clean_trace())


def _clean_loss_scale() -> tuple[RuleParams, list]:
    """fp16 dynamic loss scaling: every 7th sample overflowed (skipped, its grad norm Inf), the scale halving then
    climbing back; twice in a row now and then."""
    p, dcls = RULES["loss_scale"]
    params = p()
    out = []
    for i, s in enumerate(clean_trace()):
        over = i % 7 == 0 or i % 301 == 1
        out.append(mk(s.step, loss=s.loss, grad_norm=math.inf if over else s.grad_norm, overflow=over,
                      loss_scale=65536.0 if i % 7 > 1 else 32768.0))
    return _single(params, dcls(params, DetectorContext()), out)


def _clean_straggler() -> tuple[RuleParams, list]:
    dets, feed, _ = straggler_feed(N_CLEAN, seed=11)
    return StragglerParams(), [(dets[d], s) for d, s in feed]


def _clean_forecast() -> tuple[RuleParams, list]:
    p = LossForecastParams()  # the run ends 0.2 below its target
    ctx = DetectorContext(total_steps=TOTAL, target_loss=loss_curve(TOTAL) + 0.2)
    return _single(p, LossForecast(p, ctx), clean_trace())


CLEAN: dict[str, Callable[[], tuple[RuleParams, list]]] = {
    "nonfinite": lambda: _clean_default("nonfinite"),
    "loss_spike": lambda: _clean_default("loss_spike"),
    "loss_collapse": lambda: _clean_default("loss_collapse"),
    "grad_norm": _clean_grad_norm,
    "grad_norm_spike": lambda: _clean_default("grad_norm_spike"),
    "grad_norm_creep": lambda: _clean_default("grad_norm_creep"),
    "vanished_grad": lambda: _clean_default("vanished_grad"),
    "lr_schedule": _clean_lr,
    "loss_scale": _clean_loss_scale,
    "throughput_drop": lambda: _clean_default("throughput_drop"),
    "step_stall": lambda: _clean_default("step_stall"),
    "straggler": _clean_straggler,
    "convergence": lambda: _clean_default("convergence"),
    "loss_forecast": _clean_forecast,
}


def test_every_rule_has_a_clean_case() -> None:
    assert set(CLEAN) == set(RULES)


@pytest.mark.parametrize("rule", list(RULES))
def test_clean_noise_raises_nothing(rule: str) -> None:
    params, feed = CLEAN[rule]()
    gate = AlertGate(alert_interval=1000, baseline_steps=0, resolve_after=5)
    states: dict[str, GateState] = {}
    raw: list[tuple[int, str, Finding]] = []
    events = []
    per_device: dict[str, int] = {}
    for det, s in feed:
        per_device[s.device] = per_device.get(s.device, 0) + 1
        f = det.update(s, params)
        if f is not None and f.level is not None:
            raw.append((s.step, s.device, f))
        v = gate.admit(states.setdefault(s.device, GateState()), f, s.step, params.consecutive,
                       immediate=rule == "nonfinite")
        if v is not None:
            events.append((s.step, s.device, v))
    assert min(per_device.values()) >= 10_000
    assert events == [], f"{rule} alerted on clean data: {events[:5]}"
    if rule == "loss_spike":
        # A 3-sigma z-score trips on ~0.13% of Gaussian samples: single samples, never ERROR and never
        # `consecutive` in a row, which is what the gate needs to let them pass (asserted above).
        assert all(f.level is WARNING for _, _, f in raw)
        assert len(raw) <= 0.005 * len(feed)
    else:
        assert raw == [], f"{rule} flagged clean data: {raw[:5]}"


# -- nonfinite ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("field", "bad", "what"), [
    ("loss", math.nan, "loss"),
    ("loss", math.inf, "loss"),
    ("loss", -math.inf, "loss"),
    ("grad_norm", math.nan, "grad norm"),
    ("grad_norm", math.inf, "grad norm"),
])
def test_nonfinite_is_an_error_on_the_first_sample(field: str, bad: float, what: str) -> None:
    p = NonFiniteParams()
    det = NonFinite(p, DetectorContext())
    trace = clean_trace()
    assert findings(det, p, trace[:500]) == []
    s = trace[500]
    metrics: dict[str, float | None] = {"loss": s.loss, "grad_norm": s.grad_norm, field: bad}
    f = det.update(mk(s.step, **metrics), p)
    assert f is not None
    assert f.level is ERROR
    assert f.threshold == math.inf
    assert math.isnan(f.value) if math.isnan(bad) else f.value == bad
    assert f.message.startswith(what)
    assert det.update(trace[501], p) is None  # and clear again once the value is finite


@pytest.mark.parametrize("rule", [r for r in RULES if r != "nonfinite"])
def test_nonfinite_values_do_not_disturb_the_other_rules(rule: str) -> None:
    """NaN/Inf loss and grad norm are nonfinite's business: the other rules skip them, memory intact."""
    params, feed = CLEAN[rule]()
    feed = feed[:3000]
    out = []
    for i, (det, s) in enumerate(feed):
        if i % 97 == 50:
            bad = [math.nan, math.inf, -math.inf][i % 3]
            det.update(mk(s.step, device=s.device, loss=bad, grad_norm=bad, learning_rate=s.learning_rate,
                          tokens_per_s=s.tokens_per_s, step_time=s.step_time, max_step_time=s.max_step_time),
                       params)
        f = det.update(s, params)
        if f is not None and f.level is not None:
            out.append((s.step, f))
    if rule == "loss_spike":
        assert all(f.level is WARNING for _, f in out) and len(out) <= 10
    else:
        assert out == []


# -- loss_spike --------------------------------------------------------------------------------


def feed_accepting(det: Detector, p: RuleParams, samples: Iterable[Sample], value: Callable[[Sample], float],
                   ) -> list[float]:
    """Feed `samples`; the values the detector took as normal (returned None for), in order."""
    accepted = []
    for s in samples:
        if det.update(s, p) is None:
            accepted.append(value(s))
    return accepted


@pytest.mark.parametrize(("k", "level", "threshold"), [(4.5, WARNING, 3.0), (12.0, ERROR, 6.0)])
def test_loss_spike_sustained_jump(k: float, level: Severity, threshold: float) -> None:
    p = LossSpikeParams()
    assert p.error_level() == 2 * p.warning
    det = LossSpike(p, DetectorContext())
    trace = clean_trace()
    jump_at = 3000
    accepted = feed_accepting(det, p, trace[:jump_at], lambda s: s.loss)
    med, sigma = robust_ref(accepted[-p.window:])
    sigma = max(sigma, p.min_fluctuation * med)
    jump = k * sigma
    # The first sample of the jump sits exactly k sigma above the median.
    first = mk(trace[jump_at].step, loss=med + jump)
    f = det.update(first, p)
    assert f is not None
    assert f.level is level
    assert f.threshold == threshold
    assert f.value == pytest.approx(k, rel=1e-9)
    assert f.baseline == pytest.approx(med, rel=1e-12)
    # Sustained: the baseline does not learn the jump; the gate alerts once `consecutive` samples in a row are over.
    gate, st = AlertGate(alert_interval=10**9, baseline_steps=0, resolve_after=5), GateState()
    assert gate.admit(st, f, first.step, p.consecutive) is None
    raw, events = [f], []
    for s in trace[jump_at + 1:jump_at + 300]:
        g = det.update(mk(s.step, loss=s.loss + jump), p)
        raw.append(g)
        v = gate.admit(st, g, s.step, p.consecutive)
        if v is not None:
            events.append((s.step, v.severity, v.status.value))
    flagged = [g is not None for g in raw]
    # At 4.5 sigma the samples that noise brings under 3 sigma are taken as normal, so the baseline
    # catches up within ~100 samples; the first 50 are still flagged.
    assert sum(flagged[:50]) >= 40
    third = next(i for i in range(2, len(raw)) if all(flagged[i - 2:i + 1]))
    assert events[0] == (trace[jump_at + third].step, raw[third].level, "firing")
    if level is ERROR:  # 12 sigma: every sample of the jump is an ERROR, the alert comes on the third
        assert all(g.level is ERROR for g in raw)
        assert events == [(first.step + 2 * EVERY, ERROR, "firing")]


def test_loss_spike_single_sample_spikes_are_flagged_but_not_learned() -> None:
    p = LossSpikeParams()
    det = LossSpike(p, DetectorContext())
    trace = clean_trace()
    accepted = feed_accepting(det, p, trace[:2000], lambda s: s.loss)
    med, _ = robust_ref(accepted[-p.window:])
    for j in range(5):  # five 2x spikes, one sample each, 20 samples apart
        f = det.update(mk(trace[2000 + 20 * j].step, loss=2 * med), p)
        assert f is not None and f.level is ERROR
        for s in trace[2001 + 20 * j:2020 + 20 * j]:
            det.update(s, p)
    assert det.window.median() == pytest.approx(med, abs=0.01)  # the spikes did not move the baseline


# -- grad_norm (absolute) ----------------------------------------------------------------------


def test_grad_norm_threshold_levels() -> None:
    p = GradNormParams(error=10.0)
    assert p.warning is None and p.warning_level() == 5.0  # warning defaults to half of error
    det = GradNormThreshold(p, DetectorContext())
    assert det.update(mk(10, grad_norm=4.999), p) is None
    f = det.update(mk(20, grad_norm=5.0), p)
    assert f is not None and (f.level, f.value, f.threshold) == (WARNING, 5.0, 5.0)
    f = det.update(mk(30, grad_norm=9.5), p)
    assert f is not None and (f.level, f.value, f.threshold) == (WARNING, 9.5, 5.0)
    f = det.update(mk(40, grad_norm=10.0), p)
    assert f is not None and (f.level, f.value, f.threshold) == (ERROR, 10.0, 10.0)
    f = det.update(mk(50, grad_norm=250.0), p)
    assert f is not None and (f.level, f.threshold) == (ERROR, 10.0)
    assert det.update(mk(60, grad_norm=1.0), p) is None
    assert det.update(mk(70, grad_norm=math.nan), p) is SKIP  # nonfinite's business; the alert state stays


def test_grad_norm_explicit_warning_and_default_off() -> None:
    p = GradNormParams(warning=8.0, error=10.0)
    det = GradNormThreshold(p, DetectorContext())
    assert det.update(mk(10, grad_norm=6.0), p) is None
    f = det.update(mk(20, grad_norm=8.0), p)
    assert f is not None and (f.level, f.threshold) == (WARNING, 8.0)
    off = GradNormParams()
    assert off.error is None and off.warning_level() is None
    det = GradNormThreshold(off, DetectorContext())
    assert det.update(mk(10, grad_norm=1e9), off) is None


# -- grad_norm_spike ---------------------------------------------------------------------------


@pytest.mark.parametrize(("ratio", "level", "threshold"), [(5.0, WARNING, 4.0), (12.0, ERROR, 10.0)])
def test_grad_norm_spike_ratio(ratio: float, level: Severity, threshold: float) -> None:
    p = GradNormSpikeParams()
    det = GradNormSpike(p, DetectorContext())
    trace = clean_trace()
    accepted = feed_accepting(det, p, trace[:1500], lambda s: s.grad_norm)
    med = statistics.median(accepted[-p.window:])
    below = det.update(mk(trace[1500].step, grad_norm=(threshold - 0.01) * med), p)
    assert below is None or below.level is not level
    if below is None:  # taken as normal: it joins the baseline
        med = statistics.median([*accepted, (threshold - 0.01) * med][-p.window:])
    for n, s in enumerate(trace[1501:1503]):  # two in a row: the gate's default `consecutive`
        f = det.update(mk(s.step, grad_norm=ratio * med), p)
        assert f is not None
        assert f.level is level
        assert f.threshold == threshold
        assert f.value == pytest.approx(ratio, rel=1e-12)
        assert f.baseline == pytest.approx(med, rel=1e-12)
        assert n < p.consecutive
    assert det.update(trace[1503], p) is None  # back to normal; the spikes were not learned


# -- grad_norm_creep ---------------------------------------------------------------------------


def creep_run(rate: float, seed: int = 3, start: int = 1000, n: int = 1400) -> list[Sample]:
    """Log-normal noise around 0.8, then from sample `start` an exponential climb by `rate` per sample."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        g = 0.8 * rng.lognormvariate(0.0, 0.2) * math.exp(rate * max(0, i - start))
        out.append(mk((i + 1) * EVERY, grad_norm=g))
    return out


def creep_reference(samples: Sequence[Sample], p: GradNormCreepParams, level: float,
                    ) -> tuple[int, float, float] | None:
    """The first (step, rise, start of trend) where the reference fit reaches `level` with t >= min_t."""
    for j in range(p.window, len(samples) + 1):
        win = samples[j - p.window:j]
        xs = [float(s.step) for s in win]
        ys = [math.log(s.grad_norm) for s in win]
        slope, at_end, t = ls_fit(xs, ys)
        rise = math.exp(slope * (xs[-1] - xs[0]))
        if t >= p.min_t and rise >= level:
            return win[-1].step, rise, math.exp(at_end - slope * (xs[-1] - xs[0]))
    return None


def test_grad_norm_creep_caught_under_the_absolute_threshold() -> None:
    p = GradNormCreepParams()
    samples = creep_run(rate=math.log(1.8) / (p.window - 1))  # 1.8x per window: a slow climb
    ref = creep_reference(samples, p, p.warning)
    assert ref is not None
    ref_step, ref_rise, ref_start = ref
    det = GradNormCreep(p, DetectorContext())
    abs_p = GradNormParams(error=10.0)
    absolute = GradNormThreshold(abs_p, DetectorContext())
    first = None
    for s in samples:
        f = det.update(s, p)
        a = absolute.update(s, abs_p)
        if f is not None and first is None:
            first = (s, f)
            break
        assert a is None
    assert first is not None
    s, f = first
    assert s.step == ref_step
    assert s.step > 1000 * EVERY  # not before the climb began
    assert f.level is WARNING
    assert f.threshold == p.warning
    assert f.value == pytest.approx(ref_rise, rel=1e-6)
    assert f.baseline == pytest.approx(ref_start, rel=1e-6)
    assert s.grad_norm < abs_p.warning_level()  # caught while the absolute rule is still quiet
    assert absolute.update(s, abs_p) is None


def test_grad_norm_creep_error() -> None:
    p = GradNormCreepParams()
    samples = creep_run(rate=math.log(4.0) / (p.window - 1), n=1200)
    ref = creep_reference(samples, p, p.error)
    assert ref is not None
    det = GradNormCreep(p, DetectorContext())
    errors = [(step, f) for step, f in findings(det, p, samples) if f.level is ERROR]
    step, f = errors[0]
    assert step == ref[0]
    assert f.threshold == p.error
    assert f.value == pytest.approx(ref[1], rel=1e-6)


def test_grad_norm_creep_matches_reference_on_a_noisy_climb() -> None:
    """Noise (bounded, so nothing counts as a jump) large enough that many windows rise 1.5x without a clear
    t-statistic: the detector flags exactly the windows the reference fit does (the short horizon alone: the
    long one is tested in test_early_and_creep.py)."""
    p = GradNormCreepParams(long_warning=None, long_error=None)
    rng = random.Random(9)
    rate = math.log(1.6) / (p.window - 1)
    samples = [mk((i + 1) * EVERY, grad_norm=0.8 * math.exp(rate * max(0, i - 200) + rng.uniform(-0.5, 0.5)))
               for i in range(1200)]
    expected, unclear = [], 0
    for j in range(p.window, len(samples) + 1):
        win = samples[j - p.window:j]
        xs = [float(s.step) for s in win]
        slope, _, t = ls_fit(xs, [math.log(s.grad_norm) for s in win])
        rise = math.exp(slope * (xs[-1] - xs[0]))
        if rise >= p.warning and t < p.min_t:
            unclear += 1
        if t >= p.min_t and rise >= p.warning:
            expected.append((win[-1].step, ERROR if rise >= p.error else WARNING))
    assert unclear > 50 and len(expected) > 50  # both sides of the t-test are exercised
    det = GradNormCreep(p, DetectorContext())
    assert [(step, f.level) for step, f in findings(det, p, samples)] == expected


def test_grad_norm_creep_ignores_a_single_blip() -> None:
    p = GradNormCreepParams()
    det = GradNormCreep(p, DetectorContext())
    samples = creep_run(rate=0.0, n=1200)
    blip = [mk(s.step, grad_norm=s.grad_norm * (20.0 if i == 1100 else 1.0)) for i, s in enumerate(samples)]
    assert findings(det, p, blip) == []


# -- vanished_grad -----------------------------------------------------------------------------


def test_vanished_grad_runs_of_zeros() -> None:
    p = VanishedGradParams()
    det = VanishedGrad(p, DetectorContext())
    step = 0

    def feed(values: Iterable[float]) -> list[Finding | None]:
        nonlocal step
        out = []
        for g in values:
            step += EVERY
            out.append(det.update(mk(step, grad_norm=g), p))
        return out

    assert feed([0.7] * 50) == [None] * 50
    assert feed([0.0, 0.0, 0.5, 0.0, 0.0, 1e-9]) == [None] * 6  # runs of 2, reset by a non-zero norm
    out = feed([0.0] * 12)
    assert out[:2] == [None, None]
    assert [(f.level, f.value, f.threshold) for f in out[2:9]] == [(WARNING, float(n), 3.0) for n in range(3, 10)]
    assert [(f.level, f.value, f.threshold) for f in out[9:]] == [(ERROR, float(n), 10.0) for n in range(10, 13)]
    assert feed([math.nan]) == [SKIP]  # skipped: neither a zero nor a reset
    f = feed([1e-11])[0]  # at or below epsilon counts as zero
    assert f is not None and (f.level, f.value) == (ERROR, 13.0)
    assert feed([0.3, 0.0, 0.0]) == [None] * 3


# -- lr_schedule -------------------------------------------------------------------------------


def lr_run(lr: Callable[[int], float], ctx: DetectorContext, n: int = N_CLEAN,
           ) -> list[tuple[int, Finding]]:
    p = LrScheduleParams()
    det = LrSchedule(p, ctx)
    return findings(det, p, (mk(i * EVERY, learning_rate=lr(i * EVERY)) for i in range(1, n + 1)))


def test_lr_zero_after_warmup_is_an_error() -> None:
    def lr(step: int) -> float:
        return 0.0 if step == 50_000 else cosine_lr(step)

    out = lr_run(lr, DetectorContext(total_steps=TOTAL, warmup_steps=WARMUP))
    step, f = out[0]
    assert step == 50_000
    assert (f.level, f.value, f.threshold) == (ERROR, 0.0, 0.0)
    # The return from 0 to where the LR just was is a return, not a change.
    assert out[1:] == []


def test_lr_dropping_to_zero_in_one_sample_is_an_error_without_total() -> None:
    def lr(step: int) -> float:
        return 0.0 if step >= 30_000 else cosine_lr(step)

    out = lr_run(lr, DetectorContext(), n=3500)
    step, f = out[0]
    assert step == 30_000
    assert f.level is ERROR
    assert f.value == 0.0


def test_lr_zero_from_the_start_is_an_error_after_ten_samples() -> None:
    out = lr_run(lambda step: 0.0, DetectorContext(), n=20)
    assert out[0][0] == 10 * EVERY
    assert out[0][1].level is ERROR


def test_lr_rising_after_warmup_is_a_warning() -> None:
    def lr(step: int) -> float:
        return 2 * cosine_lr(step) if step >= 60_000 else cosine_lr(step)

    out = lr_run(lr, DetectorContext(total_steps=TOTAL, warmup_steps=WARMUP))
    step, f = out[0]
    assert step == 60_000
    assert f.level is WARNING
    assert f.value == 2 * cosine_lr(60_000)
    assert f.threshold == cosine_lr(60_000 - EVERY)
    # Held while the LR stays above the 1.2x of the LR before the change; it resolves once the decay brings it back.
    held = [s for s, _ in out]
    assert held == list(range(60_000, held[-1] + 1, EVERY))
    assert 2 * cosine_lr(held[-1]) > 1.2 * f.threshold >= 2 * cosine_lr(held[-1] + EVERY)


def test_lr_rising_after_inferred_warmup_is_a_warning() -> None:
    def lr(step: int) -> float:
        return 2 * cosine_lr(step) if step >= 60_000 else cosine_lr(step)

    out = lr_run(lr, DetectorContext())  # no warmup or schedule declared
    assert out[0][0] == 60_000 and all(f.level is WARNING for _, f in out)


@pytest.mark.parametrize("warmup", [TOTAL, TOTAL + 500])
def test_lr_warmup_not_shorter_than_total(warmup: int) -> None:
    out = lr_run(lambda step: PEAK_LR * step / warmup, DetectorContext(total_steps=TOTAL, warmup_steps=warmup), n=50)
    assert len(out) == 50  # from the first sample on
    step, f = out[0]
    assert step == EVERY
    assert (f.level, f.value, f.threshold) == (WARNING, float(warmup), float(TOTAL))


def test_lr_still_rising_past_half_the_run() -> None:
    out = lr_run(lambda step: PEAK_LR * step / TOTAL, DetectorContext(total_steps=TOTAL))
    step, f = out[0]
    assert step == TOTAL // 2 + EVERY
    assert f.level is WARNING
    assert all(g.level is WARNING for _, g in out)


def test_lr_smooth_decay_to_zero_with_total_unknown_is_not_an_error() -> None:
    # The run ends exactly where the cosine reaches 0: nothing at all.
    assert lr_run(cosine_lr, DetectorContext()) == []
    # The run goes on at LR 0 (decay shorter than the run): a WARNING once 5% of the run is at zero, never ERROR.
    out = lr_run(lambda step: cosine_lr(min(step, TOTAL)), DetectorContext(), n=12_000)
    assert all(f.level is WARNING for _, f in out)
    assert out[0][0] == 105_270  # first sample step with step - 100_000 >= 0.05 * step (issue 37: was 10%)
    assert (out[0][1].value, out[0][1].threshold) == (0.0, 0.0)


def test_lr_zero_at_the_end_of_a_known_run_is_fine() -> None:
    # Linear decay reaching 0 at 99% of total_steps, then held: within end_fraction (0.98) of the run.
    def lr(step: int) -> float:
        return max(0.0, cosine_lr(min(step, WARMUP)) * (1 - (step - WARMUP) / (0.99 * TOTAL - WARMUP)))

    assert lr_run(lr, DetectorContext(total_steps=TOTAL, warmup_steps=WARMUP)) == []


@pytest.mark.parametrize("schedule", ["constant", "wsd"])
def test_lr_flat_after_warmup_is_not_still_rising(schedule: str) -> None:
    def wsd(step: int) -> float:
        if step <= WARMUP:
            return PEAK_LR * step / WARMUP
        if step <= 80_000:
            return PEAK_LR
        return PEAK_LR * (TOTAL - step) / (TOTAL - 80_000)

    lr = (lambda step: PEAK_LR) if schedule == "constant" else wsd
    assert lr_run(lr, DetectorContext(total_steps=TOTAL)) == []


def test_lr_rising_after_a_warmup_into_a_constant_lr_is_a_warning() -> None:
    """No decline ever shows where warmup ended: it ended where the LR settled for good (held for twice
    the steps before it), so a x4 jump long after is a rise after warmup."""
    def lr(step: int) -> float:
        base = PEAK_LR * min(1.0, step / WARMUP)
        return 4 * base if step >= 60_000 else base

    out = lr_run(lr, DetectorContext())
    assert [s for s, _ in out] == list(range(60_000, N_CLEAN * EVERY + 1, EVERY))  # held: it never returns
    assert all(f.level is WARNING for _, f in out)
    assert "above the 0.0003 it had settled at" in out[0][1].message


def test_lr_staircase_warmup_is_flagged_unless_warmup_steps_says_so() -> None:
    """A staircase warmup (each level held 5,000 steps) rises after the LR had stopped rising: unannounced changes,
    unless `training.warmup_steps` declares the warmup."""
    def lr(step: int) -> float:
        return PEAK_LR * min(8, 1 + step // 5_000) / 8

    assert lr_run(lr, DetectorContext(), n=6_000)[0][0] == 5_000
    assert lr_run(lr, DetectorContext(warmup_steps=40_000), n=6_000) == []


@pytest.mark.parametrize("every", [1, 10])
def test_lr_constant_from_the_first_step_that_jumps_is_flagged_at_its_sample(every: int) -> None:
    """A fine-tune at one LR from step 1 (no warmup, no decay): a jump 0.05 -> 0.6 is a WARNING at its sample,
    held while it lasts (issue 24)."""
    p = LrScheduleParams()
    det = LrSchedule(p, DetectorContext())
    out = findings(det, p, (mk(k, learning_rate=0.6 if k >= 101 else 0.05) for k in range(every, 300, every)))
    first = 101 if every == 1 else 110
    assert [s for s, _ in out] == list(range(first, 300, every))
    assert out[0][1].level is WARNING and out[0][1].threshold == 0.05


def _restarts(step: int) -> float:
    """Cosine with warm restarts every 20,000 steps, after a 2,000-step warmup."""
    if step <= WARMUP:
        return PEAK_LR * step / WARMUP
    k = (step - WARMUP) % 20_000
    return PEAK_LR * (0.05 + 0.475 * (1 + math.cos(math.pi * k / 20_000)))


def _step_decay(step: int) -> float:
    return PEAK_LR * 0.1 ** (step // 30_000)


def _linear(step: int) -> float:
    return PEAK_LR * max(0.0, 1 - step / TOTAL) + 1e-7


@pytest.mark.parametrize("schedule", [_restarts, _step_decay, _linear, cosine_lr, lambda step: PEAK_LR])
@pytest.mark.parametrize("every", [1, 10])
def test_lr_schedules_and_their_restarts_are_not_changes(schedule: Callable[[int], float], every: int) -> None:
    p = LrScheduleParams()
    det = LrSchedule(p, DetectorContext())
    n = TOTAL if every == 1 else N_CLEAN
    assert findings(det, p, (mk(k * every, learning_rate=schedule(k * every)) for k in range(1, n + 1))) == []


def test_lr_change_resolves_on_return_acknowledgement_or_announcement() -> None:
    p = LrScheduleParams()

    def run(det: LrSchedule, lrs: list[float], start: int = 1) -> list[Severity | None]:
        out = []
        for i, lr in enumerate(lrs):
            f = det.update(mk(start + i, learning_rate=lr, loss=1.0, grad_norm=1.0), p)
            out.append(None if f is None else f.level)
        return out

    det = LrSchedule(p, DetectorContext())
    assert run(det, [0.1] * 5 + [0.8] * 3 + [0.1]) == [None] * 5 + [WARNING] * 3 + [None]  # returned
    det = LrSchedule(p, DetectorContext())
    run(det, [0.1] * 5 + [0.8])
    assert det.acknowledge() is True
    assert run(det, [0.8] * 3, start=7) == [None] * 3  # the new normal
    det = LrSchedule(p, DetectorContext())
    run(det, [0.1] * 5)
    det.expect_change()  # scale-lr 2: announced
    assert run(det, [0.2] * 3, start=6) == [None] * 3


def test_lr_change_is_an_error_once_the_grad_norm_or_loss_reacts() -> None:
    p = LrScheduleParams()
    det = LrSchedule(p, DetectorContext())
    levels = []
    for k in range(1, 30):
        g = 1.0 if k < 15 else 4.0  # the grad norm reacts 5 steps after the jump
        f = det.update(mk(k, learning_rate=0.6 if k >= 10 else 0.05, loss=2.0, grad_norm=g), p)
        levels.append(None if f is None else f.level)
    assert levels[:9] == [None] * 9 and levels[9:14] == [WARNING] * 5 and levels[14:] == [ERROR] * 15


# -- throughput_drop ---------------------------------------------------------------------------


@pytest.mark.parametrize(("drop", "level", "threshold"), [(0.4, WARNING, 0.3), (0.7, ERROR, 0.6)])
def test_throughput_sustained_drop(drop: float, level: Severity, threshold: float) -> None:
    p = ThroughputDropParams(min_rates=1)  # one span per sample (each carries 10 steps), judged one by one
    det = ThroughputDrop(p, DetectorContext())
    trace = clean_trace()
    drop_at = 1000
    accepted = feed_accepting(det, p, trace[:drop_at], lambda s: s.tokens_per_s)
    med = statistics.median(accepted[-p.window:])
    gate, st = AlertGate(alert_interval=1000, baseline_steps=0, resolve_after=5), GateState()
    slow = [mk(s.step, tokens_per_s=s.tokens_per_s * (1 - drop)) for s in trace[drop_at:drop_at + 200]]
    out, events = [], []
    for s in slow:
        f = det.update(s, p)
        out.append(f)
        v = gate.admit(st, f, s.step, p.consecutive)
        if v is not None:
            events.append((s.step, v.severity, v.repeat))
    f = out[0]
    assert f is not None
    assert (f.level, f.threshold) == (level, threshold)
    assert f.value == pytest.approx(1 - slow[0].tokens_per_s / med, rel=1e-12)
    assert f.baseline == pytest.approx(med, rel=1e-12)
    assert all(g is not None and g.level is level for g in out)  # sustained: the baseline does not learn it
    assert events[0] == (slow[p.consecutive - 1].step, level, False)
    assert all(e[1:] == (level, True) for e in events[1:])  # the rest are reminders
    assert det.update(trace[drop_at + 200], p) is None  # recovered


def test_throughput_short_dip_does_not_alert_through_the_gate() -> None:
    p = ThroughputDropParams()
    det = ThroughputDrop(p, DetectorContext())
    gate, st = AlertGate(alert_interval=1000, baseline_steps=0, resolve_after=5), GateState()
    events = []
    for i, s in enumerate(clean_trace()[:2000]):
        if 1000 <= i < 1000 + p.consecutive - 1:  # one sample short of `consecutive`
            s = mk(s.step, tokens_per_s=s.tokens_per_s * 0.3)
        v = gate.admit(st, det.update(s, p), s.step, p.consecutive)
        if v is not None:
            events.append(v)
    assert events == []


def test_throughput_falls_back_to_step_time() -> None:
    p = ThroughputDropParams(min_rates=1)
    det = ThroughputDrop(p, DetectorContext())
    trace = clean_trace()
    steps = [mk(s.step, step_time=s.step_time) for s in trace[:500]]
    assert findings(det, p, steps) == []
    f = det.update(mk(trace[500].step, step_time=BASE_STEP_TIME / 0.5), p)  # half the steps per second
    assert f is not None and f.level is WARNING and f.value == pytest.approx(0.5, abs=0.02)


# -- step_stall --------------------------------------------------------------------------------


def stall_sample(step: int, rng: random.Random, worst: float) -> Sample:
    times = [BASE_STEP_TIME * (1.0 + rng.gauss(0.0, 0.02)) for _ in range(EVERY - 1)] + [worst]
    return mk(step, step_time=math.fsum(times) / EVERY, max_step_time=worst)


@pytest.mark.parametrize(("params", "ratio", "level", "threshold"), [
    (StepStallParams(), 20.0, WARNING, 10.0),
    (StepStallParams(), 100.0, WARNING, 10.0),  # no ERROR level by default
    (StepStallParams(error=15.0), 20.0, ERROR, 15.0),
])
def test_step_stall(params: StepStallParams, ratio: float, level: Severity, threshold: float) -> None:
    det = StepStall(params, DetectorContext())
    trace = clean_trace()
    accepted = feed_accepting(det, params, trace[:800], lambda s: s.step_time)
    med = statistics.median(accepted[-params.window:])
    f = det.update(stall_sample(trace[800].step, random.Random(1), ratio * med), params)
    assert f is not None
    assert (f.level, f.threshold) == (level, threshold)
    assert f.value == pytest.approx(ratio, rel=1e-12)
    assert f.baseline == pytest.approx(med, rel=1e-12)
    assert findings(det, params, trace[801:1500]) == []  # one stall, then normal again


# -- straggler ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("factor", "level", "threshold"), [(2.0, WARNING, 1.5), (4.0, ERROR, 3.0)])
def test_straggler_among_four_devices(factor: float, level: Severity, threshold: float) -> None:
    p = StragglerParams()
    slow_from = 500
    dets, feed, peers = straggler_feed(800, seed=11, slow_from=slow_from, factor=factor)
    gate = AlertGate(alert_interval=1000, baseline_steps=0, resolve_after=5)
    states = {d: GateState() for d in dets}
    got: dict[str, list[tuple[int, Finding]]] = {d: [] for d in dets}
    events = []
    latest: dict[str, float] = {}
    first_ref = None
    for d, s in feed:
        latest[d] = s.step_time
        f = dets[d].update(s, p)
        if d == "3" and s.step == slow_from * EVERY:
            others = sorted(v for k, v in latest.items() if k != "3")
            first_ref = (s.step_time / others[1], others[1])
        if f is not None and f.level is not None:
            got[d].append((s.step, f))
        v = gate.admit(states[d], f, s.step, p.consecutive)
        if v is not None and not v.repeat:
            events.append((d, s.step, v.severity))
    assert set(peers) == {"0", "1", "2", "3"}
    assert got["0"] == got["1"] == got["2"] == []  # one slow peer does not move the others' median
    step, f = got["3"][0]
    assert step == slow_from * EVERY
    assert first_ref is not None
    assert (f.level, f.threshold) == (level, threshold)
    assert f.value == pytest.approx(first_ref[0], rel=1e-12)
    assert f.baseline == pytest.approx(first_ref[1], rel=1e-12)
    assert len(got["3"]) == 800 - slow_from + 1
    assert events == [("3", (slow_from + p.consecutive - 1) * EVERY, level)]


def test_straggler_needs_a_peer() -> None:
    p = StragglerParams()
    det = Straggler(p, DetectorContext(device="0", peers={}))
    assert det.update(mk(10, step_time=100.0), p) is None


# -- convergence -------------------------------------------------------------------------------


def plateau_run(flat_from: int, noise: float, seed: int, n: int, every: int = EVERY) -> list[Sample]:
    rng = random.Random(seed)
    return [mk(i * every, loss=loss_curve(min(i * every, flat_from)) + rng.gauss(0.0, noise))
            for i in range(1, n + 1)]


def trend_windows(samples: Sequence[Sample], window_steps: int) -> list[tuple[int, list[tuple[float, float]]]]:
    """Reference for Trend's windows: (step that completes the window, its BLOCKS points), in order.

    A block is `window_steps // BLOCKS` steps; its point is (mean log step, median loss). A block is
    closed by the first sample of the next one, and every BLOCKS closed blocks complete a window.
    """
    block_steps = max(1, window_steps // Trend.BLOCKS)
    blocks: list[tuple[int, list[Sample]]] = []  # (step of the sample that closed it, its samples)
    current: list[Sample] = []
    for s in samples:
        if current and s.step // block_steps != current[-1].step // block_steps:
            blocks.append((s.step, current))
            current = []
        current.append(s)
    out = []
    for k in range(Trend.BLOCKS, len(blocks) + 1, Trend.BLOCKS):
        win = blocks[k - Trend.BLOCKS:k]
        pts = [(math.fsum(math.log(s.step) for s in b) / len(b), statistics.median(s.loss for s in b)) for _, b in win]
        out.append((win[-1][0], pts))
    return out


WINDOW = 1000  # the convergence rule's window when total_steps is unknown


def reference_fit(windows: Sequence[tuple[int, list[tuple[float, float]]]], k: int,
                  history: int = 4) -> tuple[float, float, float]:
    """Reference for the convergence rule's baseline: the fit over the `history` windows before window k."""
    pts = [pt for _, w in windows[max(0, k - history):k] for pt in w]
    return ls_fit(*zip(*pts, strict=True))


def test_convergence_plateau() -> None:
    p = ConvergenceParams()
    det = Convergence(p, DetectorContext())
    flat_from = 2 * WINDOW  # a window boundary: steps 10..1990 fall, 2000.. are flat
    samples = plateau_run(flat_from, noise=0.01, seed=1, n=600)
    out = [(s, det.update(s, p)) for s in samples]
    fired = [(s.step, f) for s, f in out if f is not None]
    step, f = fired[0]
    windows = trend_windows([s for s in samples if s.step >= WINDOW], WINDOW)  # the first window is burn-in
    assert [w[0] for w in windows[:3]] == [2000, 3000, 4000]
    assert step == windows[1][0] == flat_from + WINDOW

    ref, _, t_ref = reference_fit(windows, 1)
    cur, _, t_cur = ls_fit(*zip(*windows[1][1], strict=True))
    se_ref, se_cur = abs(ref / t_ref), abs(cur / t_cur)
    assert t_ref <= -p.min_t
    assert cur - ref >= p.min_t * math.hypot(se_ref, se_cur)
    assert f.level is WARNING
    assert f.threshold == p.warning
    assert f.value == pytest.approx(1 - cur / ref, rel=1e-6)
    assert f.baseline == pytest.approx(ref * math.log(2), rel=1e-6)
    # The finding stands while the loss stays flat, judged against the reference from before the plateau.
    assert all(g is not None for s, g in out if s.step >= 3000)
    assert {round(g.baseline, 12) for s, g in out if g is not None} == {round(f.baseline, 12)}


def test_convergence_recovers_and_resolves() -> None:
    """A pause in the descent that ends: the finding clears once the loss falls again."""
    p = ConvergenceParams()
    det = Convergence(p, DetectorContext())
    rng = random.Random(3)

    def loss(step: int) -> float:
        if step < 2000:
            return loss_curve(step)
        if step < 3000:
            return loss_curve(2000)
        return loss_curve(step - 1000)  # descent resumes where it stopped

    out = [(i * EVERY, det.update(mk(i * EVERY, loss=loss(i * EVERY) + rng.gauss(0.0, 0.002)), p))
           for i in range(1, 701)]
    flagged = [step for step, f in out if f is not None]
    assert flagged and flagged[0] == 3000
    assert out[-1][1] is None


def test_convergence_loss_rising_is_an_error_when_configured() -> None:
    p = ConvergenceParams(error=1.5)
    det = Convergence(p, DetectorContext())
    rng = random.Random(4)
    samples = [mk(i * EVERY, loss=loss_curve(min(i * EVERY, 2000)) + 2e-4 * max(0, i * EVERY - 2000)
                  + rng.gauss(0.0, 0.005)) for i in range(1, 301)]
    fired = findings(det, p, samples)
    step, f = fired[0]
    windows = trend_windows([s for s in samples if s.step >= WINDOW], WINDOW)  # the first window is burn-in
    ref = reference_fit(windows, 1)[0]
    cur = ls_fit(*zip(*windows[1][1], strict=True))[0]
    assert step == 3000
    assert (f.level, f.threshold) == (ERROR, 1.5)
    assert f.value == pytest.approx(1 - cur / ref, rel=1e-6)
    assert f.value > 1.5
    assert "rising" in f.message


def test_convergence_clean_runs_many_seeds() -> None:
    """Regression to the mean after a lucky steep window must not read as lost descent."""
    p = ConvergenceParams()
    noisy = []
    for seed in range(20):
        det = Convergence(p, DetectorContext())
        rng = random.Random(seed)
        for i in range(1, N_CLEAN + 1):
            f = det.update(mk(i * EVERY, loss=loss_curve(i * EVERY) + rng.gauss(0.0, 0.02)), p)
            if f is not None:
                noisy.append((seed, i * EVERY, f))
                break
    assert noisy == []


def test_convergence_plateau_mid_run() -> None:
    """With total_steps known the window scales with the run (here 2000 steps), long enough for the
    loss's change at step 10,000 to stand out of 1% noise."""
    p = ConvergenceParams()
    det = Convergence(p, DetectorContext(total_steps=TOTAL))
    assert det.trend.block_steps * Trend.BLOCKS == 2000
    samples = plateau_run(10_000, noise=0.01, seed=1, n=N_CLEAN)
    assert findings(det, p, samples) != []


# -- loss_forecast -----------------------------------------------------------------------------


def forecast_ref(points: Sequence[tuple[float, float]], total: int) -> tuple[float, float]:
    """Reference: the fitted line's value at log(total) and its standard error."""
    xs, ys = zip(*points, strict=True)
    n = len(xs)
    mx, my = math.fsum(xs) / n, math.fsum(ys) / n
    sxx = math.fsum((x - mx) ** 2 for x in xs)
    slope = math.fsum((x - mx) * (y - my) for x, y in points) / sxx
    resid = math.fsum((y - my - slope * (x - mx)) ** 2 for x, y in points) / (n - 2)
    dx = math.log(total) - mx
    return my + slope * dx, math.sqrt(resid * (1 / n + dx * dx / sxx))


def test_loss_forecast_target_below_the_trend() -> None:
    p = LossForecastParams()
    target = 1.5  # below the curve's floor (1.8): no trend reaches it
    det = LossForecast(p, DetectorContext(total_steps=TOTAL, target_loss=target))
    samples = plateau_run(TOTAL, noise=0.01, seed=2, n=1000)
    ref = None
    for step, pts in trend_windows(samples, p.window_steps):
        final, se = forecast_ref(pts, TOTAL)
        if final - 2 * se - target >= p.warning:
            ref = (step, final - 2 * se - target)
            break
    assert ref is not None
    fired = findings(det, p, samples)
    step, f = fired[0]
    assert step == ref[0]
    assert f.level is WARNING
    assert f.threshold == 0.0
    assert f.value == pytest.approx(ref[1], rel=1e-6)
    assert f.baseline == target
    assert "by step 100,000" in f.message


def test_loss_forecast_needs_target_and_total() -> None:
    p = LossForecastParams()
    samples = plateau_run(TOTAL, noise=0.01, seed=2, n=1000)
    for ctx in (DetectorContext(total_steps=TOTAL), DetectorContext(target_loss=1.5)):
        assert findings(LossForecast(p, ctx), p, samples) == []


def test_loss_forecast_reachable_target_noisy_loss() -> None:
    """A run that ends 0.3 below its target, with 1.5% loss noise: the forecast's own error keeps it quiet."""
    p = LossForecastParams()
    ctx = DetectorContext(total_steps=TOTAL, target_loss=loss_curve(TOTAL) + 0.3)
    for seed in range(3):
        det = LossForecast(p, ctx)
        assert findings(det, p, plateau_run(TOTAL, noise=0.03, seed=seed, n=N_CLEAN)) == []


def test_loss_forecast_nearly_flat_trend_does_not_crash() -> None:
    p = LossForecastParams()
    det = LossForecast(p, DetectorContext(total_steps=TOTAL, target_loss=1.0))
    samples = [mk(i * EVERY, loss=2.0 - 0.001 * math.log(i * EVERY)) for i in range(1, 201)]
    fired = findings(det, p, samples)
    assert [(s, f.level) for s, f in fired] == [(2000, WARNING)]


def test_loss_forecast_realistic_run_with_unreachable_target_does_not_crash() -> None:
    p = LossForecastParams()
    det = LossForecast(p, DetectorContext(total_steps=TOTAL, target_loss=1.5))
    fired = findings(det, p, plateau_run(TOTAL, noise=0.01, seed=1, n=N_CLEAN))
    assert fired and all(f.level is WARNING for _, f in fired)


# -- rolling -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("size", "kind"), [(1, "float"), (2, "float"), (7, "int"), (100, "float"), (101, "int")])
def test_rolling_quantiles_against_sorted_reference(size: int, kind: str) -> None:
    rng = random.Random(size)
    rq = RollingQuantiles(size)
    values: list[float] = []
    for i in range(3000):
        x = float(rng.randint(0, 20)) if kind == "int" else rng.lognormvariate(0.0, 1.0)  # ints: many ties
        rq.add(x)
        values.append(x)
        window = values[-size:]
        assert len(rq) == len(window)
        ref = sorted(window)
        assert rq.median() == statistics.median(window)
        assert rq.quantile(0.0) == ref[0]
        assert rq.quantile(1.0) == ref[-1]
        if len(window) >= 2 and i % 7 == 0:
            q1, q2, q3 = statistics.quantiles(window, n=4, method="inclusive")
            assert rq.quantile(0.25) == pytest.approx(q1, rel=1e-12, abs=1e-12)
            assert rq.quantile(0.5) == pytest.approx(q2, rel=1e-12, abs=1e-12)
            assert rq.quantile(0.75) == pytest.approx(q3, rel=1e-12, abs=1e-12)
            deciles = statistics.quantiles(window, n=10, method="inclusive")
            for d, ref_q in enumerate(deciles, start=1):
                assert rq.quantile(d / 10) == pytest.approx(ref_q, rel=1e-12, abs=1e-12)
            assert rq.sigma() == pytest.approx((q3 - q1) / 1.349, rel=1e-12, abs=1e-12)
            med, sigma = rq.median_sigma()
            assert med == statistics.median(window)
            assert sigma == pytest.approx((q3 - q1) / 1.349, rel=1e-12, abs=1e-12)
    rq.clear()
    assert len(rq) == 0
    rq.add(3.0)
    assert rq.median() == 3.0


def test_rolling_sigma_matches_normal_sigma() -> None:
    rng = random.Random(0)
    rq = RollingQuantiles(5000)
    for _ in range(5000):
        rq.add(rng.gauss(10.0, 2.0))
    assert rq.sigma() == pytest.approx(2.0, rel=0.05)
    assert rq.median() == pytest.approx(10.0, abs=0.1)


@pytest.mark.parametrize(("size", "x0", "dx"), [(50, 1e6, 1.0), (100, 1e6, 0.37), (10, 1e6 + 0.5, 10.0),
                                                 (100, 9.2, 1e-4)])  # the last: log(step), as the trend rules do
def test_sliding_fit_against_direct_least_squares(size: int, x0: float, dx: float) -> None:
    rng = random.Random(size)
    fit = SlidingFit(size)
    xs: list[float] = []
    ys: list[float] = []
    assert fit.fit() is None
    for i in range(10_000):
        x = x0 + dx * i + rng.uniform(0.0, 0.3 * dx)
        y = 3.0 - 2e-3 * (x - x0) / dx + 0.5 * math.sin(i / 500) + rng.gauss(0.0, 0.05)
        fit.add(x, y)
        xs.append(x)
        ys.append(y)
        n = min(len(xs), size)
        assert len(fit) == n
        if n < 3:
            assert fit.fit() is None
            continue
        if i % 13 and i % size not in (0, 1, size - 1):  # check around every rebuild, and a sample between
            continue
        slope, at_end, t = fit.fit()
        r_slope, r_end, r_t = ls_fit(xs[-size:], ys[-size:])
        assert slope == pytest.approx(r_slope, rel=1e-7, abs=1e-12)
        assert at_end == pytest.approx(r_end, rel=1e-9, abs=1e-9)
        assert t == pytest.approx(r_t, rel=1e-6)
        assert fit.span == pytest.approx(xs[-1] - xs[-n], rel=1e-12)


def test_sliding_fit_degenerate_and_clear() -> None:
    fit = SlidingFit(5)
    for _ in range(5):
        fit.add(7.0, 1.0)
    assert fit.fit() is None  # all x equal
    fit.clear()
    assert len(fit) == 0 and fit.span == 0.0
    for i in range(4):
        fit.add(1e6 + i, 2.0 * i)
    slope, at_end, t = fit.fit()
    assert slope == pytest.approx(2.0)
    assert at_end == pytest.approx(6.0)
    assert t == math.inf or t > 1e6  # an exact line


# -- loss_scale --------------------------------------------------------------------------------


def test_loss_scale_search_at_the_start_and_single_skips_are_normal_every_step_skipped_is_not() -> None:
    p = LossScaleParams()
    det = LossScale(p, DetectorContext())

    def feed(steps: Iterable[int], over: bool, scale: Callable[[int], float]) -> list[tuple[int, Severity]]:
        out = []
        for k in steps:
            f = det.update(mk(k, overflow=over, loss_scale=scale(k)), p)
            if f is not None and f.level is not None:
                out.append((k, f.level))
        return out

    assert feed(range(1, 40), True, lambda k: 2.0 ** (40 - k)) == []  # the scale searching down from 2^40
    assert feed(range(40, 500), False, lambda k: 2.0) == []
    assert feed([500], True, lambda k: 2.0) == [] and feed([501], False, lambda k: 2.0) == []  # one skip
    out = feed(range(600, 700), True, lambda k: 2.0 ** 20)
    assert out[0] == (619, WARNING) and (649, ERROR) in out
    det = LossScale(p, DetectorContext())
    feed(range(1, 10), False, lambda k: 4.0)
    assert feed(range(10, 13), True, lambda k: 1.0)[0] == (11, ERROR)  # at its floor and still overflowing
    assert det.update(mk(13, loss=1.0), p) is SKIP  # no overflow flag: nothing to judge
