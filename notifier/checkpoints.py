"""Health checkpoints and the rewind budget: the two state machines of a rewind, pure code.

`Ring` keeps the last N checkpoints a job wrote on its own (every K steps, or every M minutes) and marks
each one by what the rules said about its step:

- a checkpoint starts *pending*: the rules may not have seen the trouble yet (a grad norm leads the loss by
  tens of steps), so it is trusted only once `confirm_steps` steps passed after it without an alert;
- a checkpoint saved while an alert of the marking severity is firing is *unhealthy* at once;
- an alert at step A makes every checkpoint from step A - `suspect_steps` on *unhealthy*, pending or not;
- an alert at step A makes a checkpoint written fewer than `confirm_steps` steps before it, but more than
  `suspect_steps`, *doubted*: it is never confirmed healthy (an alert came in its confirm window), yet it is older
  than that alert's suspects, so a rewind before the alert may load it;
- a rewind to step C drops every checkpoint after C: they belong to the abandoned attempt.

`choose` picks the checkpoint a rewind loads (the newest healthy one at or before a step; before an alert, the
newest healthy, pending or doubted one at least suspect_steps + 1 steps before it) or says why there is none. Eviction
keeps the `keep` newest and never the newest healthy one: a long stretch of unhealthy checkpoints cannot push
out the last good one.

`RewindBudget` bounds rewinds per run (how many, how often, counted in steps trained so that every rank of
a data-parallel run decides the same); an automatic rewind over the budget is refused and escalated instead.

No clock of its own (`now` is passed in), no I/O, no MindSpore; JobControl (notifier/control/) carries the
decisions out. tests/notifier/test_checkpoints.py checks the tables and the invariants with hypothesis.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable
from typing import Any


class Health(str, enum.Enum):
    PENDING = "pending"
    HEALTHY = "healthy"
    DOUBTED = "doubted"  # an alert came in its confirm window, but not within suspect_steps after it
    UNHEALTHY = "unhealthy"


class Mark(str, enum.Enum):
    """What can happen to a checkpoint's health."""

    CONFIRM = "confirm"  # confirm_steps passed after it without an alert
    ALERT = "alert"  # an alert at or within suspect_steps after its step
    LATE_ALERT = "late_alert"  # an alert more than suspect_steps but fewer than confirm_steps after its step


# (health, mark) -> health. Unhealthy is final: a checkpoint the rules once suspected is never loaded by itself.
# Doubted is never confirmed: "healthy" means confirm_steps passed after it without an alert (docs/rewind.md); a
# healthy one learns of a late alert only from a rewind naming an older alert step (JobControl._mark_ring).
TRANSITIONS: dict[tuple[Health, Mark], Health] = {
    (Health.PENDING, Mark.CONFIRM): Health.HEALTHY,
    (Health.PENDING, Mark.ALERT): Health.UNHEALTHY,
    (Health.PENDING, Mark.LATE_ALERT): Health.DOUBTED,
    (Health.HEALTHY, Mark.CONFIRM): Health.HEALTHY,
    (Health.HEALTHY, Mark.ALERT): Health.UNHEALTHY,
    (Health.HEALTHY, Mark.LATE_ALERT): Health.DOUBTED,
    (Health.DOUBTED, Mark.CONFIRM): Health.DOUBTED,
    (Health.DOUBTED, Mark.ALERT): Health.UNHEALTHY,
    (Health.DOUBTED, Mark.LATE_ALERT): Health.DOUBTED,
    (Health.UNHEALTHY, Mark.CONFIRM): Health.UNHEALTHY,
    (Health.UNHEALTHY, Mark.ALERT): Health.UNHEALTHY,
    (Health.UNHEALTHY, Mark.LATE_ALERT): Health.UNHEALTHY,
}


def _curve(value: Any) -> tuple[str, float | None, float | None] | None:
    """A stored curve back as (text, mean, noise); None for anything else (an older ring's state has none)."""
    if not isinstance(value, (list, tuple)) or len(value) != 3 or not isinstance(value[0], str):
        return None
    mean, noise = (float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None for v in value[1:])
    return value[0], mean, noise


@dataclasses.dataclass
class Entry:
    """One checkpoint of the ring: its step, when it was written, where, the data position at that step (batches
    read so far: what a rewind seeks back to before skipping), the run's attempt it was written in, its health
    and why."""

    step: int
    time: float
    path: str
    data: int | None
    attempt: int
    health: Health = Health.PENDING
    why: str = "saved; confirmed healthy once no alert came for a while"
    # the pre-fault loss curve when it was written: (text, mean, noise) of the last samples (a rewind's follow-up
    # compares with it; the samples the monitor keeps may no longer reach back to the checkpoint's step)
    curve: tuple[str, float | None, float | None] | None = None

    def mark(self, m: Mark, why: str) -> bool:
        """Apply `m`; whether the health changed."""
        new = TRANSITIONS[(self.health, m)]
        if new is self.health:
            return False
        self.health, self.why = new, why
        return True

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "time": self.time, "path": self.path, "data": self.data,
                "attempt": self.attempt, "health": self.health.value, "why": self.why,
                "curve": None if self.curve is None else list(self.curve)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Entry:
        return cls(step=int(d["step"]), time=float(d["time"]), path=str(d["path"]),
                   data=None if d.get("data") is None else int(d["data"]), attempt=int(d.get("attempt", 0)),
                   health=Health(d["health"]), why=str(d.get("why", "")), curve=_curve(d.get("curve")))


_EXPLAINED = (Health.UNHEALTHY, Health.DOUBTED)  # marks whose reason status shows


@dataclasses.dataclass(frozen=True)
class RingPolicy:
    keep: int = 5  # checkpoints kept (plus the newest healthy one when it is older than all of them)
    every_steps: int | None = None  # save at every step that is a multiple of it
    every_seconds: float | None = None  # ... or when this long passed since the last save (or the start)
    confirm_steps: int = 50  # steps after a checkpoint without an alert before it is healthy
    suspect_steps: int = 20  # an alert at step A makes checkpoints from A - suspect_steps on unhealthy


class Ring:
    """The job's health checkpoints, oldest first. See the module's docstring."""

    def __init__(self, policy: RingPolicy, start: float = 0.0) -> None:
        self.policy = policy
        self.entries: list[Entry] = []
        self._last_save = start  # the time of the last save (the start before the first)

    # -- when to save -------------------------------------------------------------------------------

    def due(self, step: int, now: float) -> bool:
        """Whether a checkpoint is due at this step boundary (never twice for one step of one attempt)."""
        p = self.policy
        if self.entries and self.entries[-1].step >= step:
            return False
        if p.every_steps is not None and step % p.every_steps == 0:
            return True
        return p.every_seconds is not None and now - self._last_save >= p.every_seconds

    def saved(self, step: int, now: float, path: str, data: int | None, attempt: int,
              firing: str | None = None, curve: tuple[str, float | None, float | None] | None = None) -> list[Entry]:
        """Record a checkpoint written at `step`; `firing` names an alert of the marking severity firing now (it
        is then unhealthy at once); `curve` the loss curve up to it. Returns the entries evicted (their files are
        the caller's to delete)."""
        self._last_save = now
        e = Entry(step, now, path, data, attempt, curve=curve)
        if firing:
            e.mark(Mark.ALERT, f"saved while {firing} was firing")
        self.entries = [x for x in self.entries if x.step < step]  # (a step saved again replaces it)
        self.entries.append(e)
        return self._evict()

    def _evict(self) -> list[Entry]:
        keep = self.policy.keep
        if len(self.entries) <= keep:
            return []
        newest_good = self.newest(Health.HEALTHY)
        kept = self.entries[-keep:]
        if newest_good is not None and newest_good not in kept:
            kept = [newest_good, *kept]
        gone = [e for e in self.entries if e not in kept]
        self.entries = kept
        return gone

    # -- what the rules say -------------------------------------------------------------------------

    def advance(self, step: int) -> list[Entry]:
        """At step boundary `step`: pending checkpoints `confirm_steps` old are healthy. Those confirmed now."""
        out = []
        for e in self.entries:
            if step - e.step >= self.policy.confirm_steps and e.mark(
                    Mark.CONFIRM, f"no alert in the {step - e.step} steps after it"):
                out.append(e)
        return out

    def alert(self, step: int, why: str) -> list[Entry]:
        """An alert of the marking severity at `step`: checkpoints from step - suspect_steps on are unhealthy,
        those fewer than confirm_steps steps before it and older are doubted. Those marked now."""
        p = self.policy
        since = step - p.suspect_steps
        out = []
        for e in self.entries:
            if e.step >= since:
                changed = e.mark(Mark.ALERT, why)
            elif step - e.step < p.confirm_steps:
                changed = e.mark(Mark.LATE_ALERT, f"{why}, {step - e.step} steps after it (within confirm_steps "
                                                  f"{p.confirm_steps}, past suspect_steps {p.suspect_steps})")
            else:
                changed = False
            if changed:
                out.append(e)
        return out

    # -- rewinding ----------------------------------------------------------------------------------

    def newest(self, health: Health, at_most: int | None = None) -> Entry | None:
        for e in reversed(self.entries):
            if e.health is health and (at_most is None or e.step <= at_most):
                return e
        return None

    def choose(self, to: int | None = None, before: int | None = None) -> Entry | str:
        """The checkpoint a rewind loads: the newest healthy one at or before `to`, or before the alert step
        `before` less suspect_steps (both: the earlier bound), or the newest healthy one at all. A text saying why
        there is none otherwise."""
        bounds = []
        if to is not None:
            bounds.append(to)
        if before is not None:
            bounds.append(before - self.policy.suspect_steps - 1)
        limit = min(bounds) if bounds else None
        found = self.newest(Health.HEALTHY, limit)
        if before is not None:  # before an alert: a pending or doubted one older than the alert's suspects counts
            for health in (Health.PENDING, Health.DOUBTED):
                other = self.newest(health, limit)
                if other is not None and (found is None or other.step > found.step):
                    found = other
        if found is not None:
            return found
        where = "" if limit is None else f" at or before step {limit}"
        if to is not None and before is None:
            where = f" at or before step {to}"
        elif before is not None:
            where = f" at least {self.policy.suspect_steps + 1} steps before the alert at step {before}"
        return f"no healthy checkpoint{where}; the ring holds {self.describe() or 'none'}"

    def rewound(self, to_step: int) -> list[Entry]:
        """After a rewind to `to_step`: the checkpoints after it belong to the abandoned attempt and go (returned,
        for their files to be deleted); the clock of `every_seconds` starts again."""
        gone = [e for e in self.entries if e.step > to_step]
        self.entries = [e for e in self.entries if e.step <= to_step]
        return gone

    def restart_clock(self, now: float) -> None:
        self._last_save = now

    # -- reading ------------------------------------------------------------------------------------

    def describe(self, entries: Iterable[Entry] | None = None) -> str:
        """`500 healthy, 1000 healthy, 1500 unhealthy (loss_spike ERROR at step 1510)`: what status shows."""
        return ", ".join(f"{e.step} {e.health.value}" + (f" ({e.why})" if e.health in _EXPLAINED else "")
                         for e in (self.entries if entries is None else entries))

    def state_dict(self) -> dict[str, Any]:
        return {"entries": [e.to_dict() for e in self.entries], "last_save": self._last_save}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.entries = [Entry.from_dict(d) for d in state["entries"]]
        self._last_save = float(state.get("last_save", self._last_save))


# -- the rewind budget -------------------------------------------------------------------------------------


class Spend(str, enum.Enum):
    """What the budget says to a rewind."""

    GO = "go"  # within the budget
    OVER = "over"  # a person's rewind over the budget: it goes, counted, and the answer says so
    REFUSE = "refuse"  # a rule's rewind over the budget: refused, escalated instead


# (over the budget, asked by a person) -> what happens
BUDGET_TABLE: dict[tuple[bool, bool], Spend] = {
    (False, False): Spend.GO,
    (False, True): Spend.GO,
    (True, False): Spend.REFUSE,
    (True, True): Spend.OVER,
}


@dataclasses.dataclass(frozen=True)
class BudgetPolicy:
    max_rewinds: int = 3  # per run (per process: a restarted job starts a new budget)
    min_steps_between: int = 200  # steps trained (redone ones included) between two rewinds


class RewindBudget:
    """How many rewinds a run may still make, and how soon. Counted in steps trained (a counter that only grows,
    redone steps included), not in seconds: every rank of a data-parallel run trains the same steps, so every rank
    decides the same without talking to the others."""

    def __init__(self, policy: BudgetPolicy) -> None:
        self.policy = policy
        self.spent: list[int] = []  # the trained-step counter at each rewind

    def over(self, trained: int) -> str | None:
        """Why a rewind now would be over the budget (None: within it)."""
        p = self.policy
        if len(self.spent) >= p.max_rewinds:
            return f"the run made its {p.max_rewinds} rewinds (rewind.max_rewinds)"
        if self.spent and trained - self.spent[-1] < p.min_steps_between:
            return (f"the last rewind was {trained - self.spent[-1]} steps ago, fewer than "
                    f"rewind.min_steps_between ({p.min_steps_between})")
        return None

    def decide(self, trained: int, by_person: bool) -> tuple[Spend, str | None]:
        why = self.over(trained)
        return BUDGET_TABLE[(why is not None, by_person)], why

    def spend(self, trained: int) -> None:
        self.spent.append(trained)

    def left(self) -> int:
        return max(self.policy.max_rewinds - len(self.spent), 0)

    def state_dict(self) -> dict[str, Any]:
        return {"spent": list(self.spent)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.spent = [int(x) for x in state["spent"]]


__all__ = ["BUDGET_TABLE", "TRANSITIONS", "BudgetPolicy", "Entry", "Health", "Mark", "RewindBudget", "Ring",
           "RingPolicy", "Spend"]
