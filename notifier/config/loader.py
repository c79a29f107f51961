"""Find the monitor_config section in a training YAML (or a standalone file) and build it."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any, cast

from msmon.config.errors import ConfigError, Issue, shown
from msmon.config.validate import Context, build, fields_of
from msmon.config.yamlio import LineDict, check_shape, load_yaml, location_of

from . import mindformers, mindformers_apply
from .model import MonitorConfig

SECTION = "monitor_config"
# Keys that only make sense inside monitor_config: at the top level of a training YAML they mean
# an indentation slip, and their setting would silently do nothing.
_MONITOR_ONLY = ("monitor_on", "step_interval", "log_interval", "per_device_metrics", "alert")


def _find_nested(data: Any, path: str = "") -> list[tuple[str, Any]]:
    found = []
    if isinstance(data, Mapping):
        for k, v in data.items():
            sub = f"{path}.{k}" if path else str(k)
            if k == SECTION and path:
                found.append((sub, data))
            found.extend(_find_nested(v, sub))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            found.extend(_find_nested(v, f"{path}[{i}]"))
    return found


def _locate(data: Any, source: str | None) -> Mapping[str, Any]:
    """The monitor_config mapping inside a parsed file, or a ConfigError saying where it went."""
    where = source or "the config"
    if data is None:
        raise ConfigError([Issue(SECTION, f"{where} is empty; expected a {SECTION} section")], source)
    if not isinstance(data, Mapping):
        raise ConfigError([Issue(SECTION, f"{where} must be a YAML mapping, got {type(data).__name__}")], source)
    inner = data.get(SECTION)
    if isinstance(inner, Mapping) and list(inner) == [SECTION]:
        # `monitor_config: !include monitor.yaml` where monitor.yaml has its own top-level
        # monitor_config (a standalone file): take the inner section.
        unwrapped: dict[str, Any] = {**data, SECTION: inner[SECTION]}
        data = unwrapped
    nested = _find_nested(data)
    issues = [Issue(path, f"found here, but {SECTION} must be a top-level key (check its indentation); "
                    "as it is, none of its settings would take effect", location_of(parent, SECTION))
              for path, parent in nested]
    if SECTION in data:
        stray = [k for k in _MONITOR_ONLY if k in data]
        issues += [Issue(k, f"is at the top level of the file; it belongs under {SECTION} "
                         "(check its indentation)", location_of(data, k)) for k in stray]
        if issues:
            raise ConfigError(issues, source)
        section = data[SECTION]
        if section is None:
            return LineDict()
        if not isinstance(section, Mapping):
            raise ConfigError([Issue(SECTION, f"expected a mapping of settings, got {shown(section)}",
                                     location_of(data, SECTION))], source)
        return section
    if issues:
        raise ConfigError(issues, source)
    if isinstance(data.get(mindformers.PYNATIVE), Mapping):
        return LineDict()  # the PyNative trainer's `monitor:` section alone: mindformers.read takes it
    known = {*fields_of(MonitorConfig), *mindformers.MINDFORMERS_KEYS}
    if data and all(k in known for k in data):
        return cast("Mapping[str, Any]", data)  # a standalone file holding the section's keys directly
    keys = ", ".join(sorted(map(str, data))) or "none"
    raise ConfigError([Issue(SECTION, f"no {SECTION} section found in {where} (top-level keys: {keys}); "
                             f"add one, or pass a standalone monitor config")], source)


def _with_file(index: int, entry: Mapping[str, Any], source: str | None) -> Mapping[str, Any]:
    """An MsmonCallback entry with `config: FILE` (a standalone msmon file, relative to the current directory, as the
    job resolves it): the file's keys, overridden by the entry's own."""
    path = entry.get("config")
    if path is None:
        return entry
    if not isinstance(path, str) or not path:
        raise ConfigError([Issue(f"callbacks[{index}].config", f"expected the path of an msmon monitor config file, "
                                 f"got {shown(path)}", location_of(entry, "config"))], source)
    file = load_yaml(path)
    if isinstance(file, Mapping) and mindformers.callback_entry(file) is not None:
        raise ConfigError([Issue(f"callbacks[{index}].config", f"{path} is a training YAML with its own MsmonCallback "
                                 "entry; name a standalone msmon monitor config", location_of(entry, "config"))],
                          source)
    merged = LineDict({**_locate(file, path), **entry})
    if isinstance(entry, LineDict):
        merged.lines, merged.where = dict(entry.lines), entry.where
    return merged


def _apply_legacy_thresholds(cfg: MonitorConfig, section: Mapping[str, Any], ctx: Context) -> None:
    """`alert.loss_spike_threshold` / `alert.grad_norm_threshold` are the levels users already set."""
    alert = section.get("alert") if isinstance(section, Mapping) else None
    rules = alert.get("rules") if isinstance(alert, Mapping) else None
    for legacy, rule, level in (("loss_spike_threshold", "loss_spike", "warning"),
                                ("grad_norm_threshold", "grad_norm", "error")):
        value = getattr(cfg.alert, legacy)
        if value is None:
            continue
        given = rules.get(rule) if isinstance(rules, Mapping) else None
        if isinstance(given, Mapping) and level in given:
            ctx.error(f"{SECTION}.alert.{legacy}", f"sets the same level as {SECTION}.alert.rules.{rule}.{level}; "
                      "keep one of them", alert, legacy)
            continue
        setattr(cfg.alert.rules.get(rule), level, value)


def load_config(source: str | os.PathLike[str] | Mapping[str, Any] | MonitorConfig) -> MonitorConfig:
    """A validated MonitorConfig from a YAML path, a parsed mapping, or a MonitorConfig (returned as is).

    Raises ConfigError listing every problem, each with its key path and, for files, its line.
    """
    if isinstance(source, MonitorConfig):
        return source
    if isinstance(source, Mapping):
        name = None
        check_shape(source)
        data: Any = source
    else:
        name = os.fspath(source)
        data = load_yaml(name)
    entry = mindformers.callback_entry(data)
    ctx = Context()
    theirs_section: Mapping[str, Any] | None = None
    section: Mapping[str, Any]
    if entry is not None:
        # a MindFormers training YAML with msmon in its callbacks list: msmon's keys are that entry's
        top = data
        theirs_section = _locate(data, name) if SECTION in data else None
        section, theirs, prefix = mindformers.split_entry(_with_file(*entry, name), entry[0], theirs_section, ctx)
    else:
        section = _locate(data, name)
        top = None if section is data else data  # a standalone section has no top level of its own
        ours, theirs = mindformers.split(section, ctx, refuse_msmon=mindformers.checked_by_mindformers(top))
        prefix = SECTION
    mf = mindformers.read(top, theirs, ctx)
    cfg = build(MonitorConfig, ours if entry is None else section, prefix, ctx)
    cfg.given = frozenset(map(str, section)) | frozenset(map(str, theirs))
    if not ctx.issues:
        _apply_legacy_thresholds(cfg, section, ctx)
    if not ctx.issues:
        cfg.mindformers = mindformers_apply.apply(cfg, mf, section, top, theirs_section,
                                            entry[1] if entry is not None else None)
    if not ctx.issues:
        for i, phase in enumerate(cfg.alert.phases):
            for rule, override in phase.rules.items():
                merged = dataclasses.replace(cfg.alert.rules.get(rule), **override)
                for sub, msg in merged.check():
                    ctx.error(f"{SECTION}.alert.phases[{i}].rules.{rule}.{sub}", msg)
    if ctx.issues:
        raise ConfigError(ctx.issues, name)
    return cfg
