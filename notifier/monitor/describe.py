"""What a config will monitor, in plain words: logged when a Monitor starts and printed by `msmon check-config`."""

from __future__ import annotations

from msmon.core.detectors import RULES

from ..config import MonitorConfig


def describe(cfg: MonitorConfig, run_id: str) -> list[str]:
    """What will be monitored, in plain words: logged at start-up and printed by `msmon check-config`."""
    lines = [f"monitoring run {run_id}: every {cfg.step_interval} step(s), log line every "
             f"{cfg.log_interval or 'never'}, metrics {', '.join(cfg.metrics)}"
             + ("; per device" if cfg.per_device_metrics else "")]
    lines += [f"  MindFormers {taken}" for taken in cfg.mindformers]  # how each MindFormers key was taken
    if not cfg.alert.enable:
        lines.append("alerting is off (monitor_config.alert.enable is false): metrics are logged, nothing alerts")
        return lines
    a = cfg.alert
    lines.append(f"alerts after a {a.baseline_steps}-step baseline; repeats of a rule at most every "
                 f"{a.alert_interval} steps; resolved after {a.resolve_after} clear samples")
    metrics: set[str] = set(cfg.metrics)
    for name, (_, det_cls) in RULES.items():
        p = a.rules.get(name)
        missing = det_cls.requires - metrics
        if not p.enable:
            lines.append(f"  {name}: off (alert.rules.{name}.enable is false)")
        elif missing:
            lines.append(f"  {name}: off (needs {', '.join(sorted(missing))} in metrics)")
        elif name == "loss_forecast" and (cfg.training.target_loss is None or cfg.training.total_steps is None):
            lines.append(f"  {name}: idle (needs training.target_loss and training.total_steps)")
        elif name in ("nonfinite", "lr_schedule"):
            lines.append(f"  {name}: on")
        else:
            w, e = p.warning_level(), p.error_level()
            if w is None and e is None:
                lines.append(f"  {name}: off (no WARNING or ERROR level set)")
                continue
            levels = ", ".join(f"{lvl} at {v:g}" for lvl, v in (("WARNING", w), ("ERROR", e)) if v is not None)
            lines.append(f"  {name}: {levels}, {p.consecutive} sample(s) in a row")
    for ph in a.phases:
        end = "end" if ph.end_step is None else ph.end_step
        changes = "; ".join(f"{r} {o}" for r, o in ph.rules.items()) or "no changes"
        lines.append(f"  phase {ph.name} (steps {ph.start_step}-{end}): {changes}")
    for act in cfg.actions:
        lines.append(f"  action: {act.action} when {act.rule} reaches {act.severity}")
    return lines
