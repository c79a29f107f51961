"""Build typed config dataclasses from parsed YAML, collecting every problem with its key path.

Declarative: a config section is a dataclass; each field's type says what is allowed and
`spec(...)` metadata adds ranges, choices, a custom parser or a cross-field check. Nothing
here knows about monitoring; `model.py` declares the schema.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from msmon.common.urls import url_problem as url_problem  # re-exported for the config models
from msmon.config.errors import Issue, closest, shown
from msmon.config.yamlio import location_of
from msmon.core.spec import spec as spec  # re-exported: the field specs live in the core

T = TypeVar("T")

_MISSING = object()


def setting(default: Any, doc: str, **bounds: Any) -> Any:
    """A config field with a default (copied per instance when mutable), a description and bounds."""
    if isinstance(default, (list, dict)) or dataclasses.is_dataclass(default):
        proto = default
        return dataclasses.field(default_factory=lambda: _copy(proto), metadata=spec(doc=doc, **bounds))
    return dataclasses.field(default=default, metadata=spec(doc=doc, **bounds))


def _copy(value: Any) -> Any:
    """A deep copy: a shallow one would share nested defaults (alert.rules' params) between configs, so a
    level changed live in one Monitor (loosen-threshold, a legacy threshold) would change every other."""
    return copy.deepcopy(value)


_BOUNDS = ("ge", "gt", "le")
# Ranges added to fields declared elsewhere (the detectors' parameters), by class and key; see add_bounds.
_EXTRA: dict[type, dict[str, dict[str, float]]] = {}


def add_bounds(cls: type, **keys: dict[str, float]) -> None:
    """Give the keys of `cls` (and of its subclasses) more bounds, e.g. add_bounds(P, window={"le": 1e5}):
    the schema's owner can bound fields it does not declare. A field's own bounds still apply."""
    table = _EXTRA.setdefault(cls, {})
    for key, bounds in keys.items():
        table.setdefault(key, {}).update(bounds)


def bounds_of(cls: type, key: str) -> dict[str, list[float]]:
    """Every bound on key `key` of `cls`: its field's own and those added for it or a base class."""
    out: dict[str, list[float]] = {b: [] for b in _BOUNDS}
    field = {f.name: f for f in dataclasses.fields(cls)}.get(key)
    sources: list[Mapping[str, Any]] = [field.metadata] if field is not None else []
    sources += [_EXTRA[c][key] for c in cls.__mro__ if key in _EXTRA.get(c, {})]
    for source in sources:
        for b in _BOUNDS:
            if source.get(b) is not None:
                out[b].append(source[b])
    return {b: v for b, v in out.items() if v}


class Context:
    """Collects issues while a config is built, so a user sees all of them at once."""

    def __init__(self) -> None:
        self.issues: list[Issue] = []

    def error(self, path: str, message: str, mapping: object = None, key: str | None = None) -> None:
        self.issues.append(Issue(path, message, location_of(mapping, key)))


def _describe(value: Any) -> str:
    return f"{shown(value)} ({type(value).__name__})"


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if tp is bool:
        return "true or false"
    if tp is int:
        return "an integer"
    if tp is float:
        return "a number"
    if tp is str:
        return "a string"
    if origin is typing.Literal:
        return "one of " + ", ".join(str(a) for a in typing.get_args(tp))
    if origin is list:
        return "a list"
    if origin is dict or dataclasses.is_dataclass(tp):
        return "a mapping"
    return str(tp)


class _Expected(ValueError):
    """A scalar of the right type that is still not acceptable; args[0] says what is expected."""


def _to_bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    raise TypeError


def _to_int(v: Any) -> int:
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    if isinstance(v, str) and len(v) < 40:  # `1e8`: PyYAML reads it as a string, as it does 1e-5
        v = float(v)
    if isinstance(v, float) and v.is_integer():
        return int(v)
    raise TypeError


def _to_float(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise TypeError
    out = float(v)  # a str too: PyYAML reads `1e-5` (no dot) as a string; the author meant the number
    if not math.isfinite(out):
        raise _Expected("a finite number")
    return out


def _to_str(v: Any) -> str:
    if isinstance(v, str):
        if "\0" in v:
            raise _Expected("a string without NUL characters")
        return v
    raise TypeError


_SCALARS: dict[Any, Callable[[Any], Any]] = {bool: _to_bool, int: _to_int, float: _to_float, str: _to_str}


def _convert(value: Any, tp: Any, path: str, ctx: Context, parent: object, key: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            return _convert(value, inner[0], path, ctx, parent, key)
    if value is None:
        ctx.error(path, f"expected {_type_name(tp)}, got nothing (null)", parent, key)
        return _MISSING
    scalar = _SCALARS.get(tp)
    if scalar is not None:
        try:
            return scalar(value)
        except (ValueError, TypeError) as exc:
            expected = exc.args[0] if isinstance(exc, _Expected) else _type_name(tp)
            ctx.error(path, f"expected {expected}, got {_describe(value)}", parent, key)
            return _MISSING
    if origin is typing.Literal:
        if value in args:
            return value
        hint = closest(shown(value).strip("'"), [str(a) for a in args])
        allowed = ", ".join(str(a) for a in args)
        msg = f"{shown(value)} is not allowed; use one of {allowed}"
        if hint:
            msg += f" (did you mean {hint}?)"
        ctx.error(path, msg, parent, key)
        return _MISSING
    if origin is list:
        if not isinstance(value, list):
            ctx.error(path, f"expected a list, got {_describe(value)}", parent, key)
            return _MISSING
        out_list = []
        for i, item in enumerate(value):
            conv = _convert(item, args[0], f"{path}[{i}]", ctx, value if isinstance(value, Mapping) else parent, key)
            if conv is not _MISSING:
                out_list.append(conv)
        return out_list
    if origin is dict:
        if not isinstance(value, Mapping):
            ctx.error(path, f"expected a mapping, got {_describe(value)}", parent, key)
            return _MISSING
        out_dict = {}
        for k, v in value.items():
            conv = _convert(v, args[1], f"{path}.{k}", ctx, value, str(k))
            if conv is not _MISSING:
                out_dict[str(k)] = conv
        return out_dict
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if not isinstance(value, Mapping):
            ctx.error(path, f"expected a mapping (a section with keys), got {_describe(value)}", parent, key)
            return _MISSING
        return build(tp, value, path, ctx)
    raise TypeError(f"unsupported config type {tp!r} at {path}")  # a schema bug, not a user error


def _check_bounds(value: Any, bounds: Mapping[str, list[float]], path: str, ctx: Context, parent: object,
                  key: str) -> bool:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return True
    for bound, words in (("ge", "at least"), ("gt", "greater than"), ("le", "at most")):
        for b in bounds.get(bound, ()):
            bad = value < b if bound == "ge" else value <= b if bound == "gt" else value > b
            if bad:
                ctx.error(path, f"must be {words} {_number(b)}, got {shown(value)}", parent, key)
                return False
    return True


def _number(b: float) -> str:
    """A bound as a message writes it: 1e+09 and 0.001 short, 268435456 in full (not 2.68435e+08)."""
    short = f"{b:g}"
    return short if float(short) == b or not float(b).is_integer() else str(int(b))


def fields_of(cls: type) -> dict[str, dataclasses.Field[Any]]:
    """The fields a user may set (internal ones, derived by the class itself, excluded)."""
    return {f.name: f for f in dataclasses.fields(cls) if f.init and not f.metadata.get("internal")}


def parse_fields(cls: type, data: Mapping[str, Any], path: str, ctx: Context) -> dict[str, Any]:
    """Validate the keys that `data` sets for dataclass `cls`; return them converted."""
    hints = typing.get_type_hints(cls)
    known = fields_of(cls)
    out: dict[str, Any] = {}
    for raw_key, value in data.items():
        key = str(raw_key)
        sub = f"{path}.{key}" if path else key
        if key not in known:
            hint = closest(key, known)
            msg = f"unknown key; did you mean {hint}?" if hint else (
                "unknown key; valid keys here are " + ", ".join(sorted(known)))
            ctx.error(sub, msg, data, key)
            continue
        meta = known[key].metadata
        parser: Callable[[Any, str, Context], Any] | None = meta.get("parser")
        conv = parser(value, sub, ctx) if parser else _convert(value, hints[key], sub, ctx, data, key)
        if conv is _MISSING:
            continue
        if _check_bounds(conv, bounds_of(cls, key), sub, ctx, data, key):
            out[key] = conv
    return out


def build(cls: type[T], data: Mapping[str, Any], path: str, ctx: Context) -> T:
    """An instance of `cls` from `data`; fields with problems keep their defaults (issues recorded)."""
    kwargs = parse_fields(cls, data, path, ctx)
    try:
        obj = cls(**kwargs)
    except TypeError as exc:  # a required field is missing
        missing = [f.name for f in fields_of(cls).values()
                   if f.name not in kwargs and f.default is dataclasses.MISSING
                   and f.default_factory is dataclasses.MISSING]
        for name in missing:
            ctx.error(f"{path}.{name}" if path else name, "required key is missing", data)
        if not missing:
            raise exc
        return _placeholder(cls, kwargs)
    check = getattr(obj, "check", None)
    if callable(check):
        for sub, message in check():
            ctx.error(f"{path}.{sub}" if sub else path, message, data, sub or None)
    return obj


def _placeholder(cls: type[T], kwargs: dict[str, Any]) -> T:
    """An instance with required fields filled by dummies; only used when a ConfigError follows."""
    hints = typing.get_type_hints(cls)
    full = dict(kwargs)
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name not in full and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            tp = hints[f.name]
            full[f.name] = typing.get_args(tp)[0] if typing.get_origin(tp) is typing.Literal else tp()
    return cls(**full)
