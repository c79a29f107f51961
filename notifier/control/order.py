"""Which requests take effect at a step boundary, and in which order: `CommandOrder`, pure (no threads, no clock, no
MindSpore), with the `Request` it orders and the `Outcome` it decides. JobControl (notifier/control/job.py) carries
the decisions out."""

from __future__ import annotations

import bisect
import dataclasses
from typing import Any


class Request:
    """One action asked for: by a chat command (`command_id` cN), a rule's `actions:`, or code."""

    __slots__ = ("action", "params", "source", "command_id", "at_step", "key")

    def __init__(self, action: str, params: dict[str, Any], source: str, command_id: str | None = None,
                 at_step: int | None = None) -> None:
        self.action, self.params, self.source = action, params, source
        self.command_id, self.at_step = command_id, at_step
        self.key = (0, 0)  # its place in the acceptance order, given by CommandOrder.offer

    @property
    def name(self) -> str:
        """How answers name it: `pause c17`, or `pause (code)`."""
        return f"{self.action} {self.command_id}" if self.command_id else f"{self.action} ({self.source})"

    def due(self, step: int) -> bool:
        return self.at_step is None or step >= self.at_step


def acceptance_order(command_id: str | None) -> int | None:
    """The bot's acceptance order of a chat command: N of its id `cN`, the sequence number of its row in
    the bot's commands table (the job's poll cursor counts the same numbers); None for any other id."""
    if (command_id and len(command_id) <= 19 and command_id[:1] == "c" and command_id[1:].isascii()
            and command_id[1:].isdigit()):
        return int(command_id[1:])
    return None


@dataclasses.dataclass(frozen=True, slots=True)
class Outcome:
    """One thing a rank does at a step boundary, as CommandOrder decided it: "run" (carry out
    `req.action`), "pause" (start the pause `req`), "resume" (end the pause in effect; `req` says by
    whom: a resume, code, the pause's timeout, a stop) or "skip" (answer `req` without applying it).
    `detail` is the answer."""

    kind: str
    req: Request
    detail: str = ""


class CommandOrder:
    """Which requests take effect at a step boundary, and in which order. Pure: no threads, no clock
    (`now` is passed in), no MindSpore; JobControl carries the decisions out.

    Chat commands are ordered by the bot's acceptance order (`acceptance_order`); a request made in the
    job (code, a rule's `actions:`) comes after every command seen so far. Then:

    - a command applies at the first boundary at or after its apply step, and never before an earlier
      one (the first pending command not yet due holds the later ones back); a request made in the job
      has no apply step: it applies at the next boundary;
    - a pause falling due is cancelled when a resume accepted after it is already known;
    - while paused, a resume or a stop accepted after the pause acts at once, at the paused step (a stop
      releases the pause, then stops); the resume also cancels pauses accepted before it still waiting;
      a request due at the paused step still applies (a checkpoint while paused); a pause ends by itself
      at its timeout;
    - after a stop nothing more applies: what is pending, and whatever comes later, is answered;
    - a command id is taken once (delivery is at-least-once, from two threads).

    Every request is answered exactly once, applied or skipped with the reason, whatever the order and
    the number of its deliveries (tests/notifier/test_command_order.py checks this with hypothesis)."""

    def __init__(self, pause_timeout: float | None = None, remember: int = 10_000) -> None:
        self.pause_timeout = pause_timeout
        self.pending: list[Request] = []  # in acceptance order
        self._seen: dict[str, None] = {}  # command ids taken, oldest first (bounded)
        self._remember = remember
        self._newest = 0  # the highest acceptance order seen
        self._made = 0  # requests made in the job so far
        self._resumed: Request | None = None  # the newest resume decided
        self._cancelled: dict[tuple[int, int], list[str]] = {}  # a pending resume -> the pauses it cancelled
        self.paused: Request | None = None  # the pause in effect
        self.paused_step = 0
        self.paused_since = 0.0
        self.until: float | None = None  # when the pause in effect ends by itself
        self.stopped: Request | None = None
        self.stopped_step = 0

    def offer(self, req: Request) -> bool:
        """Take a request; False for a command id already taken."""
        cid = req.command_id
        if cid is not None:
            if cid in self._seen:
                return False
            self._seen[cid] = None
            if len(self._seen) > self._remember:
                del self._seen[next(iter(self._seen))]
        seq = acceptance_order(cid)
        if seq is not None:
            req.key = (seq, 0)
            self._newest = max(self._newest, seq)
        else:
            self._made += 1
            req.key = (self._newest, self._made)
        bisect.insort(self.pending, req, key=lambda r: r.key)
        return True

    def decide(self, step: int, now: float) -> list[Outcome]:
        """Everything to do at this step boundary, in order. While paused, call it again whenever a request
        arrives or `until` passes (the step stays, `now` moves on)."""
        out: list[Outcome] = []
        while True:
            more = self._next(step, now)
            if not more:
                return out
            out += more

    def _next(self, step: int, now: float) -> list[Outcome]:
        if self.stopped is not None:
            taken, self.pending = self.pending, []
            self._cancelled.clear()
            why = f"not applied: the job stopped at step {self.stopped_step} ({self.stopped.name})"
            return [Outcome("skip", r, why) for r in taken]
        if self.paused is not None:
            return self._while_paused(step, now)
        head = self._take_due(step)
        if head is None:
            return []
        if head.action == "pause":
            later = next((r for r in self.pending if r.action == "resume"), None)
            if later is not None:
                self._cancelled.setdefault(later.key, []).append(head.name)
                return [Outcome("skip", head, _cancelled_by(later))]
            if self._resumed is not None and head.key < self._resumed.key:  # reached this rank after it
                return [Outcome("skip", head, _cancelled_by(self._resumed))]
            return [self._enter(head, step, now)]
        if head.action == "resume":
            self._resumed = head
            gone = self._cancelled.pop(head.key, None)
            why = f" (it cancelled {', '.join(gone)} before that applied)" if gone else ""
            return [Outcome("skip", head, "the job was not paused: nothing to resume" + why)]
        if head.action == "stop":
            self.stopped, self.stopped_step = head, step
        return [Outcome("run", head)]

    def _while_paused(self, step: int, now: float) -> list[Outcome]:
        pause = self.paused
        assert pause is not None
        if self.until is not None and now >= self.until:
            return [self._leave(Request("resume", {}, f"its {self.until - self.paused_since:.0f} s timeout"), now)]
        for r in self.pending:
            if r.action in ("resume", "stop") and r.key > pause.key:
                self.pending.remove(r)
                if r.action == "stop":
                    self.stopped, self.stopped_step = r, step
                    return [self._leave(Request("resume", {}, r.name), now), Outcome("run", r)]
                moot = [q for q in self.pending if q.action == "pause" and q.key < r.key]
                for q in moot:
                    self.pending.remove(q)
                self._resumed = r
                self._cancelled.pop(r.key, None)
                return [*(Outcome("skip", q, _cancelled_by(r)) for q in moot), self._leave(r, now)]
        head = self._take_due(step)
        if head is None:
            return []
        if head.action == "pause":
            return [Outcome("skip", head, f"already paused at step {self.paused_step} ({pause.name})")]
        if head.action == "resume":
            return [Outcome("skip", head, f"not applied: it was accepted before {pause.name}, the pause in effect")]
        return [Outcome("run", head)]  # at the paused step: the weights are as consistent as at any boundary

    def _take_due(self, step: int) -> Request | None:
        """The next request to apply at `step`, taken off the queue: the first pending one if due; past a
        command not yet due, only a request made in the job."""
        held = False
        for i, r in enumerate(self.pending):
            if r.at_step is None or (not held and r.due(step)):
                return self.pending.pop(i)
            held = True
        return None

    def _enter(self, req: Request, step: int, now: float) -> Outcome:
        limit = req.params.get("timeout")
        if limit is None:
            limit = self.pause_timeout
        try:
            limit = None if limit is None else float(limit)
        except (TypeError, ValueError):
            return Outcome("skip", req, f"not applied: a pause's timeout is a number of seconds, not {limit!r}")
        self.paused, self.paused_step, self.paused_since = req, step, now
        self.until = None if limit is None else now + limit
        how = f"; resumes by itself after {limit:.0f} s" if limit is not None else "; waiting for resume"
        return Outcome("pause", req, f"paused at step {step}{how}")

    def _leave(self, by: Request, now: float) -> Outcome:
        detail = f"resumed at step {self.paused_step} after {now - self.paused_since:.1f} s paused"
        self.paused = self.until = None
        return Outcome("resume", by, detail)


def _cancelled_by(later: Request) -> str:
    return f"not applied: {later.name}, accepted after it, cancels it"


__all__ = ["CommandOrder", "Outcome", "Request", "acceptance_order"]
