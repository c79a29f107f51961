"""The image's recipe without a Docker engine (none runs on this project's machines): the Dockerfile's
instructions, its layer order (the locked dependencies before the source, msmon itself in one RUN), that every
file it copies is in the build context .dockerignore leaves, and that the lock files pin every package with
hashes: the common set without the platforms a Slack-only team does not use, `all` with them.
(`docker build` itself is not run here; docs/operator/container.md says how the lock was checked in a fresh venv.)"""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

import pytest

from tests.conftest import ROOT

INSTRUCTIONS = {"FROM", "ARG", "ENV", "RUN", "COPY", "USER", "WORKDIR", "EXPOSE", "HEALTHCHECK", "CMD", "LABEL",
                "ENTRYPOINT", "VOLUME"}


def instructions() -> list[tuple[str, str]]:
    """(instruction, arguments) of the Dockerfile, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        word, _, rest = pending.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        pending = ""
    assert not pending, "the Dockerfile ends inside a continued line"
    return out


def in_context(path: str) -> bool:
    """Whether .dockerignore leaves `path` (relative, '/'-separated) in the build context: the last matching
    pattern decides, a pattern matching a parent folder covers what is under it."""
    keep = True
    for raw in (ROOT / ".dockerignore").read_text().splitlines():
        pattern = raw.strip()
        if not pattern or pattern.startswith("#"):
            continue
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        parts = path.split("/")
        prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
        if pattern.startswith("**/"):
            hit = any(fnmatch.fnmatch(p, pattern[3:]) for p in parts)
        else:
            hit = any(fnmatch.fnmatch(p, pattern) for p in prefixes)
        if hit:
            keep = negate
    return keep


def lock(name: str) -> dict[str, list[str]]:
    """package -> its hashes, from requirements/<name>.lock.txt."""
    text = (ROOT / "requirements" / f"{name}.lock.txt").read_text()
    out: dict[str, list[str]] = {}
    for block in re.split(r"\n(?=[A-Za-z0-9])", text):
        head = block.strip().splitlines()[0] if block.strip() else ""
        if not head or head.startswith("#"):
            continue
        m = re.match(r"^([A-Za-z0-9_.\-]+)==\S+", head)
        assert m, f"{name}: not pinned with ==: {head}"
        out[m.group(1).lower()] = re.findall(r"--hash=sha256:([0-9a-f]{64})", block)
    return out


def test_the_dockerfile_parses_and_layers_dependencies_before_the_source() -> None:
    steps = instructions()
    assert all(word in INSTRUCTIONS for word, _ in steps), [w for w, _ in steps if w not in INSTRUCTIONS]
    assert steps[0][0] == "ARG" and steps[0][1].startswith("PYTHON_IMAGE=") and steps[1] == ("FROM", "${PYTHON_IMAGE}")
    words = [w for w, _ in steps]
    deps = next(i for i, (w, a) in enumerate(steps) if w == "RUN" and "--require-hashes" in a)
    code = next(i for i, (w, a) in enumerate(steps) if w == "RUN" and "--mount=type=bind" in a)
    assert "--no-deps" in steps[deps][1] and "--no-deps" in steps[code][1] and "--no-build-isolation" in steps[code][1]
    assert deps < code and words[code + 1:].count("RUN") == 0 and words[code + 1:].count("COPY") == 0
    # nothing before the code's RUN copies the source: a code change leaves the layers above it as they were
    for w, a in steps[:code]:
        if w == "COPY":
            assert not re.search(r"\b(msmon|notifier|bot)/?(\s|$)", a), a
    assert steps[-1][0] == "CMD" and '"serve"' in steps[-1][1]


def test_every_file_the_image_copies_is_in_the_build_context() -> None:
    args = {"LOCK": "bot"}
    for w, a in instructions():
        if w == "ARG" and "=" in a:
            k, v = a.split("=", 1)
            args.setdefault(k, v)
        if w != "COPY":
            continue
        sources = [s for s in a.split() if not s.startswith("--")][:-1]
        for source in sources:
            path = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], source)
            assert (ROOT / path).exists(), path
            assert in_context(path), f"{path} is left out by .dockerignore"
    for needed in ("pyproject.toml", "README.md", "msmon/cli/main.py", "bot/web/static/console.js",
                   "bot/store/migrations/sqlite", "notifier/monitor.py", "requirements/all.lock.txt"):
        assert in_context(needed), needed
    for left_out in (".venv/bin/python", "tests/conftest.py", "docs/index.md", ".git/HEAD", "msmon-bot.sqlite",
                     "bot/__pycache__/app.cpython-311.pyc", "requirements/build.in"):
        assert not in_context(left_out), left_out


def test_the_locks_pin_every_package_with_hashes_and_per_platform_extras() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    common, every, build = lock("bot"), lock("all"), lock("build")
    for name, pins in (("bot", common), ("all", every), ("build", build)):
        assert pins and all(hashes for hashes in pins.values()), (name, [p for p, h in pins.items() if not h])
    assert {"setuptools", "wheel"} <= set(build)

    def names(reqs: list[str]) -> set[str]:
        return {re.split(r"[\[<>=!~; ]", r, maxsplit=1)[0].lower() for r in reqs if not r.startswith("msmon")}

    server = names(extras["server"])
    assert server <= set(common) and server <= set(every)
    platform_only = names(extras["feishu"] + extras["matrix"] + extras["postgres"] + extras["nats"])
    assert platform_only == {"cryptography", "matrix-nio", "psycopg", "nats-py"}
    assert not platform_only & set(common), platform_only & set(common)  # a Slack-only team installs none of them
    assert platform_only <= set(every)
    assert "mindspore" not in every and "pytest" not in every


def test_the_checks_above_can_fail(tmp_path: Path) -> None:
    assert not in_context("tests/project/test_image.py") and in_context("bot/app.py")
    bad = tmp_path / "x.lock.txt"
    bad.write_text("aiohttp>=3\n")
    assert re.match(r"^([A-Za-z0-9_.\-]+)==\S+", bad.read_text()) is None


def test_the_locks_satisfy_pyproject_so_a_changed_dependency_needs_a_new_lock() -> None:
    tomllib = pytest.importorskip("tomllib")
    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]

    def closure(name: str, seen: set[str]) -> list[str]:
        """The requirements an extra brings, its msmon[...] extras followed."""
        out = []
        for r in extras[name]:
            req = Requirement(r)
            if req.name == "msmon":
                for inner in req.extras - seen:
                    seen.add(inner)
                    out += closure(inner, seen)
            else:
                out.append(r)
        return out

    versions = {}
    for name in ("bot", "all"):
        text = (ROOT / "requirements" / f"{name}.lock.txt").read_text()
        pins = re.finditer(r"^([A-Za-z0-9_.\-]+)==(\S+)", text, re.M)
        versions[name] = {m.group(1).lower(): m.group(2) for m in pins}
    for name in ("bot", "all"):
        for r in project["dependencies"] + closure(name, {name}):
            req = Requirement(r)
            pinned = versions[name].get(req.name.lower())
            assert pinned is not None, f"{name}.lock.txt lacks {req.name}: run tools/lock.sh"
            assert req.specifier.contains(pinned, prereleases=True), \
                f"{name}.lock.txt pins {req.name}=={pinned}, pyproject.toml wants {req.specifier}: run tools/lock.sh"
