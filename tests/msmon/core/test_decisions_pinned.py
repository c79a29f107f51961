"""The rules decide exactly what they decided before their hot path was made cheaper (issue 31).

Real recorded traces (llm.c GPT-2 with grad norms, a modded-nanogpt run with step times) and this repository's
MindSpore CPU traces with loss-scale overflows and an LR jump are replayed through the Monitor under three configs:
the shipped one, fixed thresholds, and a tight one (consecutive 1, low levels, reminders every 10 steps) that makes
every baseline rule fire, hold, repeat and resolve thousands of times. Every event's step, rule, severity, status,
repeat flag, value, threshold, baseline (their exact reprs) and message is hashed; the hashes and the counts per rule
were recorded from the code before the optimisation (commit 9e85105). A rule that decides one event differently, or
one float differently, changes its hash; the counts say which rule.

When a rule's decisions change on purpose, record them afresh:
    .venv/bin/python -m tests.msmon.core.test_decisions_pinned --write
and say in the commit why they changed.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from msmon.core.detectors import RULES
from msmon.offline.readers import read_log
from msmon.offline.replay import replay
from notifier import Monitor
from tests.conftest import ROOT, TRACES

PINNED = Path(__file__).with_name("decisions_pinned.json")
CPU = ROOT / "data" / "backtest" / "mindspore-cpu"
TRACE_FILES = {
    "llmc-gpt2-124m": TRACES / "llmc-gpt2-124m" / "main.csv",
    "modded-nanogpt-soap": TRACES / "modded-nanogpt" / "runs" / "2024-10-09_SOAP__5bdc3988.csv",
    "cpu-lossscale-s6": CPU / "lm-lossscale-s6.csv",
    "cpu-overflow-stuck": CPU / "lm-overflow-stuck.csv",
    "cpu-lr-jump": CPU / "lm-lr-jump.csv",
    "cpu-grad-creep": CPU / "lm-grad-creep.csv",
}


def configs() -> dict[str, dict[str, Any]]:
    def load(name: str) -> dict[str, Any]:
        cfg: dict[str, Any] = yaml.safe_load((ROOT / "config" / name).read_text())
        cfg["monitor_config"]["tensorboard"] = {"enable": False}
        cfg["monitor_config"]["csv"] = {"enable": False}
        return cfg

    shipped, fixed = load("monitor.yaml"), load("fixed-thresholds.yaml")
    tight = copy.deepcopy(shipped)
    alert = tight["monitor_config"].setdefault("alert", {})
    alert.pop("loss_spike_threshold", None)
    alert["alert_interval"] = 10
    rules = alert["rules"] = {r: {"consecutive": 1} for r in RULES if r not in ("nonfinite", "lr_schedule")}
    rules["loss_spike"].update(warning=1.5)
    rules["grad_norm_spike"].update(warning=1.5, error=3.0)
    rules["grad_norm_creep"].update(warning=1.1, error=1.3, min_t=1.0)
    rules["throughput_drop"].update(warning=0.05, error=0.2, noise_sigma=0.5)
    rules["step_stall"].update(warning=2.0, min_seconds=0.0)
    return {"shipped": shipped, "fixed": fixed, "tight": tight}


def decisions(trace: Path, config: dict[str, Any], step_interval: int) -> dict[str, Any]:
    """The events of one replay: their hash, their count per rule and status, and the samples taken."""
    cfg = copy.deepcopy(config)
    cfg["monitor_config"]["step_interval"] = step_interval
    mon = Monitor(cfg, "pinned", clock=lambda: 0.0)
    events = replay(read_log(str(trace)), mon)
    digest = hashlib.sha256()
    for e in events:
        digest.update(json.dumps([e.step, e.device, e.rule, e.severity.value, e.status.value, e.repeat, repr(e.value),
                                  repr(e.threshold), repr(e.baseline), e.message, e.phase]).encode())
    counts = Counter(f"{e.rule} {e.status.value}{' repeat' if e.repeat else ''}" for e in events)
    return {"sha256": digest.hexdigest(), "counts": dict(sorted(counts.items())), "samples": mon.sample_count}


def cases() -> list[tuple[str, str, int]]:
    return [(t, c, si) for t in TRACE_FILES for c in ("shipped", "fixed", "tight") for si in (1, 10)]


@pytest.mark.traces
@pytest.mark.parametrize("trace", list(TRACE_FILES))
def test_decisions_are_the_pinned_ones(trace: str) -> None:
    if not TRACE_FILES[trace].is_file():
        pytest.skip(f"{TRACE_FILES[trace]} not found (real traces live in ../shared beside the checkout)")
    pinned = json.loads(PINNED.read_text())
    cfgs = configs()
    fired = 0
    for t, c, si in cases():
        if t != trace:
            continue
        got = decisions(TRACE_FILES[t], cfgs[c], si)
        want = pinned[f"{t} {c} {si}"]
        assert got["counts"] == want["counts"], f"{t}, config {c}, step_interval {si}: events per rule differ"
        assert got == want, f"{t}, config {c}, step_interval {si}: same counts, but an event's value or text differs"
        fired += sum(got["counts"].values())
    assert fired > 0  # the pins judge decisions, not silence


if __name__ == "__main__" and "--write" in sys.argv:
    logging.getLogger("msmon").setLevel(logging.CRITICAL)  # thousands of alert lines: the file is the output
    cfgs = configs()
    PINNED.write_text(json.dumps({f"{t} {c} {si}": decisions(TRACE_FILES[t], cfgs[c], si) for t, c, si in cases()},
                                 indent=1) + "\n")
    print(f"wrote {PINNED}")
