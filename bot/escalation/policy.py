"""The escalation state machine, pure: given an escalation's stored state, what its alert is doing now
and the time, which steps are due and what the escalation becomes.

No SQLite, no scheduler, no clock of its own (bot/escalation/scheduler.py is the edge). A policy is
ordered levels (`after` seconds into the alert, who to tell), the chain run `1 + repeat` times, a round
starting every `repeat_every` seconds. Steps are numbered flat: step n is level n % L of round n // L,
due at `started_at + shift + (n // L) * repeat_every + levels[n % L].after`. The state keeps the
number of the next step to take, so a step is taken exactly once whatever the restarts in between
(the edge writes the new state in the transaction that queues the step's messages).

- acknowledged (button, `ack`, email link): closed as `acked`, no step after it;
- resolved (no device firing any more): closed as `resolved`;
- silenced: paused; the time spent paused is added to `shift` when the silence ends, so the chain
  resumes where it stopped instead of firing every level it slept through;
- a step overdue (the bot was down) is taken late, once, with the others overdue, in order.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from bot.config import EscalationPolicy

State = Literal["active", "acked", "resolved"]


@dataclasses.dataclass(frozen=True)
class Escalation:
    """One escalation as the store keeps it: one per alert group (run, rule) and episode."""

    id: int
    run_id: str
    rule: str
    policy: str
    started_at: float
    next_step: int = 0
    state: State = "active"
    paused_at: float | None = None  # when a silence paused it (None: running)
    shift: float = 0.0  # seconds spent paused so far: later steps are this much later


@dataclasses.dataclass(frozen=True)
class AlertNow:
    """What the escalation's alerts are doing now: firing at all, every firing one acknowledged (and
    by whom), a silence matching them."""

    firing: bool
    acked_by: str | None = None
    silenced: bool = False


@dataclasses.dataclass(frozen=True)
class Step:
    number: int  # flat index: round * levels + level
    round: int
    level: int
    due_at: float


@dataclasses.dataclass(frozen=True)
class Decision:
    """The steps to take now (in order), the escalation's new state, and when to look again (None:
    only when its alert changes)."""

    steps: tuple[Step, ...]
    escalation: Escalation
    next_at: float | None

    @property
    def changed(self) -> bool:
        return bool(self.steps) or self.escalation.state != "active"


def step_at(policy: EscalationPolicy, esc: Escalation, n: int) -> Step | None:
    """Step `n` of `esc`'s chain, or None past its last round."""
    per = len(policy.levels)
    if per == 0 or n >= per * (1 + policy.repeat):
        return None
    rnd, lvl = divmod(n, per)
    return Step(n, rnd, lvl, esc.started_at + esc.shift + rnd * policy.repeat_every + policy.levels[lvl].after)


def decide(esc: Escalation, policy: EscalationPolicy, alert: AlertNow, now: float) -> Decision:
    """What is due for `esc` at `now`, given its alert."""
    if esc.state != "active":
        return Decision((), esc, None)
    if not alert.firing:
        return Decision((), dataclasses.replace(esc, state="resolved"), None)
    if alert.acked_by is not None:
        return Decision((), dataclasses.replace(esc, state="acked"), None)
    if alert.silenced:
        paused = esc if esc.paused_at is not None else dataclasses.replace(esc, paused_at=now)
        return Decision((), paused, None)
    if esc.paused_at is not None:
        esc = dataclasses.replace(esc, paused_at=None, shift=esc.shift + max(now - esc.paused_at, 0.0))
    steps = []
    n = esc.next_step
    while (step := step_at(policy, esc, n)) is not None and step.due_at <= now:
        steps.append(step)
        n += 1
    esc = dataclasses.replace(esc, next_step=n)
    nxt = step_at(policy, esc, n)
    return Decision(tuple(steps), esc, None if nxt is None else nxt.due_at)
