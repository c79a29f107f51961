"""MindFormers' own monitor settings, taken into msmon's monitor_config: pure translation, every key recorded.

A MindFormers training YAML carries `monitor_config` with MindFormers' keys (`mindformers/tools/register/
template.py` MonitorConfig, read by `TrainingStateMonitor` in `mindformers/core/callback/callback.py`), switches
beside it at the top level (`check_for_nan_in_loss_and_grad`, `use_skip_data_by_global_norm`,
`use_checkpoint_health_monitor`), a `tensorboard:` section, and, for the PyNative trainer, a `monitor:` section.
msmon's own settings go in the `MsmonCallback` entry of the YAML's `callbacks:` list (MindFormers builds it through
its registry and hands it the entry's keys; docs/user-guide/mindformers.md): MindFormers' config template (1.6 on)
refuses any other key in `monitor_config` of a training run ("The config 'monitor_config' gets an unexpected key"), and
so does msmon. A file without that entry and without MindFormers' run_mode (a standalone msmon file) may still mix
msmon's keys into its `monitor_config`. This module

- splits a section into msmon's keys and MindFormers' (`split`), so a typo gets "did you mean" against both;
- validates MindFormers' keys with the types and ranges MindFormers itself enforces (`read`);
- applies what msmon can act on to a built MonitorConfig and records how every key was taken (`apply`): the
  global-norm threshold and count become the grad_norm rule's ERROR level and run length, `*_format` choose the
  log line and TensorBoard, `step_interval` is the sampling interval; keys msmon cannot act on are recorded with
  what msmon does instead. Where an msmon key says otherwise, msmon's key wins and the record says so.

No I/O: the loader hands it parsed YAML, `describe()` and `msmon check-config` print the record.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from msmon.config.errors import closest, shown
from msmon.config.validate import Context, build, fields_of, setting, spec
from msmon.config.yamlio import LineDict, location_of

from .model import MonitorConfig, Taken

SECTION = "monitor_config"
PYNATIVE = "monitor"  # the PyNative trainer's section (docs: feature/monitor.md, r2.0)
CALLBACK = "MsmonCallback"  # the `type` of msmon's entry in a training YAML's callbacks list
# Keys of that entry that are the callback's own arguments (or MindFormers' registry's), not monitor settings
CALLBACK_OPTIONS = ("type", "auto_register", "run_id", "checkpoint_dir", "seq_length", "pause_timeout", "resume_from",
                    "device", "config")  # config: a standalone msmon file whose keys the entry's own keys override
# The run modes in which MindFormers' config template checks monitor_config's keys (ConfigTemplate.train_configs)
_CHECKED_RUN_MODES = ("train", "finetune", "predict_with_train_model")
_SHARED = ("monitor_on", "step_interval")  # keys both vocabularies have
_OUTPUTS = ("log", "tensorboard")


def _parse_format(value: Any, path: str, ctx: Context) -> Any:
    """A `*_format`: 'log', 'tensorboard', a list of them, or null (MindFormers' _check_attr_formats)."""
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        ctx.error(path, f"expected 'log', 'tensorboard', a list of them or null, got {shown(value)}")
        return ()
    bad = [i for i in items if i not in _OUTPUTS]
    if bad:
        hint = closest(bad[0], _OUTPUTS)
        ctx.error(path, f"{shown(bad[0])} is not an output; use log, tensorboard, a list of them or null"
                  + (f" (did you mean {hint}?)" if hint else ""))
        return ()
    return tuple(dict.fromkeys(items))


def _parse_mapping(value: Any, path: str, ctx: Context) -> Any:
    """A nested section msmon only records (its keys are MindFormers' business)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        ctx.error(path, f"expected a mapping (a section with keys), got {shown(value)}")
        return {}
    return dict(value)


def _parse_selection(value: Any, path: str, ctx: Context) -> Any:
    """PyNative `local_norm` / `device_norm`: true (all parameters), a name fragment or a list of them, ''/false."""
    if value is None or value is False or value == "":
        return ()
    if value is True:
        return (".*",)
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        ctx.error(path, f"expected true, false, a parameter name fragment or a list of them, got {shown(value)}")
        return ()
    return tuple(items)


def _fmt(doc: str) -> Any:
    return dataclasses.field(default=(), metadata=spec(parser=_parse_format, doc=doc))


@dataclasses.dataclass
class StableRankConfig:
    """monitor_config.stable_rank_config (MindFormers' StableRankConfig)."""

    format: tuple[str, ...] = _fmt("where the weights' stable rank goes")
    step_interval: int = setting(100, "steps between stable-rank computations", ge=1, le=10**9)
    target: list[str] | None = setting(None, "parameter name regexes")
    do_aggregation: bool = setting(False, "aggregate sharded weights first")
    moe_show_mode: Literal["all", "full", "statistics"] = setting("all", "per expert, statistics, or both")
    power_iteration_num: int = setting(5, "power iterations per estimate", ge=1, le=10_000)


@dataclasses.dataclass
class MindFormersMonitor:
    """MindFormers' keys of monitor_config besides monitor_on and step_interval (which msmon shares)."""

    dump_path: str | None = setting("./dump", "where MindFormers dumps local norms and losses (null: ./dump)")
    target: list[str] | None = setting(None, "parameter name regexes for local_norm / optimizer_state")
    invert: bool | None = setting(False, "monitor the parameters target does not match (null: false)")
    local_loss_format: tuple[str, ...] = _fmt("local loss outputs")
    device_local_loss_format: tuple[str, ...] = _fmt("device local loss outputs")
    local_norm_format: tuple[str, ...] = _fmt("per-parameter gradient norm outputs")
    device_local_norm_format: tuple[str, ...] = _fmt("per-device gradient norm outputs")
    optimizer_state_format: tuple[str, ...] = _fmt("optimizer moment norm outputs")
    weight_state_format: tuple[str, ...] = _fmt("weight L2 norm outputs")
    max_attention_logit_format: tuple[str, ...] = _fmt("max attention logit outputs")
    throughput_baseline: float | None = setting(None, "throughput (samples/s per device) for linearity", gt=0,
                                                le=1e12)
    print_struct: bool | None = setting(False, "print parameter names at the first step, then stop (null: false)")
    check_for_global_norm: bool | None = setting(False, "stop the run when the global norm reaches the threshold "
                                                 "(null: false)")
    global_norm_spike_threshold: float = setting(3.0, "global norm at which MindFormers acts", gt=0, le=1e12)
    global_norm_spike_count_threshold: int = setting(10, "steps in a row at or above it before stopping", ge=1,
                                                     le=10_000)
    stable_rank_config: StableRankConfig | None = setting(None, "weights' stable rank")
    health_checkpoint: dict[str, Any] = dataclasses.field(
        default_factory=dict, metadata=spec(parser=_parse_mapping, doc="checkpoint health settings"))
    # Spellings MindFormers has dropped; recognised, and the current one suggested.
    global_norm_error_threshold: float | None = setting(None, "old name of global_norm_spike_threshold", gt=0,
                                                        le=1e12)
    global_norm_record_path: str | None = setting(None, "removed: the record is OUTPUT_DIR/abnormal_global_norm.json")


DEPRECATED = {
    "global_norm_error_threshold": "renamed global_norm_spike_threshold in MindFormers 1.6, which refuses the old "
                                   "name (unexpected key); rename it",
    "global_norm_record_path": "removed in MindFormers 1.6 (the record is OUTPUT_DIR/abnormal_global_norm.json), "
                               "which refuses it (unexpected key); delete it",
}


@dataclasses.dataclass
class Switches:
    """The top-level keys of a MindFormers training YAML that change what its monitor does."""

    check_for_nan_in_loss_and_grad: bool = setting(False, "stop on a NaN/Inf loss or grad norm")
    use_skip_data_by_global_norm: bool = setting(False, "skip batches whose global norm reaches the threshold")
    use_checkpoint_health_monitor: bool = setting(False, "record each checkpoint's embedding-norm health")


@dataclasses.dataclass
class TrainState:
    """monitor.train_state of the PyNative trainer."""

    local_norm: tuple[str, ...] = dataclasses.field(
        default=(), metadata=spec(parser=_parse_selection, doc="per-parameter gradient norms"))
    local_loss: bool = setting(False, "each micro-batch's loss")
    device_norm: tuple[str, ...] = dataclasses.field(
        default=(), metadata=spec(parser=_parse_selection, doc="per-device accumulated gradient norms"))
    device_loss: bool = setting(False, "the device's loss after accumulation")


@dataclasses.dataclass
class MoeMonitor:
    """monitor.moe_monitor of the PyNative trainer."""

    save_tokens_per_expert_interval: int | None = setting(None, "steps between expert-load records", ge=0,
                                                          le=10**9)


@dataclasses.dataclass
class PyNativeMonitor:
    train_state: TrainState = setting(TrainState(), "norm and loss monitoring")
    moe_monitor: MoeMonitor = setting(MoeMonitor(), "MoE expert-load monitoring")


@dataclasses.dataclass
class MindFormers:
    """What a file says in MindFormers' vocabulary; `given` holds the key paths it set."""

    monitor: MindFormersMonitor
    switches: Switches
    pynative: PyNativeMonitor | None
    tensorboard_dir: str | None
    given: frozenset[str]
    misspelt: tuple[tuple[str, str], ...] = ()  # (top-level key, the switch it is close to)

    @property
    def present(self) -> bool:
        return bool(self.given or self.misspelt)


MINDFORMERS_KEYS = frozenset(fields_of(MindFormersMonitor))
_SWITCH_KEYS = tuple(fields_of(Switches))


def _subset(mapping: Mapping[str, Any], keys: Iterable[str]) -> LineDict:
    """The entries of `mapping` under `keys`, keeping their file lines for messages."""
    out = LineDict({k: mapping[k] for k in keys})
    if isinstance(mapping, LineDict):
        out.lines = {k: v for k, v in mapping.lines.items() if k in out}
        out.where = mapping.where
    return out


def checked_by_mindformers(top: Mapping[str, Any] | None) -> bool:
    """Whether MindFormers' config template checks this file's monitor_config keys: a training YAML whose run_mode
    is one of the training modes (MindFormerConfig(path) applies the template; other modes ignore the section)."""
    return isinstance(top, Mapping) and top.get("run_mode") in _CHECKED_RUN_MODES


def _refused(key: str) -> str:
    return (f"MindFormers refuses this file (KeyError: The config 'monitor_config' gets an unexpected key: {key}); "
            f"msmon's settings go in the {CALLBACK} entry of callbacks: (docs/user-guide/mindformers.md), e.g. "
            f"callbacks: [{{type: {CALLBACK}, {key}: ...}}]")


def split(section: Mapping[str, Any], ctx: Context, refuse_msmon: bool = False) -> tuple[LineDict, LineDict]:
    """(msmon's keys, MindFormers' keys) of a monitor_config; an unknown key is an issue with a "did you mean"
    against both vocabularies. monitor_on and step_interval belong to both: msmon builds them. `refuse_msmon`: the
    file is a MindFormers training YAML, whose loader refuses msmon's other keys here."""
    msmon = fields_of(MonitorConfig)
    ours, theirs = [], []
    for raw in section:
        key = str(raw)
        if key in msmon and refuse_msmon and key not in _SHARED:
            ctx.error(f"{SECTION}.{key}", _refused(key), section, key)
        elif key in msmon:
            ours.append(key)
        elif key in MINDFORMERS_KEYS:
            theirs.append(key)
        else:
            ctx.error(f"{SECTION}.{key}", _unknown(key, msmon, MINDFORMERS_KEYS), section, key)
    return _subset(section, ours), _subset(section, theirs)


def callback_entry(data: Any) -> tuple[int, Mapping[str, Any]] | None:
    """(its index, the entry) of the first `type: MsmonCallback` in a training YAML's callbacks list; None when
    the file has none."""
    calls = data.get("callbacks") if isinstance(data, Mapping) else None
    if not isinstance(calls, list):
        return None
    for i, item in enumerate(calls):
        if isinstance(item, Mapping) and item.get("type") == CALLBACK:
            return i, item
    return None


def split_entry(entry: Mapping[str, Any], index: int, section: Mapping[str, Any] | None,
                ctx: Context) -> tuple[LineDict, LineDict, str]:
    """(msmon's keys, MindFormers' keys, the prefix of msmon's keys in messages) of a training YAML with an
    MsmonCallback entry: msmon's keys are the entry's (besides the callback's own arguments), MindFormers' are
    monitor_config's, where an msmon key is refused as MindFormers refuses it. monitor_config.step_interval is
    msmon's sampling interval too unless the entry sets one; monitor_config.monitor_on stays MindFormers' switch of
    its own TrainingStateMonitor (msmon is on when the entry is there, unless it says monitor_on: false)."""
    prefix = f"callbacks[{index}]"
    msmon = fields_of(MonitorConfig)
    ours = []
    for raw in entry:
        key = str(raw)
        if key in CALLBACK_OPTIONS:
            continue
        if key in msmon:
            ours.append(key)
        elif key in MINDFORMERS_KEYS:
            ctx.error(f"{prefix}.{key}", "a MindFormers monitor_config key: MindFormers reads it only in "
                      "monitor_config, so put it there (msmon takes it from there too)", entry, key)
        else:
            hint = closest(key, sorted(msmon) + list(CALLBACK_OPTIONS))
            keys = f"msmon's monitor settings ({', '.join(sorted(msmon))}) and {', '.join(CALLBACK_OPTIONS[2:])}"
            ctx.error(f"{prefix}.{key}", f"unknown key of the {CALLBACK} entry; "
                      + (f"did you mean {hint}?" if hint else f"it takes {keys}"), entry, key)
    mine = _subset(entry, ours)
    theirs: list[str] = []
    if isinstance(section, Mapping):
        for raw in section:
            key = str(raw)
            if key in MINDFORMERS_KEYS:
                theirs.append(key)
            elif key in _SHARED:
                if key == "step_interval" and key not in mine:
                    mine[key] = section[key]
            elif key in msmon:
                ctx.error(f"{SECTION}.{key}", _refused(key), section, key)
            else:
                ctx.error(f"{SECTION}.{key}", _unknown(key, msmon, MINDFORMERS_KEYS), section, key)
    return mine, _subset(section or {}, theirs), prefix


def _unknown(key: str, msmon: Iterable[str], mindformers: Iterable[str]) -> str:
    ours, theirs = sorted(msmon), sorted(mindformers)
    hint = closest(key, ours + theirs)
    if hint:
        return f"unknown key; did you mean {hint}{' (a MindFormers key)' if hint in theirs else ''}?"
    return (f"unknown key; valid keys here are {', '.join(ours)} (msmon's) and {', '.join(theirs)} "
            "(MindFormers')")


def read(data: Mapping[str, Any] | None, theirs: Mapping[str, Any], ctx: Context) -> MindFormers:
    """MindFormers' settings of a file: `theirs` (from `split`) and, from the file's top level `data`, the
    switches, `tensorboard.tensorboard_dir` and the PyNative `monitor:` section. Problems go to `ctx`."""
    top: Mapping[str, Any] = data if isinstance(data, Mapping) else {}
    start = len(ctx.issues)
    mon = build(MindFormersMonitor, theirs, SECTION, ctx)
    _fill_locations(ctx, start, theirs, SECTION)
    given = {f"{SECTION}.{k}" for k in theirs}
    switches = build(Switches, _subset(top, [k for k in _SWITCH_KEYS if k in top]), "", ctx)
    given |= {k for k in _SWITCH_KEYS if k in top}
    if mon.check_for_global_norm and switches.use_skip_data_by_global_norm:
        ctx.error(f"{SECTION}.check_for_global_norm", "MindFormers refuses check_for_global_norm together with "
                  "use_skip_data_by_global_norm ('cannot be turned on at the same time'); turn one off",
                  theirs, "check_for_global_norm")
    pynative = None
    section = top.get(PYNATIVE)
    if PYNATIVE in top:
        if isinstance(section, Mapping):
            start = len(ctx.issues)
            pynative = build(PyNativeMonitor, section, PYNATIVE, ctx)
            _fill_locations(ctx, start, section, PYNATIVE)
        elif section is not None:
            ctx.error(PYNATIVE, f"expected the PyNative trainer's monitor section (train_state, moe_monitor), "
                      f"got {shown(section)}", top, PYNATIVE)
        given.add(PYNATIVE)
    if checked_by_mindformers(top) and isinstance(top.get("callbacks"), list):
        for i, item in enumerate(top["callbacks"]):
            if not isinstance(item, Mapping) or "type" not in item:
                ctx.error(f"callbacks[{i}]", "MindFormers refuses a callbacks entry without `type` (KeyError: The "
                          "config 'callbacks' is missing a required key: type)")
    tb = top.get("tensorboard")
    tb_dir = tb.get("tensorboard_dir") if isinstance(tb, Mapping) else None
    return MindFormers(mon, switches, pynative, tb_dir if isinstance(tb_dir, str) and tb_dir else None,
                       frozenset(given), _misspelt_switches(top))


def _misspelt_switches(top: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """Top-level keys very close to a switch: MindFormers only warns that an unknown key is useless, so a
    misspelt switch does nothing there. A training YAML has many other top-level keys, hence the high cutoff."""
    out = []
    for raw in top:
        key = str(raw)
        match = difflib.get_close_matches(key, _SWITCH_KEYS, n=1, cutoff=0.85) if key not in _SWITCH_KEYS else []
        if match:
            out.append((key, match[0]))
    return tuple(out)


def _fill_locations(ctx: Context, start: int, root: Mapping[str, Any], prefix: str) -> None:
    """Give the issues from `start` on that have no file line (a field parser's) the line of their key."""
    for i in range(start, len(ctx.issues)):
        issue = ctx.issues[i]
        if issue.location is not None or issue.path == prefix:
            continue
        parts = issue.path.removeprefix(f"{prefix}.").split(".")
        node: Any = root
        for part in parts[:-1]:
            node = node.get(part) if isinstance(node, Mapping) else None
        where = location_of(node, parts[-1])
        if where is not None:
            ctx.issues[i] = dataclasses.replace(issue, location=where)


# --- what msmon does with each key ---------------------------------------------------------------------------

_NOT_COMPUTED = "msmon does not compute it and writes nothing for it"
_NOT_ACTED = {
    "dump_path": "msmon does not read MindFormers' dump files; its own CSV goes to csv.path, its TensorBoard "
                 "scalars to tensorboard.log_dir",
    "target": "a per-parameter selection: msmon watches the global grad norm over all parameters instead "
              "(grad_norm, grad_norm_spike, grad_norm_creep)",
    "invert": "goes with target: msmon watches the global grad norm over all parameters instead",
    "optimizer_state_format": f"optimizer moment norms: {_NOT_COMPUTED}",
    "weight_state_format": f"weight L2 norms: {_NOT_COMPUTED}",
    "max_attention_logit_format": f"max attention logits: {_NOT_COMPUTED}",
    "print_struct": "MindFormers prints the parameter names at the first step and stops the run; msmon adds "
                    "nothing (expect the run to end at step 1)",
    "stable_rank_config": f"weights' stable rank: {_NOT_COMPUTED}",
}
# *_format keys of metrics msmon has an equivalent of: their outputs become msmon's, for that equivalent.
_FORMATS = {
    "local_loss_format": "msmon's step loss (metrics: loss) stands for the local loss",
    "device_local_loss_format": "msmon's step loss (metrics: loss) stands for the device local loss",
    "local_norm_format": "msmon does not compute per-parameter norms; its global grad norm goes there instead",
    "device_local_norm_format": "msmon's global grad norm stands for the device local norm",
}


class _Record:
    """Collects how each key was taken, in file order, one line per key."""

    def __init__(self, section: Mapping[str, Any], data: Mapping[str, Any] | None) -> None:
        self.lines: list[Taken] = []
        self._section = section
        self._top: Mapping[str, Any] = data if isinstance(data, Mapping) else {}

    def top_value(self, key: str) -> Any:
        return self._top.get(key)

    def add(self, key: str, value: Any, how: str, acted: bool = True) -> None:
        """Record `key`, shown with the value the file wrote where it wrote one, else with `value`."""
        short = key.removeprefix(f"{SECTION}.")
        where = location_of(self._section, short) if short != key else location_of(self._top, key.split(".")[0])
        if short != key and short in self._section:
            value = self._section[short]
        self.lines.append(Taken(key, value, how, acted, where))


def _given(section: Mapping[str, Any], *path: str) -> Any:
    """The value an msmon key path has in the raw section, or None where it is not set."""
    node: Any = section
    for part in path:
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def apply(cfg: MonitorConfig, mf: MindFormers, section: Mapping[str, Any],
          data: Mapping[str, Any] | None, theirs: Mapping[str, Any] | None = None,
          entry: Mapping[str, Any] | None = None) -> tuple[Taken, ...]:
    """Change `cfg` where MindFormers' keys have an msmon meaning (msmon's own keys win); the record of every
    MindFormers key. `section` holds msmon's keys as given (to know which were set). With an MsmonCallback `entry`,
    `theirs` is the file's monitor_config (msmon's keys are the entry's, from `split_entry`)."""
    if entry is not None:
        rec = _Record(theirs or {}, data)
        _entry_switches(cfg, theirs or {}, entry, rec)
        return _apply(cfg, mf, section, rec, has_section=False)
    if not mf.present:  # no MindFormers key in monitor_config; the file's own facts of the run still count
        rec = _Record(section, data)
        _training_facts(cfg, section, rec)
        return tuple(rec.lines)
    rec = _Record(section, data)
    has_section = any(k.startswith(f"{SECTION}.") for k in mf.given) or bool(section)
    return _apply(cfg, mf, section, rec, has_section)


def _entry_switches(cfg: MonitorConfig, theirs: Mapping[str, Any], entry: Mapping[str, Any], rec: _Record) -> None:
    """With an MsmonCallback entry, monitor_config's monitor_on is MindFormers' own monitor's switch, and its
    step_interval msmon's sampling interval unless the entry sets one."""
    if "monitor_on" not in entry:
        cfg.monitor_on = True
    if "monitor_on" in theirs:
        rec.add(f"{SECTION}.monitor_on", theirs["monitor_on"], "MindFormers' switch of its own TrainingStateMonitor; "
                f"msmon's is the {CALLBACK} entry's monitor_on (monitoring is {'on' if cfg.monitor_on else 'off'})",
                acted=False)
    if "step_interval" in theirs:
        own = "step_interval" in entry
        rec.add(f"{SECTION}.step_interval", theirs["step_interval"],
                f"the {CALLBACK} entry's step_interval {cfg.step_interval} wins" if own
                else f"msmon's sampling interval too: a sample every {cfg.step_interval} step(s)")


def _apply(cfg: MonitorConfig, mf: MindFormers, section: Mapping[str, Any], rec: _Record,
           has_section: bool) -> tuple[Taken, ...]:
    m, given = mf.monitor, mf.given
    if has_section:
        rec.add(f"{SECTION}.monitor_on", cfg.monitor_on, "msmon's key too, same meaning: monitoring is "
                + ("on" if cfg.monitor_on else "off"))
        rec.add(f"{SECTION}.step_interval", cfg.step_interval,
                f"msmon's key too, same meaning: a sample every {cfg.step_interval} step(s)")
    _global_norm(cfg, mf, section, rec)
    _outputs(cfg, mf, section, rec)
    for key, how in _NOT_ACTED.items():
        path = key if key in _SWITCH_KEYS else f"{SECTION}.{key}"
        if path in given:
            value = getattr(mf.switches if key in _SWITCH_KEYS else m, key)
            rec.add(path, value, f"not acted on: {how}", acted=False)
    if f"{SECTION}.throughput_baseline" in given:
        _throughput_baseline(cfg, m.throughput_baseline, section, rec)
    _nan_switch(cfg, mf, section, rec)
    _health(cfg, mf, section, rec)
    _training_facts(cfg, section, rec)
    for key, switch in mf.misspelt:
        rec.add(key, rec.top_value(key), f"not acted on: not a MindFormers key (MindFormers warns that it is "
                f"useless and ignores it); did you mean {switch}?", acted=False)
    _pynative(cfg, mf, section, rec)
    for key, why in DEPRECATED.items():
        if f"{SECTION}.{key}" in given:
            rec.add(f"{SECTION}.{key}", getattr(m, key), f"a deprecated MindFormers spelling: {why}",
                    acted=key == "global_norm_error_threshold")
    return tuple(rec.lines)


# MindFormers' keys that are facts of the run msmon's `training` section holds: (their path, msmon's key)
_TRAINING_FACTS = (
    (("runner_config", "gradient_accumulation_steps"), "grad_accumulation_steps"),
    (("lr_schedule", "total_steps"), "total_steps"),
    (("lr_schedule", "warmup_steps"), "warmup_steps"),
)


def _training_facts(cfg: MonitorConfig, section: Mapping[str, Any], rec: _Record) -> None:
    """The run's accumulation, total and warmup steps from MindFormers' runner_config and lr_schedule (issue 37):
    the rules judge optimizer steps, and lr_schedule warns of a warmup as long as the run. msmon's own
    `training.*` keys win; a MindFormers value that is not a positive count (total_steps -1: computed from the
    epochs) is recorded and not taken."""
    for (block, key), ours in _TRAINING_FACTS:
        theirs = rec.top_value(block)
        if not isinstance(theirs, Mapping) or key not in theirs:
            continue
        value, path = theirs[key], f"{block}.{key}"
        own = _given(section, "training", ours)
        if own is not None:
            rec.add(path, value, f"msmon's own training.{ours} ({own}) wins")
        elif isinstance(value, bool) or not isinstance(value, int) or value < (1 if ours != "warmup_steps" else 0):
            rec.add(path, value, f"not acted on: not a count of steps msmon can use as training.{ours}", acted=False)
        else:
            setattr(cfg.training, ours, value)
            rec.add(path, value, f"msmon's training.{ours}: {value}")


def _threshold(mf: MindFormers) -> tuple[float, str]:
    """The global-norm threshold and the key it came from (the current spelling wins over the old one)."""
    m, given = mf.monitor, mf.given
    if f"{SECTION}.global_norm_spike_threshold" not in given and m.global_norm_error_threshold is not None:
        return m.global_norm_error_threshold, "global_norm_error_threshold"
    return m.global_norm_spike_threshold, "global_norm_spike_threshold"


def _health(cfg: MonitorConfig, mf: MindFormers, section: Mapping[str, Any], rec: _Record) -> None:
    """use_checkpoint_health_monitor / health_checkpoint: MindFormers marks each checkpoint healthy or not and a
    resume picks the newest healthy one; msmon's health checkpoints (checkpoint_ring, docs/rewind.md) do the same
    for `rewind`, marked by msmon's rules. The health threshold on the global norm becomes the grad_norm rule's
    ERROR level (what marks a checkpoint unhealthy), unless an msmon key or check_for_global_norm set one."""
    given = mf.given
    if "use_checkpoint_health_monitor" in given:
        on = bool(mf.switches.use_checkpoint_health_monitor)
        own = _given(section, "checkpoint_ring", "enable")
        if own is not None:
            rec.add("use_checkpoint_health_monitor", on, f"msmon's own checkpoint_ring.enable ({own}) wins")
        elif on:
            cfg.checkpoint_ring.enable = True
            ring = cfg.checkpoint_ring
            rec.add("use_checkpoint_health_monitor", on, "msmon keeps health checkpoints (checkpoint_ring.enable): "
                    f"every {ring.every_steps or 100} steps, the last {ring.keep}, each marked healthy or not by "
                    "msmon's rules; `rewind` loads the newest healthy one (docs/rewind.md)")
        else:
            rec.add("use_checkpoint_health_monitor", on, "off: msmon keeps no health checkpoints")
    key = f"{SECTION}.health_checkpoint"
    if key not in given:
        return
    health = mf.monitor.health_checkpoint or {}
    threshold = health.get("global_norm_spike_threshold")
    parts, acted = [], False
    if isinstance(threshold, (int, float)) and not isinstance(threshold, bool) and threshold > 0:
        rule = cfg.alert.rules.get("grad_norm")
        own = _given(section, "alert", "rules", "grad_norm", "error") or _given(section, "alert",
                                                                                 "grad_norm_threshold")
        if own is None and f"{SECTION}.check_for_global_norm" not in given:
            rule.error = float(threshold)
            rule.out_of_scale = None
            acted = True
            parts.append(f"global_norm_spike_threshold {threshold:g} is msmon's grad_norm ERROR level: a checkpoint "
                         "within checkpoint_ring.suspect_steps of it is unhealthy")
        else:
            parts.append(f"global_norm_spike_threshold {threshold:g}: msmon's grad_norm ERROR level is already set "
                         f"({rule.error:g}) and wins")
    if "embedding_local_norm_threshold" in health:
        parts.append("embedding_local_norm_threshold: not acted on (msmon does not read the embedding norm)")
    if not acted:
        parts.insert(0, "not acted on: checkpoint health is MindFormers' record; msmon's own is checkpoint_ring, "
                        "marked by msmon's rules")
    rec.add(key, health, "; ".join(parts), acted=acted)


def _throughput_baseline(cfg: MonitorConfig, baseline: float | None, section: Mapping[str, Any],
                         rec: _Record) -> None:
    """throughput_baseline: MindFormers logs throughput / baseline as linearity; msmon judges the loss of
    throughput against it (samples/s per device) from the first span, instead of against a learned median."""
    key = f"{SECTION}.throughput_baseline"
    if baseline is None:
        rec.add(key, baseline, "not acted on: no rate given; throughput_drop judges against the run's own median",
                acted=False)
        return
    rule = cfg.alert.rules.get("throughput_drop")
    own = _given(section, "alert", "rules", "throughput_drop", "expected")
    if own is not None:
        rec.add(key, baseline, f"msmon's own throughput_drop expected rate {own:g} samples/s wins")
        return
    rule.expected = baseline
    rec.add(key, baseline, f"the expected rate of msmon's throughput_drop rule: {baseline:g} samples/s per device; "
            f"a loss of {rule.warning:.0%} is a WARNING, {rule.error:.0%} an ERROR, judged from the first span "
            "(samples that report samples/s)")


def _global_norm_switches(mf: MindFormers, threshold: float, rec: _Record) -> None:
    """What MindFormers itself does at the global norm's threshold, as its two switches say (when given)."""
    m, given, skip = mf.monitor, mf.given, mf.switches.use_skip_data_by_global_norm
    if "use_skip_data_by_global_norm" in given:
        rec.add("use_skip_data_by_global_norm", skip, "MindFormers skips each batch whose global norm reaches "
                f"{threshold:g} and stops after {m.global_norm_spike_count_threshold} in a row" if skip else
                "off: MindFormers skips no batch")
    if f"{SECTION}.check_for_global_norm" in given:
        rec.add(f"{SECTION}.check_for_global_norm", m.check_for_global_norm,
                f"MindFormers stops the run at the first step whose global norm reaches {threshold:g}"
                if m.check_for_global_norm else "off: MindFormers does not stop on the global norm")


def _global_norm(cfg: MonitorConfig, mf: MindFormers, section: Mapping[str, Any], rec: _Record) -> None:
    """check_for_global_norm / use_skip_data_by_global_norm: MindFormers stops (or skips, then stops) at the
    threshold, so msmon's grad_norm rule must page by then: its ERROR level is the threshold and its run length
    short enough to fire before MindFormers' stop."""
    m, given, skip = mf.monitor, mf.given, mf.switches.use_skip_data_by_global_norm
    threshold, source = _threshold(mf)
    count = m.global_norm_spike_count_threshold
    _global_norm_switches(mf, threshold, rec)
    active = m.check_for_global_norm or skip
    if not active:
        for key in ("global_norm_spike_threshold", "global_norm_spike_count_threshold"):
            if f"{SECTION}.{key}" in given:
                rec.add(f"{SECTION}.{key}", getattr(m, key), "not acted on: MindFormers reads it only with "
                        "check_for_global_norm or use_skip_data_by_global_norm; msmon's grad_norm levels stay as "
                        "they are", acted=False)
        return
    rule = cfg.alert.rules.get("grad_norm")
    own_error = _given(section, "alert", "rules", "grad_norm", "error") or _given(section, "alert",
                                                                                   "grad_norm_threshold")
    if own_error is None:
        rule.error = threshold
        rule.out_of_scale = None  # MindFormers acts at it whatever the run's scale: so does msmon
        level = (f"ERROR level of msmon's grad_norm rule ({threshold:g}; WARNING at {rule.warning_level():g}), "
                 "so msmon pages when MindFormers acts")
    else:
        late = rule.error is not None and rule.error > threshold
        level = (f"msmon's own grad_norm ERROR level {rule.error:g} wins over {source} {threshold:g}"
                 + (f"; MindFormers acts at {threshold:g}, before msmon would page: lower it" if late else ""))
    steps = 1 if m.check_for_global_norm else count
    # MindFormers stops at the `steps`-th step in a row at or above the threshold; msmon counts samples, one
    # every step_interval steps, and must fire before that step: at most (steps - 1) // step_interval samples.
    run = max(1, (steps - 1) // cfg.step_interval)
    if _given(section, "alert", "rules", "grad_norm", "consecutive") is None:
        rule.consecutive = run
        length = f"it fires after {run} sample(s) in a row at or above it"
    else:
        length = f"msmon's own alert.rules.grad_norm.consecutive {rule.consecutive} wins (the translation gives {run})"
    if skip:
        rec.add(f"{SECTION}.{source}", threshold, level)
        rec.add(f"{SECTION}.global_norm_spike_count_threshold", count,
                f"run length of the grad_norm rule: {length}, before MindFormers stops at the {count}th step in a row")
    else:
        rec.add(f"{SECTION}.{source}", threshold, f"{level}; {length} (MindFormers stops at the first)")
        if f"{SECTION}.global_norm_spike_count_threshold" in given:
            rec.add(f"{SECTION}.global_norm_spike_count_threshold", count, "not acted on: MindFormers counts "
                    "steps in a row only with use_skip_data_by_global_norm; with check_for_global_norm it stops "
                    "at the first", acted=False)
    if skip and count > 1 and run * cfg.step_interval > count - 1:
        rec.add(f"{SECTION}.step_interval", cfg.step_interval, f"MindFormers stops after {count} steps in a row, "
                f"msmon samples every {cfg.step_interval}: the run can stop before msmon pages; a step_interval of "
                f"at most {count - 1} pages first", acted=False)
    if m.check_for_global_norm and cfg.step_interval > 1:
        rec.add(f"{SECTION}.step_interval", cfg.step_interval, "MindFormers checks the global norm every step, "
                f"msmon every {cfg.step_interval}: a one-step spike between samples stops the run unseen by msmon; "
                "step_interval: 1 catches it", acted=False)


def _outputs(cfg: MonitorConfig, mf: MindFormers, section: Mapping[str, Any], rec: _Record) -> None:
    """`*_format`: 'log' gives a log line at every sample, 'tensorboard' turns msmon's TensorBoard on (in
    MindFormers' tensorboard_dir); without a MindFormers `tensorboard:` section MindFormers logs instead, and
    so does msmon."""
    m, given = mf.monitor, mf.given
    wanted: set[str] = set()
    for key, what in _FORMATS.items():
        if f"{SECTION}.{key}" not in given:
            continue
        outs = set(getattr(m, key))
        if "tensorboard" in outs and mf.tensorboard_dir is None:
            outs = (outs - {"tensorboard"}) | {"log"}
            what += "; no MindFormers tensorboard section, so 'tensorboard' means 'log' (as in MindFormers)"
        wanted |= outs
        rec.add(f"{SECTION}.{key}", list(getattr(m, key)),
                f"{what}: " + (" and ".join(_output_words(o) for o in sorted(outs)) or "no output"))
    if "log" in wanted:
        if _given(section, "log_interval") is None:
            cfg.log_interval = cfg.step_interval
        elif cfg.log_interval != cfg.step_interval:
            rec.add(f"{SECTION}.log_interval", cfg.log_interval, f"msmon's own log_interval {cfg.log_interval} "
                    "wins over the 'log' of the *_format keys (a line every sample)")
    if "tensorboard" in wanted:
        tb = _given(section, "tensorboard", "enable")
        if tb is None:
            cfg.tensorboard.enable = True
        elif not cfg.tensorboard.enable:
            rec.add(f"{SECTION}.tensorboard.enable", False, "msmon's own tensorboard.enable: false wins over the "
                    "'tensorboard' of the *_format keys")
        if mf.tensorboard_dir is not None and _given(section, "tensorboard", "log_dir") is None:
            cfg.tensorboard.log_dir = mf.tensorboard_dir
            rec.add("tensorboard.tensorboard_dir", mf.tensorboard_dir,
                    f"msmon's TensorBoard scalars go to {mf.tensorboard_dir}/RUN_ID/device_N")


def _output_words(output: str) -> str:
    return "a log line at every sample" if output == "log" else "msmon's TensorBoard scalars"


def _nan_switch(cfg: MonitorConfig, mf: MindFormers, section: Mapping[str, Any], rec: _Record) -> None:
    """check_for_nan_in_loss_and_grad: MindFormers stops on a NaN/Inf; msmon's nonfinite rule pages on it."""
    if "check_for_nan_in_loss_and_grad" not in mf.given:
        return
    rule = cfg.alert.rules.get("nonfinite")
    on = mf.switches.check_for_nan_in_loss_and_grad
    if _given(section, "alert", "rules", "nonfinite", "enable") is not None:
        how = f"msmon's own alert.rules.nonfinite.enable {str(rule.enable).lower()} wins"
    else:
        rule.enable = True
        how = ("MindFormers stops on a NaN/Inf loss or grad norm; msmon's nonfinite rule pages on the same sample"
               if on else "off in MindFormers; msmon's nonfinite rule still pages on a NaN/Inf loss or grad norm")
    rec.add("check_for_nan_in_loss_and_grad", on, how)


def _pynative(cfg: MonitorConfig, mf: MindFormers, section: Mapping[str, Any], rec: _Record) -> None:
    """The PyNative trainer's `monitor:` section: it writes only to the log, and is active when any of
    train_state's switches is on; without a monitor_config, that is msmon's master switch too."""
    p = mf.pynative
    if p is None:
        return
    ts = p.train_state
    active = [k for k in ("local_norm", "local_loss", "device_norm", "device_loss") if getattr(ts, k)]
    if not section:
        cfg.monitor_on = bool(active)
        rec.add(f"{PYNATIVE}.train_state", ", ".join(active) or "nothing on",
                "no monitor_config: msmon monitors as MindFormers' PyNative monitor does, "
                + ("on (monitor_on: true)" if active else "off (turn on a train_state switch, or add "
                                                           "monitor_config with monitor_on: true)"))
    for key in ("local_loss", "device_loss"):
        if getattr(ts, key):
            rec.add(f"{PYNATIVE}.train_state.{key}", True, "msmon's step loss (metrics: loss) stands for it")
    for key in ("local_norm", "device_norm"):
        if getattr(ts, key):
            rec.add(f"{PYNATIVE}.train_state.{key}", list(getattr(ts, key)), "msmon does not compute per-parameter "
                    "norms; it watches the global grad norm instead", acted=False)
    if active and _given(section, "log_interval") is None:
        cfg.log_interval = cfg.step_interval
        rec.add(f"{PYNATIVE}.train_state", ", ".join(active), "MindFormers logs these at every step: msmon writes "
                "a log line at every sample")
    if p.moe_monitor.save_tokens_per_expert_interval:
        rec.add(f"{PYNATIVE}.moe_monitor.save_tokens_per_expert_interval",
                p.moe_monitor.save_tokens_per_expert_interval, f"MoE expert load: {_NOT_COMPUTED}", acted=False)
