"""examples/custom_loop.py runs without a deprecation warning from msmon's or the example's own code (issue 19:
it called `set_context(device_target=...)`, which MindSpore deprecates for `mindspore.set_device`). Warnings
raised inside MindSpore's own modules about its own internals are MindSpore's, and left alone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytest.importorskip("mindspore")


@pytest.mark.mindspore
def test_custom_loop_example_runs_without_deprecation_warnings(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONWARNINGS": "default"}
    p = subprocess.run([sys.executable, "-W", "default", str(ROOT / "examples" / "custom_loop.py"), "--steps", "30"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    lines = (p.stdout + p.stderr).splitlines()
    # Python's warnings name the file that raised them; MindSpore's own log lines ("[WARNING] ME(...)") name
    # the MindSpore function a caller used in a deprecated way, which here can only be the example or msmon.
    ours = [line for line in lines if "deprecat" in line.lower() and "site-packages" not in line]
    assert ours == [], "\n".join(ours)
    assert any("[step" in line or "msmon" in line for line in lines)  # it did train and monitor
