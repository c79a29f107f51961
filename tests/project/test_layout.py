"""The walls of the layout, checked where they matter: what a fresh interpreter loads when it imports one
part of the tree, and that no modules import each other in a circle. import-linter (`make lint`) checks
the same walls statically from pyproject.toml; these tests see what actually loads, lazy imports included.

Each probe runs in a fresh `python -I -S` (no site, so no editable-install hook or .pth file loads
urllib or anything else before the probe) with only this checkout and site-packages on its path, and
reports the modules the given imports added.
"""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
import sysconfig
from pathlib import Path

import grimp
import pytest

from bench.import_graph import import_cycles, project_graph

ROOT = Path(__file__).resolve().parents[2]
PROBE = ("import sys; sys.path[:0] = sys.argv[1].split(':'); before = set(sys.modules)\n"
         "for name in sys.argv[2:]: __import__(name)\n"
         "print(sorted(set(sys.modules) - before))")
NO_IO = {"yaml", "urllib", "socket", "threading", "notifier", "bot"}
BOT_DEPENDENCIES = {"bot", "aiohttp", "slack_sdk", "matplotlib", "prometheus_client"}


def loaded_by(*modules: str, root: Path = ROOT) -> list[str]:
    """The modules a fresh interpreter adds to sys.modules when it imports each of `modules` in turn."""
    path = ":".join(dict.fromkeys([str(root), sysconfig.get_path("purelib"), sysconfig.get_path("platlib")]))
    p = subprocess.run([sys.executable, "-I", "-S", "-c", PROBE, path, *modules],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    loaded: list[str] = ast.literal_eval(p.stdout)
    return loaded


def tops(modules: list[str]) -> set[str]:
    """The top-level packages of `modules` (urllib for urllib.parse)."""
    return {m.partition(".")[0] for m in modules}


def every_module(package: str) -> list[str]:
    """The package and its modules at any depth, read from the files under it (so a new module is checked
    without being listed here, and nothing is imported into this process)."""
    names = []
    for file in sorted((ROOT / package.replace(".", "/")).rglob("*.py")):
        parts = file.relative_to(ROOT).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def test_the_probe_sees_what_an_import_loads() -> None:
    """The probes below can fail: the config framework reads YAML, and the probe says so."""
    assert "yaml" in tops(loaded_by("msmon.config.yamlio"))
    assert "threading" in tops(loaded_by("msmon.contract.wire", "threading"))


def test_the_core_and_the_contract_load_no_io() -> None:
    core = every_module("msmon.core") + every_module("msmon.contract")
    assert {"msmon.core.detectors", "msmon.core.gate", "msmon.core.trend", "msmon.contract.wire"} <= set(core)
    assert sorted(tops(loaded_by(*core)) & NO_IO) == []


def test_the_contract_alone_needs_msgspec_only() -> None:
    """Beyond what msgspec loads itself (it tries typing_extensions), the contract adds the stdlib only."""
    loaded = loaded_by(*every_module("msmon.contract"))
    added = sorted(set(loaded) - set(loaded_by("msgspec")))
    foreign = [m for m in added if m.partition(".")[0] not in sys.stdlib_module_names
               and m != "msmon" and not m.startswith("msmon.contract")]
    assert foreign == []
    assert "msgspec" in loaded


def test_no_import_cycles() -> None:
    cycles = import_cycles(project_graph())
    print(f"import cycles: {len(cycles)}", *cycles, sep="\n")
    assert cycles == []


def test_the_cycle_count_sees_a_cycle() -> None:
    graph = grimp.ImportGraph()
    for importer, imported in [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d"), ("d", "e"), ("e", "d"), ("x", "a")]:
        graph.add_import(importer=importer, imported=imported)
    assert import_cycles(graph) == [["a", "b", "c"], ["d", "e"]]


def test_notifier_alone_loads_nothing_of_the_bot() -> None:
    assert sorted(tops(loaded_by("notifier")) & BOT_DEPENDENCIES) == []


def test_the_whole_job_runtime_loads_nothing_of_the_bot() -> None:
    """Every notifier module, the MindSpore and MindFormers edges included when they are installed (what a job
    imports)."""
    modules = every_module("notifier")
    for edge in ("mindspore", "mindformers"):
        if importlib.util.find_spec(edge) is None:
            modules = [m for m in modules if not m.startswith(f"notifier.{edge}")]
    assert sorted(tops(loaded_by(*modules)) & BOT_DEPENDENCIES) == []


def test_a_custom_loop_gets_the_runtime_without_mindspore() -> None:
    """Every notifier module but the MindSpore edges (notifier.mindspore, and notifier.mindformers on top of it:
    the Monitor, job control, transport) loads no MindSpore."""
    modules = [m for m in every_module("notifier") if not m.startswith(("notifier.mindspore", "notifier.mindformers"))]
    assert {"notifier.monitor", "notifier.control"} <= set(modules)
    assert "mindspore" not in tops(loaded_by(*modules))


def test_the_bot_loads_no_mindspore() -> None:
    pytest.importorskip("aiohttp")
    assert "mindspore" not in tops(loaded_by(*every_module("bot")))
