"""The Monitor's state_dict: what its rules have learned, saved as JSON-safe data and checked as it is loaded back.

`save` writes it: every rule's detector memory and alert state per device, the recent samples charts show,
the levels (live threshold changes included). `load` reads it into fresh devices and returns what it
read without changing the Monitor, or raises a `StateError` saying why it cannot be used: damaged, from
another msmon version or from another config. The format is versioned (`STATE_FORMAT`, `STATE_VERSION`):
a state written by an older msmon of the same version loads unchanged.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from msmon.contract.wire import Sample
from msmon.core.state import StateError, decode, dump_attrs, encode, load_attrs

from .device import Device, rule_off
from .rules import Rules

STATE_FORMAT = "msmon.monitor.state"
STATE_VERSION = 1
_TIMING = ("prev_t", "prev_step", "max_dt", "last_t", "last_step", "tokens", "samples", "acc_loss", "acc_n",
           "skipped")


@dataclasses.dataclass
class Loaded:
    """A state read back and checked, not yet applied."""

    devices: dict[str, Device]
    levels: list[list[list[float | None]]]  # [phase][rule] = [warning, error]
    peers: Any
    seen: set[str]
    ignored: set[str]
    samples: int


def save(run_id: str, rules: Rules, devices: Mapping[str, Device], samples: int, seen: set[str],
         ignored: set[str], peers: dict[str, float]) -> dict[str, Any]:
    """The state, JSON-safe (`json.dumps` takes it as is)."""
    saved = {}
    for name, d in devices.items():
        saved[name] = {
            "timing": encode([getattr(d, k) for k in _TIMING]),
            "recent": [encode(msgspec.to_builtins(s)) for s in d.recent],
            "rules": {r.name: {"detector": dump_attrs(r.detector), "gate": dump_attrs(r.gate),
                               "off": r.update is rule_off} for r in d.rules},
        }
    return {
        "format": STATE_FORMAT, "version": STATE_VERSION, "run_id": run_id, "rules": list(rules.active),
        "phases": [ph.name for ph in rules.levels.phases],
        "levels": [[[p.warning, p.error] for p in ph.ordered] for ph in rules.levels.phases],
        "params": _shape(rules), "samples": samples, "seen": sorted(seen),
        "ignored": sorted(ignored), "peers": encode(peers), "devices": saved,
    }


def load(state: Mapping[str, Any], rules: Rules, build: Callable[[str], Device], continue_clock: bool) -> Loaded:
    """`state` read into fresh devices (`build` makes one), checked against `rules`; a `StateError` if it cannot be
    used. `continue_clock=False`: the time since it was saved is no step (step times start afresh)."""
    _check_header(state, rules.active, [ph.name for ph in rules.levels.phases])
    shape, saved = _shape(rules), state.get("params")
    if saved != shape:
        differ = [r for r in rules.active if not isinstance(saved, dict) or saved.get(r) != shape[r]]
        raise StateError(f"msmon: the state was saved with other settings for {', '.join(differ) or 'the rules'} "
                         "(window sizes and the like shape what a rule has learned): resume with the same "
                         "monitor_config, or start without the state")
    try:
        devices = {name: _load_device(build(name), saved, continue_clock)
                   for name, saved in dict(state["devices"]).items()}
        levels = [[[_level_value(v) for v in pair] for pair in row] for row in state["levels"]]
        peers = decode(state["peers"], "state.peers")
        seen, ignored, n = set(state["seen"]), set(state["ignored"]), int(state["samples"])
    except StateError:
        raise
    except (KeyError, TypeError, ValueError, msgspec.ValidationError) as e:
        raise StateError(f"msmon: damaged monitor state ({type(e).__name__}: {e})") from None
    if len(levels) != len(rules.levels.phases) or any(len(r) != len(rules.active) for r in levels):
        raise StateError("msmon: the saved levels do not match this config's phases and rules")
    return Loaded(devices, levels, peers, seen, ignored, n)


def apply_levels(rules: Rules, levels: list[list[list[float | None]]]) -> None:
    """Put the loaded levels (`Loaded.levels`) in force in every phase."""
    for ph, row in zip(rules.levels.phases, levels, strict=True):
        for p, (warning, error) in zip(ph.ordered, row, strict=True):
            p.warning, p.error = warning, error


def _shape(rules: Rules) -> dict[str, Any]:
    """Each active rule's settings but its levels (those are state: they change live), JSON-safe."""
    out = {}
    for name in rules.active:
        p = rules.config.alert.rules.get(name)
        out[name] = {f.name: encode(getattr(p, f.name)) for f in dataclasses.fields(p)
                     if f.name not in ("warning", "error", "levels")}
    return out


def _load_device(d: Device, saved: Mapping[str, Any], continue_clock: bool) -> Device:
    """`d` (fresh, not registered) with what was saved of its device."""
    where = f"state.devices[{d.name}]"
    timing = decode(saved["timing"], f"{where}.timing")
    if not isinstance(timing, list) or len(timing) != len(_TIMING):
        raise StateError(f"msmon: {where}.timing: expected {len(_TIMING)} values")
    for k, v in zip(_TIMING, timing, strict=True):
        setattr(d, k, v)
    if not continue_clock:
        d.prev_t = d.last_t = None
        d.max_dt = 0.0
    d.recent.extend(msgspec.convert(decode(s, f"{where}.recent"), Sample) for s in saved["recent"])
    rules = dict(saved["rules"])
    if set(rules) != {r.name for r in d.rules}:
        raise StateError(f"msmon: {where}: saved rules {sorted(rules)} are not this config's active rules")
    for r in d.rules:
        kept = rules[r.name]
        load_attrs(r.detector, kept["detector"], f"{where}.{r.name}")
        load_attrs(r.gate, kept["gate"], f"{where}.{r.name}.gate")
        if kept["off"]:
            r.update = rule_off
    return d


def _check_header(state: Any, rules: list[str], phases: list[str]) -> None:
    """A `StateError` unless `state` is a monitor state of this version for these rules and phases."""
    if not isinstance(state, Mapping) or state.get("format") != STATE_FORMAT:
        raise StateError(f"msmon: not a monitor state (no format {STATE_FORMAT!r}): was it written by "
                         "Monitor.state_dict()?")
    if state.get("version") != STATE_VERSION:
        raise StateError(f"msmon: monitor state version {state.get('version')!r}, this msmon reads version "
                         f"{STATE_VERSION}: start without the state (the rules learn afresh)")
    if state.get("rules") != rules or state.get("phases") != phases:
        raise StateError(f"msmon: the state was saved with rules {state.get('rules')} and phases "
                         f"{state.get('phases')}, this config has {rules} and {phases}: resume with the same "
                         "monitor_config, or start without the state")


def _level_value(v: Any) -> float | None:
    if v is None or isinstance(v, (int, float)) and not isinstance(v, bool):
        return v
    raise StateError(f"msmon: a saved level is {v!r}, not a number or null")
