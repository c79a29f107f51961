"""Thresholds from a healthy baseline: what users do by hand, measured with the live detectors' own scores.

Watch the first steps without alerting, measure the loss's normal fluctuation, the typical grad
norm and the stable throughput, then set each level a margin above the worst the baseline itself
reached, looser during warmup. `calibrate(rows)` does that with the detectors' own `score`
functions fed exactly as the Monitor feeds them (same windows, same sampling), so a level here
means what it means live; it returns a `monitor_config` fragment, a note on every number, and
the proof: the baseline replayed through the fragment by a real Monitor. Pure: no files.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import yaml

from msmon.contract.wire import Sample, Severity, Status
from msmon.core.detectors.base import BaselineRule, DetectorContext, Finding, RuleParams
from msmon.core.detectors.grad_norm import GradNormSpike
from msmon.core.detectors.loss_spike import LossSpike
from msmon.core.detectors.rolling import RollingQuantiles
from msmon.core.detectors.throughput import ThroughputDrop, rate_of
from msmon.offline.readers import Row
from msmon.offline.replay import replay, replay_monitor
from msmon.offline.stats import _ceil_sig, _ceil_to, _floor_sig, _quantile, detrended_sigma, sustained_max
from notifier.config import MonitorConfig, load_config

MARGIN = 1.5  # levels sit this far above the worst the baseline reached
MIN_SIGMAS = 3.0  # loss_spike WARNING never below 3 sigma ("a few times the normal fluctuation")
MIN_SPIKE_RATIO = 2.0  # grad_norm_spike WARNING never below 2x the rolling median
MIN_DROP = 0.1  # throughput_drop WARNING never below 10%
MAX_RELATIVE_NOISE = 0.1  # loss fluctuation above 10% of the loss: too noisy to calibrate from
MIN_SCORED = 10  # scored values after the warmup below which a rule is left at its defaults
MAX_TREND_RATIO = 2.0  # window spread over the detrended noise above this: the trend, not noise, sets sigma


_P = TypeVar("_P", bound="_Scored")


class CalibrationError(ValueError):
    """The baseline cannot give trustworthy thresholds; the message says why and what to do."""


@dataclasses.dataclass
class Calibration:
    fragment: dict[str, Any]  # {"monitor_config": {...}}: loads with notifier.config.load_config
    notes: dict[str, str]  # "monitor_config.alert.rules.loss_spike.warning" -> why that number
    header: list[str]  # what the baseline was, and the check
    alerts_on_baseline: list[str]  # alerts the baseline raises through the fragment (should be none)

    def to_yaml(self) -> str:
        lines = [f"# {h}" for h in self.header]
        _emit(self.fragment, "", 0, self.notes, lines)
        return "\n".join(lines) + "\n"


# -- probes: the live detectors, scoring every sample without ever firing --------------------------


class _Scored(BaselineRule):
    """Mixed into a live baseline rule: wherever the rule would judge a value, record its measure instead
    and learn the value, so nothing ever fires and the window holds what it would hold on a quiet run."""

    at: int = 0  # the step being scored, set before each update
    seen: list[tuple[int, Any]]
    judged = 0  # values the rule looked at (learning ones included)

    def measure(self, x: float, w: RollingQuantiles) -> Any:
        return self.score(x, w)[0]

    def judge(self, x: float, p: RuleParams) -> tuple[Severity, float, float, float] | None:
        w = self.window
        self.judged += 1
        if w.n >= self.min_samples:
            self.seen.append((self.at, self.measure(x, w)))
        w.add(x)
        return None


class _LossProbe(_Scored, LossSpike):
    def measure(self, x: float, w: RollingQuantiles) -> tuple[float, float, float]:
        med, sigma = w.median_sigma()  # the raw sigma: the floor (min_fluctuation) is chosen from it
        return x, med, sigma


class _RatioProbe(_Scored, GradNormSpike):
    pass


class _DropProbe(_Scored, ThroughputDrop):
    unit = ""

    def measure(self, x: float, w: RollingQuantiles) -> tuple[float, float]:
        return self.score(x, w)[0], x  # the fraction lost, and the rate itself (the stable range)

    def update(self, s: Sample, p: RuleParams) -> Finding | None:
        if not self.unit:
            self.unit = rate_of(s)[1]
        return super().update(s, p)


def _probe(make: Callable[[Any, DetectorContext], _P], p: RuleParams, ctx: DetectorContext) -> _P:
    probe = make(p, ctx)
    probe.seen = []
    return probe


def _samples(rows: Sequence[Row]) -> Iterable[Sample]:
    """Samples as the Monitor builds them from replayed rows: elapsed time since the previous sample."""
    prev: tuple[float, int] | None = None
    for r in rows:
        elapsed = step_time = None
        if r.time is not None and prev is not None and r.time > prev[0] and r.step > prev[1]:
            elapsed = r.time - prev[0]
            step_time = elapsed / (r.step - prev[1])
        yield Sample(run_id="calibrate", device="0", step=r.step, time=r.time or 0.0, loss=r.loss,
                     learning_rate=r.lr, grad_norm=r.grad_norm, tokens_per_s=r.throughput, step_time=step_time,
                     elapsed=elapsed)
        if r.time is not None:
            prev = (r.time, r.step)


# -- warmup -------------------------------------------------------------------------------------------


def find_warmup(samples: Sequence[Sample]) -> tuple[int | None, str]:
    """The first step after warmup, and how it was found: from the LR rising to its peak, else from the
    loss's initial fast fall (the first step its rolling median is down in the range of the later loss)."""
    lrs = [(s.step, s.learning_rate) for s in samples
           if s.learning_rate is not None and math.isfinite(s.learning_rate) and s.learning_rate > 0]
    if len(lrs) >= 10:
        peak = max(lr for _, lr in lrs)
        if lrs[0][1] < 0.5 * peak:
            end = next(step for step, lr in lrs if lr >= 0.999 * peak)
            return end, f"the LR warms up from {lrs[0][1]:.3g} to {peak:.3g} by step {end}"
        return None, f"the LR starts at {lrs[0][1]:.3g}, near its peak {peak:.3g}: no warmup"
    losses = [(s.step, s.loss) for s in samples if s.loss is not None and math.isfinite(s.loss)]
    if len(losses) < 20:
        return None, "too few losses to see a warmup"
    late = _quantile([x for _, x in losses[len(losses) // 2:]], 0.95)
    rq = RollingQuantiles(9)
    for i, (_, x) in enumerate(losses):
        rq.add(x)
        if i >= 8 and rq.median() <= late:
            start = losses[4][0]
            mid = losses[i - 4][0]  # the centre of the rolling window
            if mid <= start:
                return None, "no LR in the log, and the loss starts in its normal range: no warmup"
            return mid, f"no LR in the log; the loss falls fast until step {mid}"
    return None, "no LR in the log, and the loss never settles"


# -- the calibration ----------------------------------------------------------------------------------


@dataclasses.dataclass
class _Split:
    """Scores before and after the warmup."""

    warm: list[float]
    main: list[float]

    @classmethod
    def of(cls, seen: Iterable[tuple[int, float]], warmup_end: int | None) -> _Split:
        warm: list[float] = []
        main: list[float] = []
        for step, v in seen:
            (warm if warmup_end is not None and step < warmup_end else main).append(v)
        return cls(warm, main)


class _Builder:
    def __init__(self, cfg: MonitorConfig) -> None:
        self.cfg = cfg
        self.rules: dict[str, dict[str, Any]] = {}
        self.warm_rules: dict[str, dict[str, Any]] = {}
        self.notes: dict[str, str] = {}
        self.skipped: list[str] = []  # rules left at their defaults, and why

    def enough(self, rule: str, probe: _Scored, n: int, what: str, absent: str) -> bool:
        """Whether `n` scored values after the warmup are enough; if not, says why in the header."""
        if n >= MIN_SCORED:
            return True
        if not probe.judged:
            self.skipped.append(f"{rule}: no {absent} in the log")
        else:
            self.skipped.append(f"{rule}: {n} of its {what} judged after the warmup, {MIN_SCORED} needed (it learns "
                                f"from the first {probe.min_samples} before judging; the baseline holds {probe.judged})"
                                ": give a longer baseline (--steps)")
        return False

    def level(self, rule: str, key: str, value: float, note: str, *, warm: bool = False) -> None:
        value = float(f"{value:.6g}")
        if warm and self.rules.get(rule, {}).get(key) == value:
            return  # the warmup needs nothing looser than the level after it
        (self.warm_rules if warm else self.rules).setdefault(rule, {})[key] = value
        where = "phases[0].rules" if warm else "rules"
        self.notes[f"monitor_config.alert.{where}.{rule}.{key}"] = note

    def keep(self, rule: str, keys: Iterable[str], note: Callable[[str, Any], str]) -> None:
        """Carry the rule's structural settings, so the fragment means the same thing wherever it is pasted."""
        p = self.cfg.alert.rules.get(rule)
        for key in keys:
            value = getattr(p, key)
            self.rules.setdefault(rule, {})[key] = value
            self.notes[f"monitor_config.alert.rules.{rule}.{key}"] = note(key, value)


def _structure_note(key: str, value: Any) -> str:
    return {"consecutive": f"samples in a row before it alerts (as measured: levels assume {value})",
            "window": "samples in the rolling baseline (as measured)",
            "min_seconds": "shortest span of training a rate is judged over (as measured)"}.get(key, "as measured")


def _loss(b: _Builder, probe: _LossProbe, warmup_end: int | None, where: str) -> None:
    p = b.cfg.alert.rules.get("loss_spike")
    seen = [(step, x, med, sigma) for step, (x, med, sigma) in probe.seen]
    main = [t for t in seen if warmup_end is None or t[0] >= warmup_end]
    rel = [s / abs(m) for _, _, m, s in main if m != 0 and s > 0]
    if not rel:
        raise CalibrationError(f"{where}: the loss does not fluctuate at all after the warmup (constant or "
                               "quantised); the loss_spike rule has nothing to measure: keep its defaults")
    rel_med = _quantile(rel, 0.5)
    if rel_med > MAX_RELATIVE_NOISE:
        raise CalibrationError(f"{where}: too noisy: the loss's normal fluctuation is {rel_med:.0%} of its level "
                               f"(more than {MAX_RELATIVE_NOISE:.0%}); levels measured on it would miss real spikes. "
                               "Calibrate from a steadier stretch (--start STEP), or log a smoothed loss")
    sigmas = [s for _, _, _, s in main]
    noise = detrended_sigma([x for _, x, _, _ in main], 2 * max(5, probe.window.size // 10))
    ratio = _quantile(sigmas, 0.5) / noise if noise > 0 else math.inf
    if ratio > MAX_TREND_RATIO:
        first, last = main[0][1], main[-1][1]
        when = "after the warmup" if warmup_end is not None else "over the baseline"
        raise CalibrationError(
            f"{where}: the trend dominates: the loss moves from {first:.4g} to {last:.4g} {when}, so its "
            f"spread over the rule's {probe.window.size}-sample window is {ratio:.1f}x its step-to-step noise "
            f"({noise:.3g}); levels measured now would be too loose later. Calibrate from a flatter stretch "
            "(--start STEP, after the fast initial fall) or a smaller step_interval")
    floor = _floor_sig(0.5 * _quantile(rel, 0.1), 1)
    z = [(step, (x - m) / max(s, floor * abs(m), 1e-12)) for step, x, m, s in seen]
    split = _Split.of(z, warmup_end)
    worst = sustained_max(split.main, p.consecutive)
    warning = max(MIN_SIGMAS, _ceil_to(MARGIN * worst, 0.5))
    b.level("loss_spike", "warning", warning,
            f"the baseline's largest rise held {p.consecutive} samples in a row was {worst:.2f} sigma "
            f"(sigma: {_quantile(sigmas, 0.5):.3g}, {rel_med:.2%} of the loss); {MARGIN}x that, at least "
            f"{MIN_SIGMAS:g}")
    b.level("loss_spike", "error", 2 * warning, "twice the WARNING level")
    b.level("loss_spike", "min_fluctuation", floor,
            f"floor on sigma as a fraction of the loss: half the calmest normal fluctuation (10th percentile "
            f"{_quantile(rel, 0.1):.2%})")
    b.keep("loss_spike", ("consecutive", "window"), _structure_note)
    if split.warm:
        w_worst = sustained_max(split.warm, p.consecutive)
        w_level = max(2 * warning, _ceil_to(MARGIN * w_worst, 0.5))
        b.level("loss_spike", "warning", w_level, f"warmup: {MARGIN}x its largest held rise "
                f"({max(w_worst, 0.0):.2f} sigma), at least twice the level after it", warm=True)
        b.level("loss_spike", "error", 2 * w_level, "twice the warmup WARNING level", warm=True)


def _grad(b: _Builder, samples: Sequence[Sample], probe: _RatioProbe, warmup_end: int | None) -> None:
    grads = [(s.step, g) for s in samples if (g := s.grad_norm) is not None and math.isfinite(g)]
    split = _Split.of(grads, warmup_end)
    if not grads:
        b.skipped.append("grad_norm, grad_norm_spike: no grad norm in the log")
        return
    if len(split.main) < MIN_SCORED:
        b.skipped.append(f"grad_norm: only {len(split.main)} grad norms after the warmup ({MIN_SCORED} needed)")
        return
    run = b.cfg.alert.rules.get("grad_norm").consecutive
    q99 = _quantile(split.main, 0.99)
    held = sustained_max(split.main, run)
    warning = _ceil_sig(max(2 * q99, MARGIN * held))
    b.level("grad_norm", "warning", warning,
            f"absolute grad norm: 2x the baseline's 99th percentile {q99:.3g} (median "
            f"{_quantile(split.main, 0.5):.3g}, largest held {run} samples {held:.3g})")
    b.level("grad_norm", "error", 2 * warning, "twice the WARNING level")
    b.keep("grad_norm", ("consecutive",), _structure_note)
    if len(split.warm) >= 5:
        w_level = _ceil_sig(max(warning, 2 * _quantile(split.warm, 0.99), MARGIN * max(split.warm)))
        b.level("grad_norm", "warning", w_level, f"warmup: 2x its 99th percentile {_quantile(split.warm, 0.99):.3g}, "
                f"{MARGIN}x its largest {max(split.warm):.3g}, at least the level after it", warm=True)
        b.level("grad_norm", "error", 2 * w_level, "twice the warmup WARNING level", warm=True)
    ratios = _Split.of(probe.seen, warmup_end)
    if not b.enough("grad_norm_spike", probe, len(ratios.main), "grad norms", "grad norm"):
        return
    spike_run = b.cfg.alert.rules.get("grad_norm_spike").consecutive
    held = sustained_max(ratios.main, spike_run)
    spike = max(MIN_SPIKE_RATIO, _ceil_to(MARGIN * held, 0.5))
    b.level("grad_norm_spike", "warning", spike,
            f"x the rolling median: the baseline's largest held {spike_run} samples was {held:.2f}x; {MARGIN}x that, "
            f"at least {MIN_SPIKE_RATIO:g}x")
    b.level("grad_norm_spike", "error", 2.5 * spike, "2.5x the WARNING level (the defaults' 4 -> 10)")
    b.keep("grad_norm_spike", ("consecutive", "window"), _structure_note)
    if ratios.warm:
        w_spike = max(2 * spike, _ceil_to(MARGIN * sustained_max(ratios.warm, spike_run), 0.5))
        b.level("grad_norm_spike", "warning", w_spike, "warmup: twice the level after it, or more if the warmup "
                "needed it", warm=True)
        b.level("grad_norm_spike", "error", 2.5 * w_spike, "2.5x the warmup WARNING level", warm=True)


def _throughput(b: _Builder, probe: _DropProbe, warmup_end: int | None) -> None:
    drops = _Split.of(((step, drop) for step, (drop, _) in probe.seen), warmup_end).main
    spans = f"spans of {probe.min_seconds:g} s of training"
    if not b.enough("throughput_drop", probe, len(drops), spans, "throughput or timestamps"):
        return
    run = b.cfg.alert.rules.get("throughput_drop").consecutive
    held = sustained_max(drops, run)
    warning = min(0.9, max(MIN_DROP, _ceil_to(MARGIN * held, 0.05)))
    rates = [rate for _, (_, rate) in probe.seen]
    lo, hi = _quantile(rates, 0.05), _quantile(rates, 0.95)
    b.level("throughput_drop", "warning", warning,
            f"fraction lost vs the rolling median: stable range {lo:.4g}-{hi:.4g} {probe.unit} (5th-95th percentile); "
            f"the largest drop held {run} spans was {max(held, 0.0):.1%}; {MARGIN}x that, at least {MIN_DROP:.0%}")
    b.level("throughput_drop", "error", min(0.95, max(2 * warning, warning + 0.2)),
            "twice the WARNING level or 20 points above it, whichever is higher; at most 95%")
    b.keep("throughput_drop", ("consecutive", "window", "min_seconds"), _structure_note)


def _sampled(rows: Iterable[Row], cfg: MonitorConfig, start: int | None, steps: int) -> list[Row]:
    """The first device's rows in [start, start + steps) that the Monitor would sample."""
    si, li = cfg.step_interval, cfg.log_interval or 0
    out: list[Row] = []
    device: str | None = None
    first: int | None = start
    for r in rows:
        if first is None:
            first = r.step
        if r.step < first:
            continue
        if r.step >= first + steps:
            break
        if not out and device is None:
            device = r.device
        if r.device != device:
            continue
        if r.step % si == 0 or (li and r.step % li == 0):
            out.append(r)
    return out


def calibrate(rows: Iterable[Row], *, steps: int = 1000, start: int | None = None,
              base: MonitorConfig | None = None, source: str = "the baseline") -> Calibration:
    """Thresholds from the first `steps` steps of `rows` (from step `start`, default the first); `base` is the
    monitor_config they are for (its sampling and rule windows; default: msmon's defaults)."""
    cfg = base if base is not None else load_config({"monitor_config": {"monitor_on": True}})
    picked = _sampled(rows, cfg, start, steps)
    samples = list(_samples(picked))
    need = 2 * int(getattr(cfg.alert.rules.get("loss_spike"), "window", 100))
    n_loss = sum(1 for s in samples if s.loss is not None and math.isfinite(s.loss))
    span = f"steps {picked[0].step}-{picked[-1].step}" if picked else "no steps"
    where = f"{source} ({span}, step_interval {cfg.step_interval})"
    if n_loss < need:
        raise CalibrationError(f"{where}: too short: {n_loss} sampled steps with a loss; calibration needs at least "
                               f"{need} (twice the loss_spike window of {need // 2} samples). Give a longer baseline "
                               "(--steps), or check the log has a loss column")
    warmup_end, how = find_warmup(samples)
    after = sum(1 for s in samples if s.loss is not None and (warmup_end is None or s.step >= warmup_end))
    if after < need // 2:
        raise CalibrationError(f"{where}: too short after the warmup: {how}, leaving {after} sampled steps; "
                               f"calibration needs at least {need // 2} after it. Give a longer baseline (--steps)")
    ctx = DetectorContext()
    rules = cfg.alert.rules
    loss_p = _probe(_LossProbe, rules.get("loss_spike"), ctx)
    ratio_p = _probe(_RatioProbe, rules.get("grad_norm_spike"), ctx)
    drop_p = _probe(_DropProbe, rules.get("throughput_drop"), ctx)
    for s in samples:
        loss_p.at = ratio_p.at = drop_p.at = s.step
        loss_p.update(s, rules.get("loss_spike"))
        ratio_p.update(s, rules.get("grad_norm_spike"))
        drop_p.update(s, rules.get("throughput_drop"))
    b = _Builder(cfg)
    _loss(b, loss_p, warmup_end, where)
    _grad(b, samples, ratio_p, warmup_end)
    _throughput(b, drop_p, warmup_end)
    section: dict[str, Any] = {"monitor_on": True, "step_interval": cfg.step_interval,
                               "log_interval": cfg.log_interval, "alert": {"rules": b.rules}}
    b.notes["monitor_config.step_interval"] = "the sampling these levels were measured at: keep it"
    b.notes["monitor_config.log_interval"] = "as in the base config (its steps are sampled too)"
    if warmup_end is not None and b.warm_rules:
        section["alert"]["phases"] = [{"name": "warmup", "start_step": 0, "end_step": warmup_end,
                                       "rules": b.warm_rules}]
        b.notes["monitor_config.alert.phases[0].end_step"] = how
        section["training"] = {"warmup_steps": warmup_end}
        b.notes["monitor_config.training.warmup_steps"] = how
    header = [f"msmon calibrate: thresholds measured on {source}, {span} ({len(samples)} sampled steps at "
              f"step_interval {cfg.step_interval}); {how}."]
    header += [f"Left at its defaults: {why}." for why in b.skipped]
    result = Calibration({"monitor_config": section}, b.notes, header, [])
    result.alerts_on_baseline = check_quiet(result, picked)
    quiet = "raises no alert" if not result.alerts_on_baseline else (
        "raises " + "; ".join(result.alerts_on_baseline) + " (review these levels)")
    result.header.append(f"Check: the baseline replayed through this fragment by msmon's Monitor {quiet}.")
    return result


def check_quiet(result: Calibration, rows: Sequence[Row]) -> list[str]:
    """Alerts of the calibrated rules when `rows` are replayed through the fragment as written (YAML and all)."""
    cfg = yaml.safe_load(result.to_yaml())
    calibrated = set(cfg["monitor_config"]["alert"]["rules"])
    mon = replay_monitor(cfg, "calibrate-check")
    events = replay(rows, mon)
    return [f"{e.severity.value} {e.rule} at step {e.step}" for e in events
            if e.status is Status.FIRING and e.rule in calibrated]


# -- YAML with a comment on every number -----------------------------------------------------------


def _scalar(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, float):
        text = repr(v)
        mant, e, exp = text.partition("e")
        if e and "." not in mant:
            text = f"{mant}.0e{exp}"  # YAML 1.1 (PyYAML) reads 1e-05 as a string; 1.0e-05 is a float
        return text
    if isinstance(v, int):
        return str(v)
    return yaml.safe_dump(v, default_style=None).strip().removesuffix("...").strip()


def _emit(node: Any, path: str, indent: int, notes: dict[str, str], out: list[str], dash: bool = False) -> None:
    pad = " " * indent
    first = True
    for key, value in node.items():
        sub = f"{path}.{key}" if path else str(key)
        lead = (pad[:-2] + "- ") if dash and first else pad
        first = False
        if isinstance(value, dict):
            out.append(f"{lead}{key}:")
            _emit(value, sub, indent + 2, notes, out)
        elif isinstance(value, list) and value and isinstance(value[0], dict):
            out.append(f"{lead}{key}:")
            for i, item in enumerate(value):
                _emit(item, f"{sub}[{i}]", indent + 4, notes, out, dash=True)
        else:
            note = notes.get(sub)
            out.append(f"{lead}{key}: {_scalar(value)}" + (f"  # {note}" if note else ""))
