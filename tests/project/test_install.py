"""`pip install msmon` into a job's environment never replaces the MindSpore or NumPy already there: on Ascend they
come from Huawei's wheel matched to CANN and the driver. pip plans the install (a dry run against the package
index, as a user's pip would) in this test's own venv, which has MindSpore installed: the main venv (2.10) and
make unit's .venv-ms27 (2.7.0, the oldest msmon supports). With the [mindspore] extra too: its range must take
the MindSpore that is there (it once pinned 2.10.*, and pip planned 2.10.0 over a cluster's 2.7.1)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

ms = pytest.importorskip("mindspore", reason="MindSpore is not installed (pip install msmon[mindspore])")
pytestmark = [pytest.mark.mindspore, pytest.mark.slow]  # pip resolves against the index: 10-30 s


def planned(tmp_path: Path, target: str) -> dict[str, str]:
    """name -> version of what `pip install -e TARGET` would install or replace here."""
    report = tmp_path / "report.json"
    p = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--report", str(report),
                        "--disable-pip-version-check", "-e", target], cwd=tmp_path, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    items = json.loads(report.read_text())["install"]
    return {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in items}


@pytest.mark.parametrize("extras", ["", "[mindspore]"], ids=["msmon", "msmon[mindspore]"])
def test_installing_msmon_leaves_mindspore_and_numpy_in_place(tmp_path, extras):
    import numpy

    plan = planned(tmp_path, f"{ROOT}{extras}")
    assert "msmon" in plan
    assert "mindspore" not in plan, f"pip would replace MindSpore {ms.__version__} with {plan.get('mindspore')}"
    assert "numpy" not in plan, f"pip would replace NumPy {numpy.__version__} with {plan.get('numpy')}"
