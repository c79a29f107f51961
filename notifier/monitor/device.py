"""What the Monitor keeps per device: its rules (detector and alert state), its steps since the last sample.

`Device` is bounded whatever the length of the run: sums and counts since the last sample, and windows of
recent samples. sampling.py fills and empties its counters, rules.py runs its rules,
state.py saves and loads it.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from msmon.contract.wire import Sample
from msmon.core.accumulation import Infer
from msmon.core.detectors import DetectorContext, Finding, RuleParams
from msmon.core.gate import GateState
from msmon.core.whatif import Recent

WINDOW_SAMPLES = 120  # recent samples kept per device for an event's chart


class Rule:
    """One active rule on one device: its detector and its alert state."""

    __slots__ = ("name", "detector", "update", "gate", "immediate", "hint", "metric")

    def __init__(self, name: str, detector: Any) -> None:
        self.name = name
        self.detector = detector
        self.update = detector.update  # rule_off once the rule crashed (`Rules.judge`)
        self.gate = GateState()
        self.immediate = name == "nonfinite"
        self.hint: str = detector.hint
        self.metric: str = detector.metric


class Device:
    """Everything the Monitor keeps for one device; bounded whatever the length of the run."""

    __slots__ = ("name", "rules", "prev_t", "prev_step", "max_dt", "last_t", "last_step",
                 "tokens", "samples", "data", "data_n", "acc_loss", "acc_n", "recent", "whatif", "skipped",
                 "accum", "shift", "infer", "held", "ctx")

    def __init__(self, name: str, rules: list[Rule], ctx: DetectorContext, accum: int | None = 1) -> None:
        self.name = name
        self.rules = rules
        self.prev_t: float | None = None  # time of the previous step() call
        self.prev_step = 0  # its step number
        self.max_dt = 0.0  # slowest time per step between two calls since the last sample
        self.last_t: float | None = None  # time of the last sample
        self.last_step = 0  # step number (as passed in) of the last sample
        self.tokens = 0.0
        self.samples = 0.0
        self.data = 0.0  # seconds waited for input since the last sample (step(data_time=)), over data_n calls
        self.data_n = 0
        self.acc_loss = 0.0  # gradient accumulation: sum of micro-step losses
        self.acc_n = 0
        # rows per optimizer step: declared (training.grad_accumulation_steps), else inferred from the first rows
        # (msmon.core.accumulation), which are held meanwhile; `shift` aligns the step numbers to the groups
        self.accum = accum or 1
        self.shift = 0
        self.infer: Infer | None = None if accum else Infer()
        self.held: list[tuple[Any, ...]] = []
        self.skipped = 0  # steps skipped by dynamic loss scaling (step(overflow=True)) so far
        self.recent: deque[Sample] = deque(maxlen=WINDOW_SAMPLES)
        self.whatif = Recent()  # the last WHATIF_SAMPLES samples, compact: what a threshold change is judged on
        self.ctx = ctx  # what its rules know of the run (Monitor.plan adds to it)


def rule_off(s: Sample, p: RuleParams) -> Finding | None:
    """The update of a rule taken out after a crash."""
    return None
