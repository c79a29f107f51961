"""Write the configuration reference from the config schema itself: docs/reference/monitor-config.md (the job's
`monitor_config`, notifier/config/model.py) and docs/reference/bot-yaml.md (the bot's `bot:`, bot/config.py).

Every key, with its type, default, bounds and meaning, is read from the dataclasses the validator builds configs
with (their `setting(default, doc, ge=, gt=, le=)` fields and the bounds added with `add_bounds`), so the
reference says what the code accepts. tests/project/test_config_reference.py fails when the committed pages and
the code differ; after changing a setting, run:

    .venv/bin/python tools/config_reference.py          # rewrite the two pages
    .venv/bin/python tools/config_reference.py --check  # exit 1 if they are out of date
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import typing
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from msmon.config.validate import bounds_of  # noqa: E402

PAGES = {"monitor-config.md": ("monitor_config", "notifier.config.model", "MonitorConfig"),
         "bot-yaml.md": ("bot", "bot.config", "BotConfig")}
INTRO = {
    "monitor_config": (
        "The `monitor_config` section of a training job's YAML (or the mapping given to `Monitor` / "
        "`MonitorCallback`): what is sampled, the alert rules and their levels, the outputs, the automatic actions "
        "and how the job reaches the bot. `msmon check-config FILE` validates a file against exactly this schema "
        "and prints what will be monitored; `config/monitor.yaml` is a commented example. How to choose the levels: "
        "[the user guide](../user-guide/monitor-config.md)."),
    "bot": (
        "The `bot:` section of the bot's YAML (`msmon serve --config bot.yaml`): where it listens, the tokens, "
        "where alerts go and how, the chat platforms, the store and the transports. Secrets are never written "
        "here: a key ending in `_env` names an environment variable, `env`/`file` pairs name where a token is. "
        "`config/bot.yaml` and `config/bot.local.yaml` are commented examples; the operator guide "
        "([index](../index.md#operator-guide)) says how to set each part up."),
}


def _type(tp: Any) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:
        return " | ".join(f"`{a}`" for a in args)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        parts = [_type(a) for a in args if a is not type(None)]
        return " | ".join(parts) + (" | null" if type(None) in args else "")
    if origin is list:
        return f"list of {_type(args[0])}"
    if origin is tuple:
        return f"list of {_type(args[0])}"
    if origin is dict:
        return f"mapping of {_type(args[0])} to {_type(args[1])}"
    if dataclasses.is_dataclass(tp):
        return "mapping"
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def _value(v: Any) -> str:
    if v is None:
        return "`null`"
    if isinstance(v, bool):
        return f"`{str(v).lower()}`"
    if isinstance(v, float) and math.isinf(v):
        return "`.inf`"
    if isinstance(v, str):
        return f'`"{v}"`' if v else '`""`'
    if isinstance(v, (list, tuple)):
        return "`[" + ", ".join(_value(x).strip("`") for x in v) + "]`"
    if isinstance(v, dict):
        return "`{}`" if not v else "`{" + ", ".join(f"{k}: {_value(x).strip('`')}" for k, x in v.items()) + "}`"
    if isinstance(v, float) and v == int(v) and abs(v) < 1e15:
        return f"`{int(v)}`" if abs(v) < 1e6 else f"`{v:g}`"
    return f"`{v}`"


def _num(x: float) -> str:
    return f"{int(x):,}" if float(x) == int(x) and abs(x) < 1e15 else f"{x:g}"


def _bounds(cls: type, key: str) -> str:
    b = bounds_of(cls, key)
    out = []
    if "ge" in b:
        out.append(f"≥ {_num(max(b['ge']))}")
    if "gt" in b:
        out.append(f"> {_num(max(b['gt']))}")
    if "le" in b:
        out.append(f"≤ {_num(min(b['le']))}")
    return ", ".join(out)


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _nested(tp: Any) -> tuple[type | None, str]:
    """The dataclass a field's value is made of, and how its keys are reached ("", "[]" for list items,
    ".<name>" for a mapping's values)."""
    if dataclasses.is_dataclass(tp):
        return tp, ""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is list and args and dataclasses.is_dataclass(args[0]):
        return args[0], "[]"
    if origin is dict and len(args) == 2 and dataclasses.is_dataclass(args[1]):
        return args[1], ".<name>"
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        for a in args:
            inner, how = _nested(a)
            if inner is not None:
                return inner, how
    return None, ""


def _anchor(path: str) -> str:
    return "".join(c for c in path.lower().replace(".", "").replace("[]", "").replace("<name>", "name")
                   if c.isalnum() or c in "-_")


def section(cls: type, path: str, doc: str, out: list[str]) -> None:
    """`path`'s table, then one section per key of `cls` made of keys of its own."""
    hints = typing.get_type_hints(cls)
    fields = [f for f in dataclasses.fields(cls) if not f.metadata.get("internal") and f.init]
    out += [f"## `{path}`", ""]
    if doc:
        out += [doc, ""]
    out += ["| key | type | default | bounds | meaning |", "|---|---|---|---|---|"]
    later = []
    for f in fields:
        tp = hints[f.name]
        inner, how = _nested(tp)
        default = _default(f)
        sub = f"{path}.{f.name}{how}"
        if inner is not None and how == "":
            shown = f"[see below](#{_anchor(sub)})"
        elif default is dataclasses.MISSING:
            shown = "(required)"
        elif inner is not None and default:
            shown = _value([dataclasses.asdict(x) for x in default] if isinstance(default, list) else
                           {k: dataclasses.asdict(v) for k, v in default.items()})
        else:
            shown = _value(default)
        meaning = f.metadata.get("doc", "")
        if inner is not None:
            meaning += ("; " if meaning else "") + f"keys: [`{sub}`](#{_anchor(sub)})"
            later.append((inner, sub))
        out.append(f"| `{f.name}` | {_cell(_type(tp))} | {_cell(shown)} | {_bounds(cls, f.name)} | {_cell(meaning)} |")
    out.append("")
    for inner, sub in later:
        section(inner, sub, " ".join((inner.__doc__ or "").strip().split("\n\n")[0].split())
                if inner.__doc__ and not inner.__doc__.startswith(inner.__name__ + "(") else "", out)


def render(root_key: str, module: str, cls_name: str) -> str:
    import importlib

    cls = getattr(importlib.import_module(module), cls_name)
    out = [f"# `{root_key}` reference", "",
           "<!-- Generated by tools/config_reference.py from the config schema; do not edit by hand. -->", "",
           INTRO[root_key], ""]
    section(cls, root_key, "", out)
    return "\n".join(out).rstrip() + "\n"


def pages() -> dict[Path, str]:
    return {ROOT / "docs" / "reference" / name: render(*what) for name, what in PAGES.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when a committed page differs from the code")
    args = ap.parse_args()
    stale = []
    for path, text in pages().items():
        if path.exists() and path.read_text() == text:
            continue
        stale.append(path)
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    for path in stale:
        print(f"{path.relative_to(ROOT)}: {'out of date' if args.check else 'written'}")
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    raise SystemExit(main())
