"""Loss collapse: the loss falls to a fraction of its settled level, faster than learning does: the model is
memorizing (the loader serving the same batches, a stuck shard, a dataset far smaller than declared)."""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from typing import ClassVar

from msmon.contract.wire import Sample, Severity
from msmon.core.detectors.base import SKIP, DetectorContext, Finding, RuleParams, classify
from msmon.core.detectors.rolling import median
from msmon.core.spec import spec


@dataclasses.dataclass
class LossCollapseParams(RuleParams):
    """The level is a fall, in times: the settled level of the loss over its median now.

    The loss is judged a block of `window` samples at a time: the block's median against the settled level, the
    median of the medians of the `blocks` blocks before it where those blocks agree (the lowest at least `settled`
    x the highest: the loss was learning slowly; the lowest such level so far), and kept while they do not (the
    loss is falling fast: from what level is what counts; a loss coming back down from a spike or a restart comes
    back to its level, it does not fall below it). Before the blocks first agree (a run's first descent from its
    initial loss) nothing is judged. Learning, even a phase
    change leaving a plateau, lowers a language model's loss by a fraction (4.65 to 3.6: 1.3x; a unigram plateau
    to the next level: under 2x); a model that sees the same batches again and again drives it towards 0 (3.4 to
    0.2 within a hundred steps). Once firing, the settled level is held until the loss returns or a person
    acknowledges the alert (the new level is then the normal).
    """

    warning: float | None = dataclasses.field(
        default=2.5, metadata=spec(gt=1, doc="the loss's median now this many times below its settled level"))
    window: int = dataclasses.field(default=10, metadata=spec(ge=5, doc="samples in a block, judged by its median"))
    blocks: int = dataclasses.field(default=4, metadata=spec(ge=2, doc="blocks in the settled level"))
    settled: float = dataclasses.field(
        default=0.9, metadata=spec(gt=0, le=1, doc="the blocks' lowest median over their highest, at least: "
                                                    "the loss was not falling fast"))


class LossCollapse:
    rule: ClassVar[str] = "loss_collapse"
    summary: ClassVar[str] = "loss falling far below its settled level"
    metric: ClassVar[str] = "loss"
    requires: ClassVar[frozenset[str]] = frozenset({"loss"})
    hint: ClassVar[str] = ("Check the data pipeline: a loader repeating the same batches (a stuck shard, a sampler "
                           "seeded per step, an epoch far shorter than the dataset) makes the model memorize them. "
                           "Compare the eval loss; if this is a small fine-tune dataset on its later epochs, "
                           "acknowledge the alert.")

    __slots__ = ("block", "medians", "level", "held")

    RETURN: ClassVar[float] = 0.5  # a firing collapse resolves once its fall is under this x the WARNING level

    def __init__(self, p: LossCollapseParams, ctx: DetectorContext) -> None:
        self.block: list[float] = []  # the samples of the block being filled
        self.medians: deque[float] = deque(maxlen=p.blocks)  # one median per earlier block, oldest first
        self.level: float | None = None  # the settled level: the lowest at which the blocks agreed
        self.held: float | None = None  # the settled level while firing

    def update(self, s: Sample, p: RuleParams) -> Finding | None:
        """A verdict once per `window` samples, when a block is full (its median against the settled level); the
        samples between say nothing (SKIP: a firing alert stays as it is). A sample costs the job an append."""
        x = s.loss
        if x is None or x - x != 0.0:  # missing, NaN or Inf
            return SKIP
        block = self.block
        block.append(x)
        if len(block) < p.window:  # type: ignore[attr-defined]
            return SKIP
        assert isinstance(p, LossCollapseParams)
        cur = median(block)
        self.block = []
        level = self.held if self.held is not None else self.level
        finding = None if level is None else self._judge(cur, level, p)
        if self.held is None:  # a firing collapse holds the level it fell from
            self.medians.append(cur)
            settled = self._settled(p)
            if settled is not None:  # the lowest the loss has settled at: coming back from a rise is no fall
                self.level = settled if self.level is None else min(self.level, settled)
        return finding

    def _judge(self, cur: float, level: float, p: LossCollapseParams) -> Finding | None:
        fall = level / cur if cur > 0.0 else math.inf
        sev, thr = classify(fall, p)
        if sev is None and self.held is not None and p.warning is not None and fall >= self.RETURN * p.warning:
            sev, thr = Severity.WARNING, p.warning  # not returned yet: firing until the loss is back near its level
        if sev is None:
            self.held = None
            return None
        self.held = level
        return Finding(sev, fall, thr,
                       f"loss has collapsed: its median {cur:.4g} over the last {p.window} samples is {fall:.3g}x "
                       f"below its settled level {level:.4g} (threshold {thr:g}x); learning lowers a loss by a "
                       f"fraction, a model memorizing repeated batches drives it towards 0", level)

    def _settled(self, p: LossCollapseParams) -> float | None:
        """The median of the block medians when every block is in and they agree, else None."""
        m = self.medians
        if len(m) < (m.maxlen or 0):
            return None
        low, high = min(m), max(m)
        if low <= 0.0 or low < p.settled * high:
            return None
        return median(m)

    def acknowledge(self) -> bool:
        """A person acknowledged the alert: the level now is the normal; the settled level is learned afresh."""
        if self.held is None:
            return False
        self.held = self.level = None
        self.medians.clear()
        self.block = []
        return True
