"""YAML loading with `!include` and line numbers kept for error messages."""

from __future__ import annotations

import os
from typing import Any

import yaml

from .errors import ConfigError, Issue


class LineDict(dict):  # type: ignore[type-arg]
    """A YAML mapping that remembers the file and line of each of its keys."""

    lines: dict[str, str]
    where: str | None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lines = {}
        self.where = None


def location_of(mapping: object, key: str | None = None) -> str | None:
    if not isinstance(mapping, LineDict):
        return None
    if key is not None and key in mapping.lines:
        return mapping.lines[key]
    return mapping.where


def _make_loader(path: str, stack: tuple[str, ...]) -> type[yaml.SafeLoader]:
    base = os.path.dirname(os.path.abspath(path))
    name = os.path.basename(path)

    class Loader(yaml.SafeLoader):
        pass

    def construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> LineDict:
        loader.flatten_mapping(node)
        out = LineDict()
        out.where = f"{name}:{node.start_mark.line + 1}"
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            if not isinstance(key, str):
                key = str(key)
            out[key] = loader.construct_object(value_node, deep=True)
            out.lines[key] = f"{name}:{key_node.start_mark.line + 1}"
        return out

    def construct_include(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
        if not isinstance(node, yaml.ScalarNode):
            raise ConfigError([Issue("!include", "expects a file name, as in `!include monitor.yaml`",
                                     f"{name}:{node.start_mark.line + 1}")], path)
        target = os.path.join(base, str(loader.construct_scalar(node)))
        if not os.path.exists(target):
            raise ConfigError([Issue("!include", f"file not found: {target}",
                                     f"{name}:{node.start_mark.line + 1}")], path)
        return load_yaml(target, stack)

    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
    Loader.add_constructor("!include", construct_include)
    return Loader


def load_yaml(path: str, _stack: tuple[str, ...] = ()) -> Any:
    """Parse a YAML file; `!include other.yaml` pulls in a file relative to the including one."""
    real = os.path.realpath(path)
    if real in _stack:
        chain = " -> ".join(os.path.basename(p) for p in (*_stack, real))
        raise ConfigError([Issue("!include", f"include cycle: {chain}")], path)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise ConfigError([Issue("file", f"cannot read {path}: {exc.strerror}")], path) from None
    try:
        return yaml.load(text, Loader=_make_loader(path, (*_stack, real)))  # noqa: S506 (SafeLoader subclass)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{os.path.basename(path)}:{mark.line + 1}" if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError([Issue("yaml", f"not valid YAML: {problem}", where)], path) from None
