"""Gradient accumulation read from the log itself: how many rows make one optimizer step. Pure, no I/O.

A log written per micro-step (MindFormers under gradient accumulation) repeats the optimizer step's LR and grad
norm on each of its k rows, while the loss is each micro-batch's own. `Infer` watches the first rows a Monitor is
given: rows with consecutive step numbers whose (LR, grad norm) pair holds for runs of exactly k rows, `RUNS` runs
in a row, are micro-steps of one optimizer step each (k >= 2). Anything else (the pair changes on every row, rows
that skip steps, an LR or grad norm missing, `LIMIT` rows without an answer, a NaN or Inf) is one row per
optimizer step. A row skipped by dynamic loss scaling (its grad norm Inf or NaN) says nothing and cuts the run it
is in. `training.grad_accumulation_steps` in the config (or MindFormers' `runner_config.gradient_accumulation_steps`)
skips the inference.
"""

from __future__ import annotations

from typing import ClassVar


class Infer:
    """Fed (step, lr, grad norm) of each row until `answer` is set: (k, end), k rows per optimizer step whose last
    row has step % k == end (k 1: no accumulation, end 0)."""

    __slots__ = ("prev_step", "key", "run", "runs", "rows", "answer", "end", "partial", "skipped")

    RUNS: ClassVar[int] = 3  # complete runs of the same length: accumulation
    LIMIT: ClassVar[int] = 96  # rows without an answer: none
    MAX_K: ClassVar[int] = 32  # longer runs of one pair are a constant LR with a constant (clipped) grad norm

    def __init__(self) -> None:
        self.prev_step: int | None = None
        self.key: tuple[float, float] | None = None
        self.run = 0  # rows of the current run of one (lr, grad norm) pair
        self.runs: list[int] = []  # lengths of the complete runs seen
        self.rows = 0
        self.answer: tuple[int, int] | None = None
        self.end = 0  # step of the last row of the last complete run
        self.skipped = 0  # rows skipped (see skip)
        self.partial = True  # the current run may have begun before the rows seen (the log's first, after a skip)

    def feed(self, step: int, lr: float | None, grad_norm: float | None) -> tuple[int, int] | None:
        """The answer once there is one (then it stays)."""
        if self.answer is not None:
            return self.answer
        self.rows += 1
        if (lr is None or grad_norm is None or lr - lr != 0.0 or grad_norm - grad_norm != 0.0
                or (self.prev_step is not None and step != self.prev_step + 1) or self.rows > self.LIMIT):
            return self._done(1)
        self.prev_step = step
        key = (lr, grad_norm)
        if key == self.key:
            self.run += 1
            if self.run > self.MAX_K:
                return self._done(1)
            return None
        if self.key is not None:
            if self.partial:  # its length is not known: not counted
                self.partial = False
            else:
                self.runs.append(self.run)
                self.end = step - 1
            done = self.runs
            if len(done) >= self.RUNS:
                k = done[-1]
                if all(r == k for r in done[-self.RUNS:]):
                    return self._done(k)
                if len(done) >= 2 * self.RUNS:
                    return self._done(1)
        self.key, self.run = key, 1
        return None

    def skip(self, step: int) -> tuple[int, int] | None:
        """A row that says nothing (a step skipped by dynamic loss scaling: its grad norm Inf or NaN): the run in
        progress is cut there and not counted; the rows go on. 2 x LIMIT rows without an answer: none (a run that
        overflows from its first step on must not be held back from the rules)."""
        if self.answer is not None:
            return self.answer
        self.skipped += 1
        if self.skipped > 2 * self.LIMIT:
            return self.settle()
        self.prev_step, self.key, self.run, self.partial = step, None, 0, True
        return None

    def settle(self) -> tuple[int, int]:
        """Answer now with what the rows so far show (a NaN or Inf came: the rules must judge it at once): the
        length of the complete runs when at least one is complete and all agree, else 1."""
        if self.answer is not None:
            return self.answer
        done = self.runs
        return self._done(done[-1] if done and all(r == done[-1] for r in done) else 1)

    def _done(self, k: int) -> tuple[int, int]:
        self.answer = (k, self.end % k if k > 1 else 0)
        return self.answer
