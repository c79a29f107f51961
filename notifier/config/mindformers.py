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
- and mindformers_apply.py applies what msmon can act on to a built MonitorConfig and records how every key was
  taken (`apply`): the global-norm threshold and count become the grad_norm rule's ERROR level and run length,
  `*_format` choose the log line and TensorBoard, `step_interval` is the sampling interval; keys msmon cannot
  act on are recorded with what msmon does instead. Where an msmon key says otherwise, msmon's key wins and the
  record says so.

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

from .model import MonitorConfig

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
