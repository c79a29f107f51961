from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# Property suites: reproducible in CI (same examples every run), no per-example deadline on a shared
# 2-core machine; `HYPOTHESIS_PROFILE=dev` explores new examples locally.
settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", deadline=None, max_examples=500)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
TRACES = SHARED / "data" / "real-traces"
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _msmon_logging():
    """Keep msmon's logger on INFO and propagating, so caplog sees it whatever ran before."""
    log = logging.getLogger("msmon")
    old = (log.level, log.propagate, list(log.handlers))
    log.setLevel(logging.INFO)
    log.propagate = True
    yield
    log.setLevel(old[0])
    log.propagate = old[1]
    log.handlers[:] = old[2]


@pytest.fixture
def traces() -> Path:
    if not TRACES.is_dir():
        pytest.skip(f"real traces not found at {TRACES} (they live in ../shared beside the checkout)")
    return TRACES


@pytest.fixture
def write(tmp_path):
    def _write(name: str, text: str) -> str:
        p = tmp_path / name
        p.write_text(text)
        return os.fspath(p)

    return _write
