"""The monitor_config schema: one dataclass per YAML section, defaults and meanings in one place."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any, Literal, TypeVar

from msmon.config.errors import closest, shown
from msmon.config.validate import Context, add_bounds, parse_fields, setting, spec, url_problem
from msmon.contract.actions import ACTIONS, AUTOMATIC, ParamError, check_param
from msmon.core.detectors import RULES
from msmon.core.detectors.base import RuleParams

Metric = Literal["loss", "learning_rate", "grad_norm", "throughput"]
ALL_METRICS: tuple[str, ...] = ("loss", "learning_rate", "grad_norm", "throughput")


_field = setting

# Ranges every config key gets, documented with the key (config/monitor.yaml, `msmon check-config`): a step
# count is below a billion, a duration in seconds below 30 days, so a typo (1e12) is refused at its line
# instead of overflowing a thread's wait or a byte count later.
STEPS = 10**9
DAY = 86_400.0

# The detectors declare their keys and lower bounds; these are the upper bounds (and lower ones where a
# rule leaves them open) of every rule key, by what the key means.
add_bounds(RuleParams, warning={"ge": 0, "le": 1e12}, error={"ge": 0, "le": 1e12}, consecutive={"le": 10_000},
           window={"le": 100_000}, window_steps={"le": 10_000_000}, min_t={"le": 1_000}, jump={"le": 1_000},
           min_fluctuation={"le": 100}, epsilon={"le": 1}, min_seconds={"le": DAY}, gross={"le": 1e6},
           long_warning={"le": 1e6}, long_error={"le": 1e6}, long_window={"le": 100_000},
           min_steps={"le": 1_000_000}, repeats={"le": 10_000})
for _ratio_rule in ("loss_spike", "loss_collapse", "grad_norm_spike", "grad_norm_creep", "step_stall", "straggler",
                    "vanished_grad", "loss_forecast"):  # multiples, counts, loss units: below a million
    add_bounds(RULES[_ratio_rule][0], warning={"le": 1e6}, error={"le": 1e6})
add_bounds(RULES["loss_collapse"][0], blocks={"le": 1_000})
add_bounds(RULES["convergence"][0], warning={"le": 1_000}, error={"le": 1_000})

_C = TypeVar("_C")


def _one_key_per_rule(cls: type[_C]) -> type[_C]:
    """Make `cls` a dataclass with one field per rule of RULES, in its order: the rule's params class, its
    defaults and its detector's summary. The list of rules is RULES; the schema follows it."""
    for name, (params_cls, detector_cls) in RULES.items():
        cls.__annotations__[name] = params_cls
        setattr(cls, name, _field(params_cls(), detector_cls.summary))
    return dataclasses.dataclass(cls)


@_one_key_per_rule
class RulesConfig:
    """One entry per rule (msmon.core.detectors.RULES); each takes enable / warning / error / consecutive and
    its own keys. `get(rule)` reads one."""

    def get(self, rule: str) -> RuleParams:
        params: RuleParams = getattr(self, rule)
        return params


def _parse_phase_rules(value: Any, path: str, ctx: Context) -> Any:
    """`phases[i].rules`: per-rule overrides of the levels, validated against each rule's keys."""
    if not isinstance(value, Mapping):
        ctx.error(path, f"expected a mapping of rule names to overrides, got {shown(value)}")
        return {}
    out: dict[str, dict[str, Any]] = {}
    for rule, override in value.items():
        sub = f"{path}.{rule}"
        if rule not in RULES:
            hint = closest(str(rule), RULES)
            ctx.error(sub, f"unknown rule; did you mean {hint}?" if hint else
                      "unknown rule; rules are " + ", ".join(RULES), value, str(rule))
            continue
        if not isinstance(override, Mapping):
            ctx.error(sub, f"expected a mapping such as {{warning: 6.0}}, got {shown(override)}", value, str(rule))
            continue
        params_cls = RULES[rule][0]
        given = parse_fields(params_cls, override, sub, ctx)
        for key in list(given):
            if key not in params_cls.PHASE_KEYS:
                allowed = ", ".join(sorted(params_cls.PHASE_KEYS))
                ctx.error(f"{sub}.{key}", f"cannot change per phase (a phase may set {allowed}); "
                          f"set it once under monitor_config.alert.rules.{rule}", override, key)
                del given[key]
        out[str(rule)] = given
    return out


@dataclasses.dataclass
class PhaseConfig:
    """A step range with its own levels, e.g. a looser warmup: rules given here override alert.rules."""

    name: str = _field("", "shown in alerts")
    start_step: int = _field(0, "first step of the phase", ge=0, le=STEPS)
    end_step: int | None = _field(None, "first step after the phase (null: to the end)", ge=1, le=STEPS)
    rules: dict[str, dict[str, Any]] = dataclasses.field(
        default_factory=dict, metadata=spec(parser=_parse_phase_rules, doc="per-rule level overrides"))

    def check(self) -> Iterator[tuple[str, str]]:
        if not self.name:
            yield "name", "every phase needs a name (it is shown in alerts)"
        if self.end_step is not None and self.end_step <= self.start_step:
            yield "end_step", f"must be greater than start_step ({self.start_step}), got {self.end_step}"


@dataclasses.dataclass
class AlertConfig:
    enable: bool = _field(True, "raise alerts (metrics are still logged when false)")
    loss_spike_threshold: float | None = _field(
        None, "WARNING level of the loss_spike rule, in multiples of normal fluctuation (default 3.0)", gt=0, le=1e6)
    grad_norm_threshold: float | None = _field(
        None, "ERROR level of the grad_norm rule, an absolute grad norm (WARNING at half)", gt=0, le=1e12)
    alert_interval: int = _field(500, "steps between repeats of one rule on one device", ge=0, le=STEPS)
    baseline_steps: int = _field(0, "steps at the start in which only absolute levels alert (NaN/Inf, a set "
                                    "threshold, a gross jump); 0: relative rules judge once they have tens of samples",
                                 ge=0, le=STEPS)
    resolve_after: int = _field(3, "clear samples in a row before a firing alert is resolved", ge=1,
                               le=10_000)
    rules: RulesConfig = _field(RulesConfig(), "per-rule settings")
    phases: list[PhaseConfig] = _field([], "step ranges with their own levels")

    def check(self) -> Iterator[tuple[str, str]]:
        spans = sorted((p.start_step, p.end_step, i) for i, p in enumerate(self.phases))
        for (s1, e1, i1), (s2, _, i2) in zip(spans, spans[1:], strict=False):
            if e1 is None or e1 > s2:
                yield f"phases[{i2}]", (f"overlaps phases[{i1}] (steps {s1}-{'end' if e1 is None else e1}); "
                                        "phases must not overlap")


@dataclasses.dataclass
class TrainingConfig:
    """Facts about the run that some rules need."""

    total_steps: int | None = _field(None, "planned optimizer steps (LR and forecast rules); null: MonitorCallback "
                                           "takes MindSpore's epochs x steps per epoch for the LR rule", ge=1, le=STEPS)
    warmup_steps: int | None = _field(None, "LR warmup length; null: inferred from the LR", ge=0, le=STEPS)
    target_loss: float | None = _field(None, "loss the run should reach (loss_forecast rule)",
                                       ge=-1e6, le=1e6)
    grad_accumulation_steps: int | None = _field(
        None, "micro-steps per optimizer step; step() numbers micro-steps when > 1; null: inferred from the rows "
        "(an LR and grad norm repeated over runs of k rows)", ge=1, le=100_000)
    seq_length: int | None = _field(None, "tokens per sample, for tokens/s", ge=1, le=100_000_000)


@dataclasses.dataclass
class TensorBoardConfig:
    enable: bool = _field(False, "write TensorBoard event files")
    log_dir: str = _field("./tb_logs", "event files go to LOG_DIR/RUN_ID/device_N")


@dataclasses.dataclass
class CsvConfig:
    enable: bool = _field(False, "write one CSV row per sampled step")
    path: str = _field("./msmon_logs/{run_id}.csv", "file; {run_id} and {device} are filled in")


# What the actions a rule may run take (timeout, factor, skip, max_norm): each is a key of an `actions:` entry. The
# parameters the job fills in itself (a rewind's alert step) are not keys.
_ACTION_PARAMS = tuple(dict.fromkeys(p.name for a in AUTOMATIC for p in ACTIONS[a].params if p.rule_key))


@dataclasses.dataclass
class ActionConfig:
    """What the job does by itself when a rule fires at a severity."""

    rule: str = _field("", "a rule name, or * for any rule")
    action: str = _field("", ", ".join(AUTOMATIC[:-1]) + " or " + AUTOMATIC[-1])
    severity: Literal["WARNING", "ERROR"] = _field("ERROR", "the severity that triggers it")
    factor: float | None = _field(None, "scale_lr only: the LR multiplier", gt=0, le=100)
    timeout: float | None = _field(None, "pause only: seconds before resuming by itself", gt=0,
                                   le=30 * DAY)
    skip: int | None = _field(None, "rewind only: batches skipped after the checkpoint's data position (null: those "
                                    "read since the checkpoint, so nothing is read twice)", ge=0, le=STEPS)
    max_norm: float | None = _field(None, "clip_grad only: the global grad norm to clip to (0: no clipping)", ge=0,
                                    le=1e12)

    def params(self) -> dict[str, object]:
        """The action's entry as the job queues it: {"action": ..., and each parameter set}."""
        out: dict[str, object] = {"action": self.action}
        for key in _ACTION_PARAMS:
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        return out

    def check(self) -> Iterator[tuple[str, str]]:
        if self.rule != "*" and self.rule not in RULES:
            hint = closest(self.rule, RULES)
            yield "rule", (f"unknown rule {shown(self.rule)}" + (f"; did you mean {hint}?" if hint else "")
                           + " (use * for any rule)")
        if self.action not in AUTOMATIC:
            hint = closest(self.action, AUTOMATIC)
            yield "action", (f"unknown action {shown(self.action)}" + (f"; did you mean {hint}?" if hint else "")
                             + "; actions are " + ", ".join(AUTOMATIC))
        action = ACTIONS[self.action] if self.action in AUTOMATIC else None
        for key in _ACTION_PARAMS:
            param = action.param(key) if action is not None else None
            if param is not None and param.required and getattr(self, key) is None:
                yield key, f"{self.action} needs a {key}, e.g. {key}: {param.example}"
            if param is None and getattr(self, key) is not None:
                takers = " or ".join(a for a in AUTOMATIC if ACTIONS[a].param(key))
                yield key, f"only {takers} takes a {key}, not {self.action}"
            elif param is not None and getattr(self, key) is not None:
                try:  # the bounds the bot and every rank apply (msmon/contract/actions.py)
                    check_param(self.action, key, getattr(self, key))
                except ParamError as exc:
                    yield key, str(exc)


@dataclasses.dataclass
class CheckpointRingConfig:
    """Health checkpoints: the last few checkpoints the job writes by itself, each marked healthy or not by what
    the rules said about its step; what `rewind` loads (docs/rewind.md)."""

    enable: bool = _field(False, "write health checkpoints (MonitorCallback, or JobControl.step_end in a custom loop)")
    every_steps: int | None = _field(None, "write one at every step that is a multiple of this (null: by minutes "
                                           "only; neither set: every 100 steps)", ge=1, le=STEPS)
    every_minutes: float | None = _field(None, "write one when this many minutes passed since the last (single-"
                                               "process runs: ranks must save at the same steps, so a multi-rank run "
                                               "needs every_steps)", gt=0, le=30 * 24 * 60)
    keep: int = _field(5, "checkpoints kept (plus the newest healthy one, when it is older than all of them)", ge=1,
                       le=1000)
    dir: str = _field("./msmon_ring", "folder of the ring's files; {run_id} and {device} are filled in (as safe "
                                      "names)")
    confirm_steps: int = _field(50, "steps after a checkpoint without an alert before it counts as healthy", ge=0,
                                le=STEPS)
    suspect_steps: int = _field(20, "an alert at step A makes the checkpoints from step A - suspect_steps on "
                                    "unhealthy (the trouble starts before the rules see it)", ge=0, le=STEPS)
    unhealthy_on: Literal["WARNING", "ERROR"] = _field("ERROR", "the alert severity that marks checkpoints unhealthy")


@dataclasses.dataclass
class RewindConfig:
    """The guard against rewind loops, and what a rewind reports (docs/rewind.md)."""

    max_rewinds: int = _field(3, "rewinds a run may make (per process); a rule's rewind after that escalates",
                              ge=0, le=10_000)
    min_steps_between: int = _field(200, "steps trained (redone ones included) between two rewinds; a rule's rewind "
                                         "sooner escalates", ge=0, le=STEPS)
    escalate: Literal["pause", "stop", "none"] = _field(
        "pause", "what a rule's rewind over the budget does instead (none: nothing, the alert stands)")
    report_after: int = _field(100, "steps after a rewind at which the job reports the loss against the pre-fault "
                                    "curve", ge=1, le=STEPS)


@dataclasses.dataclass
class BotConfig:
    """Where the job sends its events (used once the bot is running)."""

    url: str | None = _field(None, "bot base URL, e.g. http://msmon-bot:8080; or NATS JetStream servers, e.g. "
                                   "nats://nats:4222 (the bot's bot.nats.url)")
    nats_prefix: str = _field("msmon", "NATS subject prefix (the bot's bot.nats.prefix), when bot.url is nats://")
    run_id: str | None = _field(None, "run id; overrides the one given in code")
    token_env: str = _field("MSMON_TOKEN", "environment variable holding the job's bearer token")
    project: str = _field("default", "project name, for routing")
    labels: dict[str, str] = _field({}, "free-form labels, for routing")
    spool_dir: str = _field("./msmon_spool", "where events wait on disk while the bot is unreachable")
    spool_max_mb: float = _field(64.0, "spool file size cap, ERRORs included: metric samples make room first, then "
                                       "warnings, then the ERRORs' chart windows; an ERROR that would not fit even so "
                                       "is refused and counted (the bot says so in chat and status)",
                                ge=0.01, le=1e6)
    heartbeat_interval: float = _field(5.0, "seconds between heartbeats", ge=0.01, le=3600)
    commands: bool = _field(True, "take chat commands from the bot (pause, save-checkpoint, ...; MonitorCallback)")

    def check(self) -> Iterator[tuple[str, str]]:
        from msmon.contract.subjects import is_nats_url, nats_url_problem, prefix_problem
        from msmon.contract.wire import labels_problem, project_problem

        nats = is_nats_url(self.url)
        problem = (nats_url_problem(self.url) if nats else url_problem(self.url)) if self.url is not None else None
        if problem:
            yield "url", problem
        problem = prefix_problem(self.nats_prefix)
        if problem:
            yield "nats_prefix", problem
        # What the bot would refuse on every envelope (each a 422, the run's ERROR never sent): refused here,
        # by the wire's own check, before the job starts
        for key, problem in (("project", project_problem(self.project)), ("labels", labels_problem(self.labels))):
            if problem:
                yield key, problem


@dataclasses.dataclass(frozen=True)
class Taken:
    """How one MindFormers key of a file was taken (notifier/config/mindformers_apply.py): shown at start-up and by
    `msmon check-config`, so no key is accepted silently."""

    key: str  # "monitor_config.check_for_global_norm"
    value: Any
    how: str  # what msmon does with it, or instead of it
    acted: bool = True  # False: accepted, but msmon cannot act on it
    location: str | None = None  # "train.yaml:14"

    def __str__(self) -> str:
        where = f" ({self.location})" if self.location else ""
        return f"{self.key}: {shown(self.value)} -> {self.how}{where}"


@dataclasses.dataclass
class MonitorConfig:
    monitor_on: bool = _field(False, "master switch; off by default")
    # The keys the file or mapping set (None: built in code). Not a setting; lets messages say
    # "not set, defaults to ..." rather than guess.
    given: frozenset[str] | None = dataclasses.field(
        default=None, init=False, compare=False, repr=False, metadata={"internal": True})
    # How each MindFormers key of the file was taken (empty for a file in msmon's vocabulary alone).
    mindformers: tuple[Taken, ...] = dataclasses.field(
        default=(), init=False, compare=False, repr=False, metadata={"internal": True})
    step_interval: int = _field(1, "sample every Nth step", ge=1, le=1_000_000)
    log_interval: int = _field(100, "log line every Nth step (0: none)", ge=0, le=STEPS)
    metrics: list[Metric] = _field(list(ALL_METRICS), "metrics to sample")
    per_device_metrics: bool = _field(False, "track each device separately")
    deferred_read: bool = _field(False, "MonitorCallback reads step N's metrics at step N+1 (no stall; alerts a "
                                        "step later)")
    alert: AlertConfig = _field(AlertConfig(), "alert rules")
    training: TrainingConfig = _field(TrainingConfig(), "facts about the run")
    tensorboard: TensorBoardConfig = _field(TensorBoardConfig(), "TensorBoard output")
    csv: CsvConfig = _field(CsvConfig(), "CSV output")
    actions: list[ActionConfig] = _field([], "automatic job actions")
    checkpoint_ring: CheckpointRingConfig = _field(CheckpointRingConfig(), "health checkpoints (what rewind loads)")
    rewind: RewindConfig = _field(RewindConfig(), "rewind budget and report")
    bot: BotConfig = _field(BotConfig(), "the msmon bot")
