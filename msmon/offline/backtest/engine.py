"""Backtest: replay labelled traces through a monitor config and score what it caught, how early, and
what it raised on healthy steps.

Definitions (also in docs/backtest.md):

* A trace's **label** says whether it is clean, or where a fault began (`fault_step`) and, for a
  fault of the training, where the loss diverged (`diverge_step`; empty when it never did).
* An **alert** is an event that starts firing: status FIRING and not a reminder (`repeat`). A rise
  from WARNING to ERROR is a new alert (the bot sends it as a new message).
* **Clean steps** are the logged steps of clean traces plus the logged steps before `fault_step` in
  faulty ones. Every alert on a clean step is a **false alarm**, whatever its rule.
* A fault is **caught** when an alert of its family fires at or after `fault_step`: training faults
  (`kind: training`) by any rule but the timing ones (`TIMING_RULES`), timing faults (`kind:
  timing`, e.g. a data-loader slowdown) by a timing rule. The first such alert is the **detection**.
* **Lead** = `diverge_step` - the detection's step, in training steps. A divergence is caught **in
  time** when the lead is >= 0: the alert came no later than the step at which the loss was first
  seen doubled (or non-finite). 0 is the best any monitor can do for a NaN that appears in one step.
* The **divergence rule** used to label traces from their data (`divergence_step`): the first step
  at or after the fault whose loss is NaN/Inf or at least 2x the median loss of the 100 logged
  steps before the fault.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import statistics
from collections.abc import Iterable, Sequence
from typing import Literal, cast

from msmon.contract.wire import Event, Severity, Status
from msmon.offline.readers import Row
from msmon.offline.replay import replay, replay_monitor
from notifier.config import MonitorConfig, load_config

Kind = Literal["clean", "training", "timing"]
KINDS: tuple[str, ...] = ("clean", "training", "timing")
TIMING_RULES = frozenset({"throughput_drop", "step_stall", "straggler"})
LABEL_COLUMNS: tuple[str, ...] = ("trace", "kind", "fault_step", "diverge_step", "format", "notes")

DIVERGE_FACTOR = 2.0  # "the loss doubled"
REFERENCE_STEPS = 100  # logged steps before the fault whose median is the reference loss


class BacktestError(ValueError):
    """A labels file, a trace or a config that cannot be backtested; the message says where and why."""


@dataclasses.dataclass(frozen=True)
class Label:
    """What is known about one trace (one row of a labels file)."""

    trace: str  # path relative to the traces folder (a glob pattern in the file), "#section" for BLOOM
    kind: Kind = "clean"
    fault_step: int | None = None
    diverge_step: int | None = None
    format: str = "csv"
    notes: str = ""


@dataclasses.dataclass(frozen=True)
class Alert:
    step: int
    rule: str
    severity: Severity
    device: str = "0"

    def __str__(self) -> str:
        return f"{self.step} {self.rule}"


@dataclasses.dataclass
class TraceResult:
    """The score of one trace under one config."""

    trace: str
    kind: Kind
    steps: int  # logged steps (rows)
    clean_steps: int
    fault_step: int | None
    diverge_step: int | None
    alerts: list[Alert]  # every alert, in order
    false_alarms: list[Alert]
    detection: Alert | None  # first alert of the fault's family at or after fault_step
    first_warning: Alert | None  # first WARNING / ERROR of that family from fault_step (from the start if clean)
    first_error: Alert | None
    held: list[Alert] = dataclasses.field(default_factory=list)  # the fault's family still firing at the end

    @property
    def still_firing(self) -> bool | None:
        """For a fault: whether an alert of its family was still firing when the trace ended (a level shift that
        stays must stay visible; a resolved one was learned as the new normal)."""
        return None if self.kind == "clean" else bool(self.held)

    @property
    def caught(self) -> bool | None:
        return None if self.kind == "clean" else self.detection is not None

    @property
    def lead(self) -> int | None:
        """Steps from the detection to the divergence (negative: the alert came after it)."""
        if self.diverge_step is None or self.detection is None:
            return None
        return self.diverge_step - self.detection.step

    @property
    def error_lead(self) -> int | None:
        if self.diverge_step is None or self.first_error is None:
            return None
        return self.diverge_step - self.first_error.step

    @property
    def in_time(self) -> bool | None:
        """For a divergence: caught no later than the step the loss doubled."""
        if self.diverge_step is None:
            return None
        lead = self.lead
        return lead is not None and lead >= 0


@dataclasses.dataclass(frozen=True)
class Summary:
    traces: int
    clean_traces: int
    faults: int
    caught: int
    divergences: int
    in_time: int
    median_lead: float | None  # over divergences that were caught
    median_error_lead: float | None
    clean_steps: int
    false_alarms: int

    @property
    def false_alarms_per_10k(self) -> float | None:
        return None if not self.clean_steps else self.false_alarms * 10_000 / self.clean_steps


def alerts_of(events: Iterable[Event]) -> list[Alert]:
    """The alerts among a replay's events: first firings (rises included), not reminders or resolutions."""
    return [Alert(e.step, e.rule, e.severity, e.device) for e in events
            if e.status is Status.FIRING and not e.repeat]


def firing_at_end(events: Iterable[Event]) -> list[Alert]:
    """The alerts still firing after the last event: per rule and device, the last firing not followed by its
    resolution (at the step it first fired or rose)."""
    open_: dict[tuple[str, str], Alert] = {}
    for e in events:
        key = (e.rule, e.device)
        if e.status is Status.RESOLVED:
            open_.pop(key, None)
        elif e.status is Status.FIRING and not e.repeat:
            open_[key] = Alert(e.step, e.rule, e.severity, e.device)
    return sorted(open_.values(), key=lambda a: (a.step, a.rule))


def in_family(rule: str, kind: Kind) -> bool:
    """Whether an alert of `rule` speaks to a fault of `kind`."""
    return (rule in TIMING_RULES) == (kind == "timing")


def clean_step_count(steps: Sequence[int], fault_step: int | None) -> int:
    """Logged steps before the fault (all of them for a clean trace)."""
    if fault_step is None:
        return len(steps)
    return sum(1 for s in steps if s < fault_step)


def score(label: Label, steps: Sequence[int], alerts: Sequence[Alert], held: Sequence[Alert] = ()) -> TraceResult:
    """Score one replayed trace: `steps` are its logged step numbers, `alerts` what the config raised, `held` the
    alerts still firing at its end (`firing_at_end`)."""
    fault = label.fault_step
    false_alarms = [a for a in alerts if fault is None or a.step < fault]
    if fault is None:
        relevant = list(alerts)
    else:
        relevant = [a for a in alerts if a.step >= fault and in_family(a.rule, label.kind)]
    first_warning = next((a for a in relevant if a.severity is Severity.WARNING), None)
    first_error = next((a for a in relevant if a.severity is Severity.ERROR), None)
    return TraceResult(
        trace=label.trace, kind=label.kind, steps=len(steps), clean_steps=clean_step_count(steps, fault),
        fault_step=fault, diverge_step=label.diverge_step, alerts=list(alerts), false_alarms=false_alarms,
        detection=relevant[0] if relevant and fault is not None else None,
        first_warning=first_warning, first_error=first_error,
        held=[] if fault is None else [a for a in held if in_family(a.rule, label.kind)],
    )


def _median(values: Sequence[int]) -> float | None:
    return float(statistics.median(values)) if values else None


def summarize(results: Sequence[TraceResult]) -> Summary:
    faulty = [r for r in results if r.kind != "clean"]
    diverged = [r for r in results if r.diverge_step is not None]
    leads = [r.lead for r in diverged if r.lead is not None]
    error_leads = [r.error_lead for r in diverged if r.error_lead is not None]
    return Summary(
        traces=len(results), clean_traces=len(results) - len(faulty), faults=len(faulty),
        caught=sum(1 for r in faulty if r.caught), divergences=len(diverged),
        in_time=sum(1 for r in diverged if r.in_time), median_lead=_median(leads),
        median_error_lead=_median(error_leads), clean_steps=sum(r.clean_steps for r in results),
        false_alarms=sum(len(r.false_alarms) for r in results),
    )


def divergence_step(rows: Sequence[Row], fault_step: int, skip: Iterable[int] = (),
                    factor: float = DIVERGE_FACTOR, reference_steps: int = REFERENCE_STEPS) -> int | None:
    """The labelling rule: the first step >= `fault_step` (not in `skip`) whose loss is NaN/Inf or at
    least `factor` x the median loss of the last `reference_steps` logged steps before the fault.

    `skip`: steps whose loss says nothing about the model (e.g. the loss on a corrupt batch itself).
    """
    before = [r.loss for r in rows if r.step < fault_step and r.loss is not None and math.isfinite(r.loss)]
    if not before:
        raise BacktestError(f"no finite loss logged before the fault step {fault_step}: nothing to compare with")
    reference = statistics.median(before[-reference_steps:])
    skipped = set(skip)
    for r in rows:
        if r.step < fault_step or r.step in skipped or r.loss is None:
            continue
        if not r.loss < factor * reference:  # NaN and Inf included
            return r.step
    return None


# -- replaying ------------------------------------------------------------------------------------

def replay_config(source: str | MonitorConfig, step_interval: int | None = None) -> MonitorConfig:
    """The config as a backtest runs it: no log lines, `step_interval` replaced when given. Raises
    BacktestError when monitoring or alerting is off (there would be nothing to score)."""
    cfg = load_config(source)
    name = source if isinstance(source, str) else "the config"
    if not cfg.monitor_on:
        raise BacktestError(f"{name}: monitor_on is false, so this config monitors nothing; set "
                            "monitor_config.monitor_on: true to backtest it")
    if not cfg.alert.enable:
        raise BacktestError(f"{name}: alert.enable is false, so this config raises nothing; set "
                            "monitor_config.alert.enable: true to backtest it")
    return dataclasses.replace(cfg, step_interval=step_interval or cfg.step_interval, log_interval=0)


def run_trace(label: Label, rows: Sequence[Row], config: MonitorConfig) -> TraceResult:
    """Replay `rows` through a fresh Monitor on `config` (see `replay_config`; no files, no bot, the log's
    own clock) and score them."""
    ranks = len({r.device for r in rows if r.device is not None})  # a trace of several ranks: each a device
    events = replay(rows, replay_monitor(config, label.trace, ranks))
    return score(label, [r.step for r in rows], alerts_of(events), firing_at_end(events))


# -- the labels file ----------------------------------------------------------------------------

def _int_cell(text: str | None, path: str, line: int, column: str) -> int | None:
    text = (text or "").strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise BacktestError(f"{path}:{line}: column {column} holds {text!r}; expected a step number or "
                            "nothing") from None


def _label_row(rec: dict[str, str | None], path: str, line: int) -> Label:
    trace = (rec.get("trace") or "").strip()
    if not trace:
        raise BacktestError(f"{path}:{line}: empty trace (a path relative to the traces folder)")
    fault = _int_cell(rec.get("fault_step"), path, line, "fault_step")
    diverge = _int_cell(rec.get("diverge_step"), path, line, "diverge_step")
    kind = (rec.get("kind") or "").strip() or ("clean" if fault is None else "training")
    if kind not in KINDS:
        raise BacktestError(f"{path}:{line}: kind {kind!r} is not one of {', '.join(KINDS)}")
    where = f"{path}:{line} ({trace})"
    if kind == "clean" and (fault is not None or diverge is not None):
        raise BacktestError(f"{where}: a clean trace has no fault_step or diverge_step; empty them or set "
                            "kind to training or timing")
    if kind != "clean" and fault is None:
        raise BacktestError(f"{where}: a {kind} fault needs its fault_step")
    if diverge is not None:
        if kind == "timing":
            raise BacktestError(f"{where}: a timing fault has no diverge_step (the loss is not its business); "
                                "use kind training if the loss diverged")
        if fault is not None and diverge < fault:
            raise BacktestError(f"{where}: diverge_step {diverge} is before fault_step {fault}")
    fmt = (rec.get("format") or "").strip() or "csv"
    return Label(trace, cast(Kind, kind), fault, diverge, fmt, (rec.get("notes") or "").strip())


def read_labels(path: str) -> list[Label]:
    """The labels of a traces folder: a CSV with the columns `LABEL_COLUMNS` (kind, format, notes optional)."""
    try:
        f = open(path, newline="", encoding="utf-8")  # noqa: SIM115 - closed below
    except OSError as exc:
        raise BacktestError(f"cannot read the labels file {path}: {exc.strerror}. Pass --labels FILE, or put "
                            "a labels.csv in the traces folder (see docs/backtest.md)") from None
    with f:
        reader = csv.DictReader(f)
        header = reader.fieldnames or []
        missing = [c for c in ("trace", "fault_step", "diverge_step") if c not in header]
        if missing:
            raise BacktestError(f"{path}: missing column(s) {', '.join(missing)}; the header must be "
                                f"{','.join(LABEL_COLUMNS)}")
        unknown = [c for c in header if c not in LABEL_COLUMNS]
        if unknown:
            raise BacktestError(f"{path}: unknown column(s) {', '.join(unknown)}; columns are "
                                f"{','.join(LABEL_COLUMNS)}")
        labels = [_label_row(rec, path, i) for i, rec in enumerate(reader, start=2)]
    if not labels:
        raise BacktestError(f"{path}: no traces listed")
    return labels


@dataclasses.dataclass
class Run:
    """One config's backtest over a set of traces."""

    config: str
    step_interval: int
    results: list[TraceResult]

    def summary(self) -> Summary:
        return summarize(self.results)
