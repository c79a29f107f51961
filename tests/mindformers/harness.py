"""Running MindFormers' own Trainer, with msmon attached by its YAML, in the MindFormers venvs `make test` builds.

Each job runs in a subprocess of its own, in the venv of one MindFormers release (`.venv-mf21`: MindFormers 2.1.0 on
MindSpore 2.10.0; `.venv-mf19`: 1.9.0 on 2.9.0; or MSMON_MF21_PYTHON / MSMON_MF19_PYTHON naming a Python that has
them): MindFormers holds process-wide state (its context, its registry), and the suite's own venv keeps the
MindSpore it pins. A venv that is not there skips its tests with the command that makes it.
"""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
JOB = HERE / "job.py"
BASE_YAML = HERE / "configs" / "llama_tiny.yaml"
VENVS = {"mf21": ".venv-mf21", "mf19": ".venv-mf19"}  # MindFormers 2.1.0 / MindSpore 2.10.0; 1.9.0 / 2.9.0
JOB_TIMEOUT = 420.0  # a 60-step job takes 30-60 s on a loaded 2-core machine (import, graph compile, steps)

# MFLossMonitor's line (1.7-2.1): loss:[cur/mean] (%5.6f) in non-sink mode, lr as numpy prints a float32,
# global_norm in brackets
LINE = re.compile(r"step:\[\s*(?P<step>\d+)/\s*\d+\], loss:\[?(?P<loss>[-\d.eE+naif]+)(?:/[-\d.eE+naif]+)?\]?, "
                  r"per_step_time: \d+ms, lr: (?P<lr>[^,]+), overflow cond: (?P<overflow>\w+), "
                  r"loss_scale: (?P<scale>[^,]+), global_norm: \[(?P<norm>[^\]]+)\]")


def python_of(name: str) -> str | None:
    env = os.environ.get(f"MSMON_{name.upper()}_PYTHON")
    exe = Path(env) if env else ROOT / VENVS[name] / "bin" / "python"
    return str(exe) if exe.exists() else None


def need(name: str) -> str:
    exe = python_of(name)
    if exe is None:
        pytest.skip(f"{VENVS[name]} is not there: `make {VENVS[name]}` builds it (make test does)")
    return exe


@dataclass
class Job:
    """What one MindFormers job left: MindFormers' log lines, msmon's CSV rows and events, by step."""

    out: Path
    proc: subprocess.CompletedProcess[str]
    log: dict[int, dict[str, str]] = field(default_factory=dict)
    rows: dict[int, dict[str, str]] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)

    @property
    def text(self) -> str:
        return self.proc.stdout + self.proc.stderr


def yaml_with(tmp: Path, base: Path = BASE_YAML, callbacks: list[dict[str, Any]] | None = None,
              **msmon: Any) -> Path:
    """The base YAML with `msmon` merged into its MsmonCallback entry and `callbacks` put before that entry."""
    data = yaml.safe_load(base.read_text())
    calls = data["callbacks"]
    entry = next(c for c in calls if c.get("type") == "MsmonCallback")
    entry.update(msmon)
    i = calls.index(entry)
    data["callbacks"] = calls[:i] + list(callbacks or []) + calls[i:]
    path = tmp / "train.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def run_job(python: str, config: Path, out: Path, steps: int = 60, seed: int = 0) -> Job:
    proc = subprocess.run([python, str(JOB), "--config", str(config), "--out", str(out), "--steps", str(steps),
                           "--seed", str(seed)], capture_output=True, text=True, timeout=JOB_TIMEOUT, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    job = Job(out, proc)
    assert proc.returncode == 0, job.text[-6000:]
    for line in (out / "output" / "log" / "rank_0" / "info.log").read_text().splitlines():
        m = LINE.search(line)
        if m:
            job.log[int(m["step"])] = m.groupdict()
    for f in (out / "msmon_logs").glob("*.csv"):
        with f.open(newline="") as fh:
            job.rows.update({int(r["step"]): r for r in csv.DictReader(fh)})
    ev = out / "events.jsonl"
    if ev.exists():
        job.events = [json.loads(x) for x in ev.read_text().splitlines() if x]
    return job


def run_python(python: str, code: str, *args: str, cwd: Path) -> str:
    """`code` in that Python, in `cwd` (importing MindFormers makes ./output/log there)."""
    proc = subprocess.run([python, "-c", code, *args], capture_output=True, text=True, timeout=JOB_TIMEOUT, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return proc.stdout


def f32(text: str) -> np.float32:
    """A number MindFormers printed, as the float32 it printed."""
    return np.float32(float(text))


def assert_same_as_mindformers(job: Job, steps: range) -> None:
    """Every step's msmon row equals MindFormers' line: the loss to the 6 decimals MindFormers prints, the LR,
    grad norm and loss scale as the float32 MindFormers prints, the overflow flag."""
    assert sorted(job.log) == list(steps), f"MindFormers logged steps {sorted(job.log)}"
    assert sorted(job.rows) == list(steps), f"msmon recorded steps {sorted(job.rows)}"
    for step in steps:
        line, row = job.log[step], job.rows[step]
        assert f"{float(row['loss']):.6f}" == line["loss"], (step, row["loss"], line["loss"])
        assert f32(row["learning_rate"]) == f32(line["lr"]), (step, row["learning_rate"], line["lr"])
        assert f32(row["grad_norm"]) == f32(line["norm"]), (step, row["grad_norm"], line["norm"])
        assert f32(row["loss_scale"]) == f32(line["scale"]), (step, row["loss_scale"], line["scale"])
        assert bool(int(float(row["overflow"]))) == (line["overflow"] == "True"), (step, row["overflow"])
