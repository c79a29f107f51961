"""The MindFormers venvs as fixtures: a test per release (tests/mindformers/harness.py runs the jobs)."""

from __future__ import annotations

import pytest

from tests.mindformers.harness import VENVS, need


@pytest.fixture(params=sorted(VENVS))
def mf_python(request: pytest.FixtureRequest) -> str:
    """The Python of each MindFormers venv (.venv-mf21, .venv-mf19)."""
    return need(request.param)


@pytest.fixture
def mf21_python() -> str:
    return need("mf21")
