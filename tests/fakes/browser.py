"""Debian's Chromium as the browser tests launch it (Playwright's own browser download cannot run here), and where
their screenshots go: $MSMON_ARTIFACTS when set (CI keeps them), else the test's tmp_path."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tests.fakes.helpers import patience

CHROMIUM = "/usr/bin/chromium"
# headless as root, and nothing reaching out to the closed network (its refused connections slow every start)
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]


def artifacts_dir(tmp_path: Path) -> Path:
    where = Path(os.environ.get("MSMON_ARTIFACTS") or tmp_path / "artifacts")
    where.mkdir(parents=True, exist_ok=True)
    return where


def new_page(browser: Any, width: int, height: int) -> Any:
    """A page whose waits (Playwright's 30 s default) take the suite's patience(), as every other wait does."""
    page = browser.new_page(viewport={"width": width, "height": height})
    page.set_default_timeout(30_000 * patience())
    return page
