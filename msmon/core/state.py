"""Detector memory as JSON-safe data, and back: the generic half of `Monitor.state_dict()`.

    attrs = dump_attrs(detector)        # {"window": {...}, "sigma": 0.12, ...}, json.dumps-able
    load_attrs(fresh_detector, attrs)   # the same memory in a detector built from the same config

Objects are walked generically (their `__dict__` and every `__slots__` up the class tree), so a detector
needs no method of its own to be saved. What is walked: None, bool, int, str, floats (NaN and Inf as tagged
strings: JSON has none), lists, tuples, dicts (any hashable key), sets, deques (with their maxlen), enums,
and objects of msmon's core classes (RollingQuantiles, SlidingFit, Trend, Finding, GateState...).
Configuration is not state and is left out: a rule's parameters (`RuleParams`), its `DetectorContext`,
bound methods. Loading builds objects only of classes in `msmon.core` (enums also from `msmon.contract`):
a state file never names arbitrary code to run. Anything else, or a state whose attributes do not match
the object's (saved by another msmon version), is a `StateError` saying where.
"""

from __future__ import annotations

import enum
import importlib
import math
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from msmon.core.detectors.base import DetectorContext, RuleParams

_OBJ_MODULES = ("msmon.core.",)  # classes whose objects a state may build
_ENUM_MODULES = ("msmon.core.", "msmon.contract.")
_FLOATS = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


class StateError(ValueError):
    """A saved state that cannot be loaded: damaged, from another version, or from another config."""


def _is_config(v: Any) -> bool:
    return isinstance(v, (RuleParams, DetectorContext)) or callable(v) and not isinstance(v, type)


def _names(obj: Any) -> Iterator[str]:
    """The attribute names an object holds: its __dict__'s and every __slots__ entry up its class tree."""
    seen: set[str] = set(getattr(obj, "TRANSIENT", ()))  # caches a class names as not state
    for name in getattr(obj, "__dict__", {}):
        if name not in seen:
            seen.add(name)
            yield name
    for cls in type(obj).__mro__:
        slots = cls.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name not in seen and name not in ("__dict__", "__weakref__") and hasattr(obj, name):
                seen.add(name)
                yield name


def _qualname(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def dump_attrs(obj: Any) -> dict[str, Any]:
    """An object's state attributes (configuration left out), each encoded JSON-safe."""
    out: dict[str, Any] = {}
    for name in _names(obj):
        v = getattr(obj, name)
        if not _is_config(v):
            out[name] = encode(v, name)
    return out


def load_attrs(obj: Any, attrs: Any, where: str = "state") -> None:
    """Set the attributes `dump_attrs` saved onto `obj` (built from the same config)."""
    if not isinstance(attrs, dict):
        raise StateError(f"{where}: expected an object's attributes, got {type(attrs).__name__}")
    want = {name for name in _names(obj) if not _is_config(getattr(obj, name))}
    if set(attrs) != want:
        extra, missing = sorted(set(attrs) - want), sorted(want - set(attrs))
        raise StateError(f"{where}: the saved attributes of {type(obj).__name__} do not match this msmon's "
                         f"(unknown: {', '.join(extra) or 'none'}; missing: {', '.join(missing) or 'none'}): "
                         "the state was saved by another msmon version")
    for name, v in attrs.items():
        object.__setattr__(obj, name, decode(v, f"{where}.{name}"))


def encode(v: Any, where: str = "state") -> Any:
    """`v` as JSON-safe data that `decode` turns back into an equal value."""
    if v is None or isinstance(v, (bool, int, str)) and not isinstance(v, enum.Enum):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else {"$float": "nan" if v != v else ("inf" if v > 0 else "-inf")}
    if isinstance(v, list):
        return [encode(x, where) for x in v]
    if isinstance(v, tuple):
        return {"$tuple": [encode(x, where) for x in v]}
    if isinstance(v, deque):
        return {"$deque": [encode(x, where) for x in v], "maxlen": v.maxlen}
    if isinstance(v, (set, frozenset)):
        return {"$set": sorted((encode(x, where) for x in v), key=repr)}
    if isinstance(v, dict):
        return {"$dict": [[encode(k, where), encode(x, where)] for k, x in v.items()]}
    if isinstance(v, enum.Enum):
        return {"$enum": _qualname(type(v)), "value": v.value}
    if type(v).__module__.startswith(_OBJ_MODULES):
        return {"$obj": _qualname(type(v)), "attrs": dump_attrs(v)}
    raise TypeError(f"{where}: cannot save a {type(v).__name__} in a monitor state")


def decode(v: Any, where: str = "state") -> Any:
    """The value `encode` made `v` from; a `StateError` naming `where` when `v` is not such data."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, list):
        return [decode(x, where) for x in v]
    if not isinstance(v, dict) or len(v) not in (1, 2):
        raise StateError(f"{where}: unexpected value {str(v)[:60]!r}")
    tag = next(iter(v))
    fn = _DECODERS.get(tag)
    if fn is None:
        raise StateError(f"{where}: unknown tag {str(tag)[:40]!r} (a damaged state?)")
    try:
        return fn(v, v[tag], where)
    except StateError:
        raise
    except (TypeError, ValueError, KeyError, AttributeError, ImportError) as e:
        raise StateError(f"{where}: damaged {tag} value ({type(e).__name__}: {e})") from None


def _items(body: Any, where: str) -> list[Any]:
    if not isinstance(body, list):
        raise StateError(f"{where}: expected a list, got {type(body).__name__}")
    return [decode(x, where) for x in body]


def _class(name: Any, modules: tuple[str, ...], where: str) -> type:
    if not isinstance(name, str) or ":" not in name or not name.startswith(modules):
        raise StateError(f"{where}: {str(name)[:60]!r} is not a class a monitor state may hold")
    module, qual = name.split(":", 1)
    obj: Any = importlib.import_module(module)
    for part in qual.split("."):
        obj = getattr(obj, part)
    if not isinstance(obj, type):
        raise StateError(f"{where}: {name} is not a class")
    return obj


def _obj(v: dict[str, Any], body: Any, where: str) -> Any:
    cls = _class(body, _OBJ_MODULES, where)
    if issubclass(cls, enum.Enum):
        raise StateError(f"{where}: {body} is an enum, saved as an object")
    attrs = v.get("attrs")
    if not isinstance(attrs, dict):
        raise StateError(f"{where}: expected an object's attributes, got {type(attrs).__name__}")
    slots = _class_slots(cls)
    if slots is not None and not set(attrs) <= slots:
        raise StateError(f"{where}: {cls.__name__} has no attribute(s) {', '.join(sorted(set(attrs) - slots))}: "
                         "the state was saved by another msmon version")
    obj = cls.__new__(cls)
    for name in getattr(cls, "TRANSIENT", ()):
        object.__setattr__(obj, name, None)
    for name, x in attrs.items():
        object.__setattr__(obj, name, decode(x, f"{where}.{name}"))
    return obj


def _class_slots(cls: type) -> set[str] | None:
    """Every slot up `cls`'s class tree; None when its objects have a __dict__ (any attribute goes)."""
    out: set[str] = set()
    for c in cls.__mro__[:-1]:  # object itself has neither
        if "__slots__" not in c.__dict__:
            return None
        slots = c.__dict__["__slots__"]
        out.update((slots,) if isinstance(slots, str) else slots)
    return out


def _enum(v: dict[str, Any], body: Any, where: str) -> Any:
    cls = _class(body, _ENUM_MODULES, where)
    if not issubclass(cls, enum.Enum):
        raise StateError(f"{where}: {body} is not an enum")
    return cls(v.get("value"))


_DECODERS: dict[str, Callable[[dict[str, Any], Any, str], Any]] = {
    "$float": lambda v, body, where: _FLOATS[body],
    "$tuple": lambda v, body, where: tuple(_items(body, where)),
    "$deque": lambda v, body, where: deque(_items(body, where), maxlen=v.get("maxlen")),
    "$set": lambda v, body, where: set(_items(body, where)),
    "$dict": lambda v, body, where: {_key(k, where): x for k, x in _pairs(body, where)},
    "$enum": _enum,
    "$obj": _obj,
}


def _pairs(body: Any, where: str) -> list[tuple[Any, Any]]:
    pairs = _items(body, where)
    if not all(isinstance(p, list) and len(p) == 2 for p in pairs):
        raise StateError(f"{where}: a dict is saved as [key, value] pairs")
    return [(p[0], p[1]) for p in pairs]


def _key(k: Any, where: str) -> Any:
    if isinstance(k, list):
        raise StateError(f"{where}: a list cannot be a dict key")
    return k
