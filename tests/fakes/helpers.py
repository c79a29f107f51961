"""Small real pieces the tests share: a sink that keeps samples, a clock tests move by hand, the
installed `msmon` command run as a user runs it."""

from __future__ import annotations

import math
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from msmon.contract.wire import Event, Sample
from notifier import Monitor
from tests.conftest import ROOT

MSMON = str(Path(sys.executable).parent / "msmon")


def msmon(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """The installed console script in a real subprocess."""
    return subprocess.run([MSMON, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


class ListSink:
    """A real Sink (the protocol the CSV and TensorBoard sinks implement) that keeps what it gets."""

    name = "list"

    def __init__(self) -> None:
        self.samples: list[Sample] = []
        self.closed = False

    def write(self, s: Sample) -> None:
        self.samples.append(s)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


class FakeClock:
    def __init__(self, t: float = 1_700_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


def config(**over: Any) -> dict[str, Any]:
    """A monitor_config dict: on, sampled every step, short baseline; `over` merges in (nested dicts too)."""
    base: dict[str, Any] = {"monitor_on": True, "step_interval": 1, "log_interval": 0,
                            "alert": {"baseline_steps": 100}}
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            base[k] = {**base[k], **v}
        else:
            base[k] = v
    return {"monitor_config": base}


def healthy(step: int, rng: random.Random) -> dict[str, float]:
    """One step of a healthy run: power-law loss with noise, steady grad norm, LR warmup then cosine."""
    loss = 2.0 + 3.0 * (step + 10) ** -0.3 + rng.gauss(0.0, 0.03)
    grad = 1.0 * math.exp(rng.gauss(0.0, 0.1))
    lr = 3e-4 * min(1.0, (step + 1) / 500) * (0.55 + 0.45 * math.cos(math.pi * min(step, 200_000) / 200_000))
    return {"loss": loss, "lr": lr, "grad_norm": grad, "tokens": 4096.0 * math.exp(rng.gauss(0.0, 0.02))}


def run(mon: Monitor, steps: range, make, clock: FakeClock | None = None, dt: float = 1.0) -> list[Event]:
    events: list[Event] = []
    for step in steps:
        if clock is not None:
            clock.advance(dt)
        events.extend(mon.step(step, **make(step)))
    return events


def patience() -> float:
    """How many times its nominal timeout a test waits for a condition: $MSMON_TEST_PATIENCE, else 4.

    A wait on a condition returns as soon as the condition holds, so a longer limit costs a passing test nothing; it
    only decides how long a broken one takes to fail. The nominal figures are what an idle 2-core machine needs; a CI
    machine or a laptop at load 8-20 (other suites, a build) runs the same work several times slower, and a test that
    failed there for want of patience said nothing about the code."""
    return max(1.0, float(os.environ.get("MSMON_TEST_PATIENCE") or 4.0))


def wait_for(cond: Any, timeout: float = 30.0) -> bool:
    """Poll `cond()` until it is true (True) or `timeout` x patience() seconds pass (False)."""
    deadline = time.monotonic() + timeout * patience()
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return False
