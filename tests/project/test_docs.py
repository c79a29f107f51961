"""The docs hold together: every relative link in README.md, CONTRIBUTING.md, CHANGELOG.md and docs/ points
at a file that exists, and an anchor (`page.md#section`) at a heading of that page (GitHub's slugs); the README
stays a page a newcomer reads (200 lines at most) and keeps its two commands first."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import ROOT

PAGES = sorted([ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md", *(ROOT / "docs").rglob("*.md")])
LINK = re.compile(r"(?<!\!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)|<(https?://[^>]+)>")


def _prose(text: str) -> str:
    """`text` without fenced code blocks and inline code (a link in code is not a link)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces to '-'."""
    text = heading.strip().replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    seen: dict[str, int] = {}
    out = set()
    for m in re.finditer(r"^#{1,6} (.+)$", text, flags=re.M):
        s = slug(m.group(1))
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    return out


def links(page: Path) -> list[str]:
    return [a or b for a, b, _ in LINK.findall(_prose(page.read_text())) if (a or b)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in links(page):
        if re.match(r"^[a-z]+:", target):  # http(s), mailto: not checked here (no network)
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading '#{anchor}' in {dest.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_readme_is_a_page_with_the_two_commands_first() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200, len(lines)
    commands = [line for line in lines[:8] if line.startswith("make ")]
    assert [c.split()[1] for c in commands] == ["demo", "test"], commands


def test_every_docs_page_is_reachable_from_the_index() -> None:
    index = ROOT / "docs" / "index.md"
    reached = {(index.parent / t.partition("#")[0]).resolve() for t in links(index) if not re.match(r"^[a-z]+:", t)}
    for page in (ROOT / "docs").rglob("*.md"):
        if page != index:
            assert page.resolve() in reached, f"{page.relative_to(ROOT)} is not linked from docs/index.md"


def test_the_checker_finds_a_broken_link_and_anchor(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# Title here\n\n[ok](#title-here) [bad](#nope) [gone](b.md) `[code](c.md)`\n")
    page = tmp_path / "a.md"
    found = [t for t in links(page)]
    assert found == ["#title-here", "#nope", "b.md"]
    assert "title-here" in anchors(page) and "nope" not in anchors(page)
