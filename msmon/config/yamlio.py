"""YAML loading with `!include` and line numbers kept for error messages, bounded against hostile files.

Every file is read as strict UTF-8 (a BOM allowed), at most MAX_BYTES; while it is composed, the nodes are
counted as they come (an alias counted as often as it is used, at its expanded size) and their nesting
measured, so an alias bomb, a deep nest or an include fan-out is refused at its line in milliseconds instead
of hanging the section search or raising RecursionError. Whatever goes wrong comes out as a ConfigError
with key and line.
"""

from __future__ import annotations

import codecs
import os
import stat
from collections.abc import Mapping
from typing import Any, cast

import yaml
from yaml.events import AliasEvent, MappingStartEvent, SequenceStartEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from msmon.config.errors import ConfigError, Issue

MAX_BYTES = 1 << 20  # a training YAML is a few KB
MAX_NODES = 50_000  # expanded (every alias and include counted where it is used); a config has hundreds
MAX_DEPTH = 64  # nested mappings / lists
MAX_FILES = 64  # files one config may pull in with !include, counting repeats
_MAX_INT_DIGITS = 4300  # Python's own limit on int(str): past it, int() raises (and is slow)


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


def _join(path: list[str]) -> str:
    text = "".join(p if p.startswith("[") or i == 0 else f".{p}" for i, p in enumerate(path)) or "yaml"
    return text if len(text) <= 100 else f"{text[:60]}...{text[-37:]}"  # 64 levels of [0] say nothing more


def _too_deep() -> str:
    return f"nested more than {MAX_DEPTH} levels deep; a config is a few levels deep (is this generated data?)"


# --- reading the bytes ------------------------------------------------------------------------------------

b_newline = b"\n"
_BOMS = ((codecs.BOM_UTF32_LE, "UTF-32"), (codecs.BOM_UTF32_BE, "UTF-32"),
         (codecs.BOM_UTF16_LE, "UTF-16"), (codecs.BOM_UTF16_BE, "UTF-16"))


def decode(raw: bytes, path: str) -> str:
    """`raw` as text, strictly UTF-8 (a UTF-8 BOM is dropped), or a ConfigError saying where it is not."""
    name = os.path.basename(path)

    def fail(message: str, at: int | None = None) -> ConfigError:
        where = f"{name}:{raw.count(b_newline, 0, at) + 1}" if at is not None else None
        return ConfigError([Issue("file", f"not UTF-8 text ({message}); save it as UTF-8", where)], path)

    for bom, encoding in _BOMS:
        if raw.startswith(bom):
            raise fail(f"found a {encoding} BOM")
    skip = len(codecs.BOM_UTF8) if raw.startswith(codecs.BOM_UTF8) else 0
    nul = raw.find(b"\0", skip)
    if nul >= 0:
        raise fail(f"binary: a NUL byte at byte {nul}", nul)
    try:
        return raw[skip:].decode("utf-8")
    except UnicodeDecodeError as exc:
        at = skip + exc.start
        raise fail(f"byte 0x{raw[at]:02x} at byte {at} is not valid UTF-8; a latin-1 or cp1252 file?", at) from None


def read_text(path: str) -> str:
    """The file's text: a regular file of at most MAX_BYTES, strictly UTF-8; else a ConfigError."""
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):  # a FIFO would block open(), a device never end
            raise ConfigError([Issue("file", f"{path} is not a regular file")], path)
        if info.st_size > MAX_BYTES:
            raise ConfigError([Issue("file", f"{path} is larger than {MAX_BYTES >> 20} MiB ({info.st_size} bytes); "
                                     "a config is a few KB: is this the right file?")], path)
        with open(path, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except OSError as exc:
        raise ConfigError([Issue("file", f"cannot read {path}: {exc.strerror}")], path) from None
    if len(raw) > MAX_BYTES:  # grew since the stat
        raise ConfigError([Issue("file", f"{path} is larger than {MAX_BYTES >> 20} MiB")], path)
    return decode(raw, path)


# --- composing and constructing, measured -----------------------------------------------------------------


class _Budget:
    """What one top-level load may spend across its includes."""

    def __init__(self) -> None:
        self.files = 0
        self.nodes = 0  # composed so far, aliases at their expanded size
        self.aliases = 0


class _Loader(yaml.SafeLoader):
    """A SafeLoader that measures every node as it is composed, and keeps key paths for its messages."""

    def __init__(self, text: str, path: str, stack: tuple[str, ...], budget: _Budget, depth: int) -> None:
        super().__init__(text)
        self.path = path
        self.name = os.path.basename(path)
        self.stack = stack
        self.budget = budget
        self.depth = depth
        self.keys: list[str] = []  # the key path being composed or constructed
        self.sizes: dict[int, tuple[int, int]] = {}  # id(node) -> (expanded nodes, height)
        self.included: dict[int, Any] = {}

    def fail(self, message: str, mark: Any, path: str | None = None) -> ConfigError:
        where = f"{self.name}:{mark.line + 1}" if mark is not None else None
        return ConfigError([Issue(path or _join(self.keys), message, where)], self.path)

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        pushed = parent is not None and index is not None
        if pushed:
            self.keys.append(f"[{index}]" if isinstance(index, int) else str(getattr(index, "value", "?"))[:80])
        try:
            return self._compose_measured(parent, index)
        finally:
            if pushed:
                self.keys.pop()

    def _compose_measured(self, parent: Node | None, index: Any) -> Node:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, AliasEvent):
            node = cast(Node, super().compose_node(parent, index))
            size = self.sizes.get(id(node))
            if size is None:
                raise self.fail(f"alias *{event.anchor} refers to the node that contains it (a recursive "
                                "structure, which no setting takes)", event.start_mark)
            if self.depth + size[1] > MAX_DEPTH:
                raise self.fail(_too_deep(), event.start_mark)
            self.budget.aliases += 1
            self._count(size[0], event.start_mark)
            return node
        self._count(1, event.start_mark)
        collection = isinstance(event, (SequenceStartEvent, MappingStartEvent))
        if collection:
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise self.fail(_too_deep(), event.start_mark)
        try:
            node = cast(Node, super().compose_node(parent, index))
        finally:
            if collection:
                self.depth -= 1
        if isinstance(node, ScalarNode) and node.tag == "!include":
            data, size = self._include(node)
            self.included[id(node)] = data  # its nodes were counted as its file was composed
        else:
            size = self._measure(node)
        self.sizes[id(node)] = size
        return node

    def _count(self, nodes: int, mark: Any) -> None:
        self.budget.nodes += nodes
        if self.budget.nodes > MAX_NODES:
            bomb = self.budget.aliases > 0
            what = "its aliases expand to more than" if bomb else "it has more than"
            raise self.fail(f"{what} {MAX_NODES} YAML nodes{' (an alias bomb?)' if bomb else ''}; a config has "
                            "hundreds", mark)

    def _measure(self, node: Node) -> tuple[int, int]:
        if isinstance(node, SequenceNode):
            children = [self.sizes[id(c)] for c in node.value]
        elif isinstance(node, MappingNode):
            children = [self.sizes[id(c)] for pair in node.value for c in pair]
        else:
            return 1, 0
        return 1 + sum(c[0] for c in children), 1 + max((c[1] for c in children), default=0)

    def _include(self, node: ScalarNode) -> tuple[Any, tuple[int, int]]:
        target = os.path.join(os.path.dirname(os.path.abspath(self.path)), str(node.value))
        if not os.path.exists(target):
            raise self.fail(f"file not found: {target}", node.start_mark, "!include")
        return _load(target, self.stack, self.budget, self.depth)

    # construction

    def construct_object(self, node: Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except ConfigError:
            raise
        except Exception as exc:  # noqa: BLE001 (a date like 2024-13-45, `!!float ''`: PyYAML's constructors
            # raise ValueError, IndexError, ... on values they cannot read; each is this value's problem)
            problem = getattr(exc, "problem", None) or str(exc)
            raise self.fail(f"cannot read this value: {str(problem)[:200]}",
                            getattr(exc, "problem_mark", None) or node.start_mark) from None


def _no_duplicate_keys(loader: _Loader, node: MappingNode) -> None:
    """A key given twice in one mapping is refused at its second line: YAML would keep the last silently
    (a `port:` near the top overridden by one further down). Keys merged in with `<<:` may be overridden."""
    seen: dict[str, int] = {}
    for key_node, _ in node.value:
        if not isinstance(key_node, ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = str(key_node.value)
        line = key_node.start_mark.line + 1
        if key in seen:
            raise loader.fail(f"{key[:80]!r} is given twice in this mapping (first at line {seen[key]}); YAML "
                              "would keep only the last: remove one", key_node.start_mark,
                              _join([*loader.keys, key[:80]]))
        seen[key] = line


def _construct_mapping(loader: _Loader, node: MappingNode) -> LineDict:
    _no_duplicate_keys(loader, node)
    loader.flatten_mapping(node)
    out = LineDict()
    out.where = f"{loader.name}:{node.start_mark.line + 1}"
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, str):
            key = str(key)
        loader.keys.append(key[:80])
        out[key] = loader.construct_object(value_node, deep=True)
        loader.keys.pop()
        out.lines[key] = f"{loader.name}:{key_node.start_mark.line + 1}"
    return out


def _construct_int(loader: _Loader, node: ScalarNode) -> int:
    digits = sum(ch.isdigit() for ch in str(node.value))
    if digits > _MAX_INT_DIGITS:
        raise loader.fail(f"an integer of {digits} digits; no setting takes a number that large", node.start_mark)
    return int(loader.construct_yaml_int(node))


def _construct_include(loader: _Loader, node: Node) -> Any:
    if id(node) not in loader.included:  # composed as a mapping or a list
        raise loader.fail("expects a file name, as in `!include monitor.yaml`", node.start_mark, "!include")
    return loader.included[id(node)]


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_Loader.add_constructor("tag:yaml.org,2002:int", _construct_int)
_Loader.add_constructor("!include", _construct_include)


def _load(path: str, stack: tuple[str, ...], budget: _Budget, depth: int) -> tuple[Any, tuple[int, int]]:
    real = os.path.realpath(path)
    if real in stack:
        chain = " -> ".join(os.path.basename(p) for p in (*stack, real))
        raise ConfigError([Issue("!include", f"include cycle: {chain}")], path)
    budget.files += 1
    if budget.files > MAX_FILES:
        raise ConfigError([Issue("!include", f"more than {MAX_FILES} files loaded, counting repeats; check for "
                                 "included files that include others many times")], path)
    text = read_text(path)
    try:
        loader = _Loader(text, path, (*stack, real), budget, depth)
    except yaml.reader.ReaderError as exc:  # a control character: the reader checks the whole text at once
        line = text.count("\n", 0, exc.position) + 1
        raise ConfigError([Issue("yaml", f"not valid YAML: character #x{exc.character:04x} is not allowed in YAML "
                                 "text", f"{os.path.basename(path)}:{line}")], path) from None
    try:
        node = loader.get_single_node()
        if node is None:
            return None, (0, 0)
        return loader.construct_document(node), loader.sizes[id(node)]
    except ConfigError:
        raise
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{loader.name}:{mark.line + 1}" if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError([Issue("yaml", f"not valid YAML: {str(problem)[:200]}", where)], path) from None
    finally:
        loader.dispose()


def load_yaml(path: str, _stack: tuple[str, ...] = ()) -> Any:
    """Parse a YAML file; `!include other.yaml` pulls in a file relative to the including one."""
    return _load(path, _stack, _Budget(), 0)[0]


def check_shape(data: Any, source: str | None = None, what: str = "monitor config") -> None:
    """A ConfigError when data given in code (not read from a file) nests deeper than MAX_DEPTH, refers to
    itself, or holds more than MAX_NODES values: the bounds a file gets while it is read."""
    count = 0

    def walk(value: Any, path: str, depth: int, parents: tuple[int, ...]) -> None:
        nonlocal count
        count += 1
        if count > MAX_NODES:
            raise ConfigError([Issue(path or "config", f"more than {MAX_NODES} values; a config has hundreds")],
                              source, what)
        if isinstance(value, Mapping):
            items: Any = ((f"{path}.{k}" if path else str(k), v) for k, v in value.items())
        elif isinstance(value, (list, tuple)):
            items = ((f"{path}[{i}]", v) for i, v in enumerate(value))
        else:
            return
        if id(value) in parents:
            raise ConfigError([Issue(path or "config", "refers to itself (a cycle)")], source, what)
        if depth >= MAX_DEPTH:
            raise ConfigError([Issue(path or "config", _too_deep())], source, what)
        for sub, v in items:
            walk(v, sub, depth + 1, (*parents, id(value)))

    walk(data, "", 0, ())
