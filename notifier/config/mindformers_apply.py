"""What msmon does with each of MindFormers' monitor keys (`apply`): the global-norm threshold and count become the
grad_norm rule's ERROR level and run length, `*_format` choose the log line and TensorBoard, the health and NaN
switches their rules; every key recorded with how it was taken (`Taken`), msmon's own key winning where it says
otherwise. The keys are read and checked by mindformers.py. No I/O."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from msmon.config.yamlio import location_of

from .mindformers import _SWITCH_KEYS, CALLBACK, DEPRECATED, PYNATIVE, SECTION, MindFormers
from .model import MonitorConfig, Taken

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
