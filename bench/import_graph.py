"""The project's import graph in three numbers: modules, import-linter contracts kept, import cycles.

    .venv/bin/python bench/import_graph.py

Prints the module count of msmon, notifier and bot, each `[tool.importlinter]` contract of pyproject.toml
with KEPT or BROKEN, and every import cycle (a strongly connected component of more than one module in
grimp's graph, TYPE_CHECKING imports included, as lint-imports sees them). Exits 1 if a contract is broken
or a cycle exists. tests/project/test_layout.py asserts the cycle count with `import_cycles` from here.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import grimp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("msmon", "notifier", "bot")


def project_graph() -> grimp.ImportGraph:
    """The import graph of the project's own modules (no third-party nodes), built fresh without a cache."""
    return grimp.build_graph(*PACKAGES, cache_dir=None)


def import_cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Every strongly connected component of more than one module, each sorted, the list sorted (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in graph.find_modules_directly_imported_by(module):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return sorted(cycles)


def contract_results() -> list[tuple[str, bool]]:
    """(name, kept) for each import-linter contract in pyproject.toml, from `lint-imports` as `make lint` runs it."""
    lint_imports = os.path.join(os.path.dirname(sys.executable), "lint-imports")
    env = {**os.environ, "COLUMNS": "1000"}  # one line per contract: rich wraps long names at the terminal width
    out = subprocess.run([lint_imports, "--no-cache", "--no-logo"], cwd=ROOT, env=env, capture_output=True, text=True)
    results = [(m[1], m[2] == "KEPT") for m in re.finditer(r"^(.+) (KEPT|BROKEN)$", out.stdout, re.MULTILINE)]
    if not results:  # a config error, not a clean bill
        raise RuntimeError(f"lint-imports reported no contracts:\n{out.stdout}{out.stderr}")
    return results


def main() -> int:
    sys.path.insert(0, ROOT)  # this checkout's packages, as lint-imports run from the root finds them
    graph = project_graph()
    print(f"modules: {len(graph.modules)} in {', '.join(PACKAGES)}")
    results = contract_results()
    for name, kept in results:
        print(f"contract {'KEPT  ' if kept else 'BROKEN'} {name}")
    cycles = import_cycles(graph)
    print(f"import cycles: {len(cycles)}")
    for cycle in cycles:
        print("  among " + ", ".join(cycle))
    return 0 if all(kept for _, kept in results) and not cycles else 1


if __name__ == "__main__":
    sys.exit(main())
