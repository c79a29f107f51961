"""Job actions applied at a step boundary: save_checkpoint, pause/resume, scale_lr, rewind, clip_grad, the threshold
actions, acknowledge, stop; and the health checkpoints a rewind loads (notifier/checkpoints.py).

Requests may come from any thread (a rule's `actions:`, code, the bot's chat commands); they queue
here and run on the training thread between two steps, the only place where the weights are
consistent and a checkpoint is meaningful. `CommandOrder` (pure) decides what applies when, in the
order the bot accepted the commands; `JobControl` carries it out.

Framework-neutral: what touches the weights or the optimizer (a checkpoint, the LR, the framework's
own stop) is a `Backend`'s (notifier/mindspore/backend.py for MindSpore). Without one, a custom loop
still gets pause, resume and the threshold commands; the others answer that they need a backend.
The actions themselves are those of msmon/contract/actions.py; `HANDLERS` maps each one to its handler here and is
checked against that table at import (pause and resume are CommandOrder's own).
"""

from __future__ import annotations

import bisect
import dataclasses
import inspect
import json
import logging
import math
import os
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol, cast

from msmon.common.safenames import slug
from msmon.contract.actions import ACTIONS, ParamError, check_param
from msmon.contract.wire import ActionRequest, ActionResult, Command, Event, RingCheckpoint, Severity, Status

from .checkpoints import BudgetPolicy, Entry, RewindBudget, Ring, RingPolicy, Spend
from .monitor import Monitor

log = logging.getLogger("msmon")


class ActionError(RuntimeError):
    """A job action that cannot be carried out; the message says why and what to do."""


class Backend(Protocol):
    """What JobControl asks of a training framework: the actions that touch its weights or optimizer.
    Called on the training thread, at a step boundary; raise ActionError to say what stands in the way."""

    def save_checkpoint(self, step: int, name: str) -> str:
        """Write a checkpoint of the weights at `step`; `name` is a file-safe stem naming the run, the
        device and the step (`run-42-device0-step500`). Returns the path written."""
        ...

    def scale_lr(self, factor: float) -> str:
        """Multiply the learning rate by `factor`; returns what changed, e.g. `lr 0.001 -> 0.0005`."""
        ...

    def stop(self, run_context: Any) -> None:
        """Ask the framework to end training after this step (`run_context`: what `apply` was given)."""
        ...


class RewindBackend(Backend, Protocol):
    """What a rewind and clip-grad need besides: a backend with these methods gets health checkpoints, `rewind` and
    `clip_grad` (notifier/mindspore/backend.py; examples/custom_loop.py's LoopBackend for a custom loop). Called on
    the training thread at a step boundary; raise ActionError to refuse.

    A rewind runs `read_checkpoint` (which must change nothing: parse and check the file against the model), then
    `seek_data` (if the data moves), then `restore` (which must not fail once read_checkpoint passed: if it does,
    the job stops rather than train on half-loaded weights). Two optional methods: `check_seek(position,
    run_context)` raises ActionError when `seek_data(position)` could not be honoured (past the data's end, sink
    mode), before anything moves; `agree(value, refused) -> (every rank holds value, the ranks that refused)` is one
    collective every rank of a multi-rank run calls at the rewind's step boundary, so all load or none does
    (MindSporeBackend has both)."""

    def save_checkpoint(self, step: int, name: str, directory: str | None = None) -> str:
        """As Backend's; `directory`: where (a health checkpoint's ring folder), None: the backend's own."""
        ...

    def read_checkpoint(self, path: str) -> Any:
        """Read and check the checkpoint at `path` without changing anything; what `restore` takes."""
        ...

    def restore(self, loaded: Any) -> str:
        """Put what read_checkpoint read into the model, the optimizer and the loss scale; says what it restored."""
        ...

    def data_position(self, run_context: Any) -> int | None:
        """Batches the training has read so far (None: not known)."""
        ...

    def seek_data(self, position: int, run_context: Any) -> str:
        """Make the next batch read the one at `position` (what data_position counts)."""
        ...

    def delete_checkpoint(self, path: str) -> None:
        """Remove a checkpoint the ring let go."""
        ...

    def clip_grad(self, max_norm: float) -> str:
        """Clip the global grad norm to `max_norm` from the next step on (0: no clipping); says what changed."""
        ...


class Moot(Exception):  # noqa: N818 - not an error: the answer of an action that has nothing left to do
    """An action answered without being applied (a rewind asked in an attempt already rewound)."""


@dataclasses.dataclass
class RewindReport:
    """A rewind's follow-up: at step `at` the job reports the loss against the pre-fault curve."""

    at: int
    source: str
    command_id: str | None
    before: str  # the pre-fault curve, e.g. "0.301 +- 0.012 over steps 880-1000"
    mean: float | None
    noise: float | None
    diverged: float | None  # the loss when the rewind was asked
    params: dict[str, Any]


@dataclasses.dataclass
class _RewindPlan:
    """What one rank would do for a rewind, checked and changing nothing yet (JobControl._rewind_plan)."""

    entry: Entry
    loaded: Any  # the checkpoint's contents, read and checked (RewindBackend.read_checkpoint)
    pos_now: int | None
    target: int | None  # the data position to move to (None: the data does not move)
    spend: Spend
    why: str | None  # why the rewind is over the budget, if it is


_REFUSED, _MOOT = -1, -2  # a rank's rewind verdict when it loads nothing (else the step it would load)


def _disagreement(rank: int | None, verdict: int, why: str, refused: list[int]) -> str:
    """The answer of a rewind the ranks did not all agree to: which ranks refused, and this rank's own reason (each
    rank's answer carries its own: the bot's report lists them all)."""
    me = f"rank {rank}" if rank is not None else "this rank"
    others = [r for r in refused if r != rank]
    names = f"rank{'s' if len(others) > 1 else ''} {', '.join(str(r) for r in others)}"
    if verdict == _REFUSED:
        reason = why.removeprefix("not rewound: ")
        for tail in ("; nothing was changed", ". Nothing was changed; training goes on"):
            reason = reason.removesuffix(tail)
        head = f"not rewound: {me} refused: {reason}" + (f"; {names} refused too" if others else "")
    elif others:
        head = (f"not rewound: {names} refused (see {'their' if len(others) > 1 else 'its'} answer); {me} could "
                "have loaded " + (f"step {verdict}" if verdict >= 0 else "nothing (moot)"))
    else:
        head = ("not rewound: the ranks would not all load the same checkpoint ("
                + (f"{me}: step {verdict}" if verdict >= 0 else f"{me}: moot, {why}") + ")")
    return f"{head}; nothing was changed on any rank, training goes on"


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


class JobControl:
    """Executes job actions for one training process. Thread-safe `request()`; `apply()` on the
    training thread at a step boundary. What applies when is CommandOrder's decision; the actions
    themselves (the pause's wait, the thresholds, `stop_requested`) are here, and the framework's part
    (checkpoint, LR, the framework's stop) is `backend`'s. With no backend, save_checkpoint and scale_lr
    fail saying so, and a stop sets `stop_requested` (for a custom loop to end on) but writes no checkpoint."""

    def __init__(
        self,
        monitor: Monitor,
        backend: Backend | None = None,
        pause_timeout: float | None = None,
        heartbeat_every: float = 30.0,
        on_result: Callable[[ActionResult], None] | None = None,
        on_paused: Callable[[int, float], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.monitor = monitor
        self.backend = backend
        self.heartbeat_every = heartbeat_every
        self.on_result = on_result
        self.on_paused = on_paused  # called while paused: (step, seconds paused), every heartbeat_every
        self.results: deque[ActionResult] = deque(maxlen=1000)
        self._order = CommandOrder(pause_timeout)
        self._cond = threading.Condition()  # guards _order; wakes a pause when a request arrives
        self._woken = False
        self._clock = clock
        self._beat_at = 0.0
        self._undo: dict[str, Any] = {}  # loosen_threshold's levels to restore, by token
        self.last_step = 0  # the last step boundary seen
        self.paused = False
        self.stop_requested = False
        self._req: Request | None = None  # the request a handler is carrying out
        # Health checkpoints and rewinds (monitor_config checkpoint_ring, rewind; docs/rewind.md)
        self.attempt = 0  # rewinds applied so far: the run's attempt, the same on every rank
        self.trained = 0  # step boundaries seen (redone steps included): what the rewind budget counts
        self.rewound_to: int | None = None  # set by a rewind: the step the training carries on from (a custom loop
        # sets its step counter to it; MonitorCallback renumbers MindSpore's steps)
        self.on_rewind: Callable[[int, int, Entry], None] | None = None  # (from step, to step, the checkpoint)
        self.ring: Ring | None = None
        self._ring_dir = ""
        self._report: RewindReport | None = None
        self._save_failures = 0
        self._last_alert: int | None = None  # the step of the newest alert that marked the ring (`before-alert`)
        cfg = monitor.config
        self.budget = RewindBudget(BudgetPolicy(cfg.rewind.max_rewinds, cfg.rewind.min_steps_between))
        self._unhealthy_on = Severity(cfg.checkpoint_ring.unhealthy_on)
        if cfg.checkpoint_ring.enable:
            self._start_ring()

    @property
    def pause_timeout(self) -> float | None:
        return self._order.pause_timeout

    @pause_timeout.setter
    def pause_timeout(self, value: float | None) -> None:
        self._order.pause_timeout = value

    # -- any thread --------------------------------------------------------------------------

    def request(self, action: str, source: str = "code", command_id: str | None = None, at_step: int | None = None,
                **params: Any) -> None:
        """Queue an action for the first step boundary at or after `at_step` (None: the next one), after
        every request accepted before it. A chat command's id makes it idempotent: a second delivery of
        the same id is ignored. A `resume` or `stop` reaches a paused job at once."""
        if action not in ACTIONS:
            raise ValueError(f"unknown action {action!r}; actions are {', '.join(ACTIONS)}")
        req = Request(action, params, source, command_id, at_step)
        with self._cond:
            if not self._order.offer(req):
                return
            # after a stop there is no step boundary left to answer at: answer now
            late = self._order.decide(self.last_step, self._clock()) if self._order.stopped is not None else []
            self._woken = True
            self._cond.notify_all()
        for o in late:
            self._carry_out(self.last_step, None, o)

    def listen(self) -> None:
        """Take the bot's chat commands, when the Monitor reports to a bot and `bot.commands` is on."""
        tr = self.monitor.transport
        if tr is not None and self.monitor.config.bot.commands:
            tr.listen(self.take_commands)

    def take_event(self, ev: Event) -> None:
        """Queue the configured actions an event carries (monitor_config `actions:`). In a multi-rank run they
        go to the bot instead, which has every rank apply them at the same step (a pause on this rank alone
        would leave the others blocked in the next collective); the Monitor refused to start without a bot."""
        mon = self.monitor
        tr, world = mon.transport, mon.world
        if (self.ring is not None and ev.status is Status.FIRING and ev.severity.rank >= self._unhealthy_on.rank
                and not ev.repeat):
            self._mark_ring(ev.step, f"{ev.rule} {ev.severity.value} at step {ev.step}")
        for act in ev.actions:
            params: dict[str, Any] = {k: v for k, v in act.items() if k != "action"}
            if act["action"] == "rewind":  # which alert, in which attempt: every rank decides the same from these
                params.update(before=ev.step, alert=ev.rule, attempt=self.attempt)
            if world.multi and tr is not None:
                tr.ask(ActionRequest(run_id=ev.run_id, device=ev.device, step=ev.step, time=ev.time, rule=ev.rule,
                                     severity=ev.severity, action=str(act["action"]), params=params, rank=world.rank,
                                     host=world.host))
                continue
            self.request(str(act["action"]), f"rule {ev.rule} {ev.severity.value}", **params)

    def take_commands(self, commands: list[Command]) -> None:
        """Chat commands from the bot (any thread): queued for their apply step, in acceptance order."""
        for c in commands:
            if c.run_id != self.monitor.run_id:  # the bot never sends these; a peer's answer is not trusted
                log.warning("msmon: run %s ignores command %s for another run (%s): not ours to apply",
                            self.monitor.run_id, c.id, c.run_id[:80])
                continue
            params = dict(c.params)
            if c.action == "loosen_threshold" and params.get("duration"):
                params["undo"] = c.id
            try:
                self.request(c.action, f"command {c.id} from {c.issued_by}", c.id, c.apply_step, **params)
            except ValueError as exc:  # an action this job does not know: say so, do not die
                self._result(self.last_step, Request(c.action, params, "command", c.id), False,
                             str(exc), None)

    @property
    def has_pending(self) -> bool:
        return bool(self._order.pending)

    # -- the training thread -------------------------------------------------------------------

    def apply(self, step: int, run_context: Any = None) -> list[ActionResult]:
        """Carry out what is due at this step boundary, in acceptance order; the rest waits for its step.
        A pause waits here, on the training thread, until a resume, a stop or its timeout (requests due
        meanwhile still apply). Never raises: a failed action is a result with ok=False."""
        done: list[ActionResult] = []
        self.last_step = step
        while True:
            with self._cond:
                self._woken = False
                todo = self._order.decide(step, self._clock())
            done += [self._carry_out(step, run_context, o) for o in todo]
            if self._order.paused is None:
                return done
            self._hold(step)

    def _hold(self, step: int) -> None:
        """Paused: wait for a request, the pause's timeout or the next "still paused" line."""
        with self._cond:
            until = self._order.until
            wake = self._beat_at if until is None else min(self._beat_at, until)
            if not self._woken:
                self._cond.wait(max(wake - self._clock(), 0.0))
        now = self._clock()
        if now < self._beat_at or self._woken or (until is not None and now >= until):
            return
        self._beat_at = now + self.heartbeat_every
        waited = now - self._order.paused_since
        log.info("[run %s step %d] still paused after %.0f s; `resume %s` (or `stop %s confirm`) in chat, or "
                 "resume() from code, lets it go on", self.monitor.run_id, step, waited, self.monitor.run_id,
                 self.monitor.run_id)
        if self.on_paused is not None:
            try:
                self.on_paused(step, waited)
            except Exception:  # noqa: BLE001 - a hook must not take training down
                log.exception("msmon: on_paused hook failed")

    def _carry_out(self, step: int, run_context: Any, o: Outcome) -> ActionResult:
        req, tr = o.req, self.monitor.transport
        if o.kind == "skip":
            return self._result(step, req, True, o.detail, None, planned=False, applied=False)
        if o.kind == "pause":
            self.paused = True
            self.monitor.hold_clock()  # time paused on purpose is no step time: no step_stall after it
            if tr is not None:
                tr.progress(step, paused=True)  # heartbeats now say "alive, paused"
            self._beat_at = self._clock() + self.heartbeat_every
            log.warning("[run %s step %d] %s (%s); heartbeats say paused, no step runs until a resume or a stop",
                        self.monitor.run_id, step, o.detail, req.source)
            return self._result(step, req, True, o.detail, None)
        if o.kind == "resume":
            self.paused = False
            self.monitor.release_clock()
            if tr is not None:
                tr.progress(step, paused=False)
            return self._result(step, req, True, o.detail, None, planned=False)
        handler = HANDLERS[req.action]
        try:  # the bounds the bot checked already, again here on every rank (any source: code, a rule, a command)
            for name, value in req.params.items():
                if ACTIONS[req.action].param(name) is not None:
                    check_param(req.action, name, value)
        except ParamError as exc:
            return self._result(step, req, False, f"not applied: {exc}; nothing was changed, training goes on", None)
        try:
            inspect.signature(handler).bind(self, step, run_context, **req.params)
        except TypeError as exc:  # parameters the handler does not take, or one missing (a hand-made command)
            return self._result(step, req, False, f"{req.action}: {exc}", None)
        self._req = req
        try:
            detail, path = handler(self, step, run_context, **req.params)
        except Moot as exc:
            return self._result(step, req, True, str(exc), None, applied=False)
        except Exception as exc:  # noqa: BLE001 - an action must not take training down
            return self._result(step, req, False, f"{type(exc).__name__}: {exc}", None)
        finally:
            self._req = None
        return self._result(step, req, True, detail, path)

    def _result(self, step: int, req: Request, ok: bool, detail: str, path: str | None,
                planned: bool = True, applied: bool = True) -> ActionResult:
        mon = self.monitor
        if planned and req.at_step is not None and step > req.at_step:
            detail += (f" (at step {step}, {step - req.at_step} after the planned step {req.at_step}: the command "
                       "reached this rank late)")
        params = {k: v for k, v in req.params.items() if k != "undo"}
        res = ActionResult(run_id=mon.run_id, device=mon.default_device, step=step, time=time.time(),
                           action=req.action, ok=ok, detail=detail, params=params, source=req.source,
                           path=path, command_id=req.command_id, applied=applied and ok,
                           paused=self.paused if req.action in ("pause", "resume") else None)
        self.results.append(res)
        where = f"[run {res.run_id} step {step} device {res.device}]"
        if ok:
            log.info("%s action %s (%s): %s", where, req.action, req.source, detail)
        else:
            log.error("%s action %s (%s) FAILED: %s. Training continues.", where, req.action, req.source, detail)
        if mon.transport is not None:
            mon.transport.action(res)
        if self.on_result is not None:
            try:
                self.on_result(res)
            except Exception:  # noqa: BLE001
                log.exception("msmon: on_result hook failed")
        return res

    def _do_save_checkpoint(self, step: int, run_context: Any) -> tuple[str, str]:
        return self.save_checkpoint(step)

    def save_checkpoint(self, step: int) -> tuple[str, str]:
        """Write the checkpoint of `step` through the backend: (what to answer, the path written)."""
        mon = self.monitor
        # job data names the file only as safe slugs (a run id `../x` stays a name); the backend keeps it in its folder
        path = self._need_backend("save a checkpoint").save_checkpoint(
            step, f"{slug(mon.run_id)}-device{slug(mon.default_device)}-step{step}")
        return f"checkpoint of step {step} written to {path}", path

    def _do_scale_lr(self, step: int, run_context: Any, factor: float) -> tuple[str, None]:
        detail = self._need_backend("scale the LR").scale_lr(float(factor))
        self.monitor.note_lr_change()
        return detail, None

    def _need_backend(self, what: str) -> Backend:
        if self.backend is None:
            raise ActionError(f"no backend to {what} with: this JobControl was made without one (pass "
                              "backend=, e.g. notifier.mindspore's MindSporeBackend, or your own)")
        return self.backend

    def _do_set_threshold(self, step: int, run_context: Any, rule: str, value: float,
                          level: str = "warning") -> tuple[str, None]:
        from .levels_effect import change_levels  # here: the three level actions are its only users

        old, effect = change_levels(self.monitor, step, rule,
                                    lambda: self.monitor.set_threshold(rule, float(value), level), "set_threshold")
        return f"{rule} {level} level {old} -> {float(value):g}; {effect}", None

    def _do_loosen_threshold(self, step: int, run_context: Any, rule: str, value: float | None = None,
                             factor: float | None = None, duration: float | None = None,
                             undo: str | None = None) -> tuple[str, None]:
        from .levels_effect import change_levels

        (desc, levels), effect = change_levels(self.monitor, step, rule,
                                               lambda: self.monitor.loosen(rule, value=value, factor=factor),
                                               "loosen_threshold")
        desc += f"; {effect}"
        if duration and undo:
            self._undo[undo] = levels
            timer = threading.Timer(float(duration), self.request, args=("restore_threshold",),
                                    kwargs={"source": f"end of the {duration:.0f} s loosening", "undo": undo,
                                            "rule": rule})
            timer.daemon = True
            timer.start()
            desc += f", for {float(duration):.0f} s"
        return desc, None

    def _do_restore_threshold(self, step: int, run_context: Any, undo: str, rule: str = "") -> tuple[str, None]:
        levels = self._undo.pop(undo, None)
        if levels is None:
            return f"{rule} levels were already restored", None
        if not rule:  # an undo from before the rule was named: nothing to judge the effect by
            self.monitor.restore(levels)
            return "levels restored", None
        from .levels_effect import change_levels

        _, effect = change_levels(self.monitor, step, rule, lambda: self.monitor.restore(levels), "restore_threshold")
        return f"{rule} levels restored; {effect}", None

    def _do_acknowledge(self, step: int, run_context: Any, rule: str, device: str | None = None) -> tuple[str, None]:
        return self.monitor.acknowledge(rule, device), None

    def _do_stop(self, step: int, run_context: Any) -> tuple[str, str | None]:
        self.stop_requested = True  # first: a stop applies even when its checkpoint cannot be written
        if self.backend is not None:
            self.backend.stop(run_context)
        try:
            detail, path = self.save_checkpoint(step)
        except Exception as exc:  # noqa: BLE001 - reported as the stop's failure; the job stops all the same
            raise ActionError(f"stopping after step {step}, but the checkpoint failed: {type(exc).__name__}: "
                              f"{exc}") from exc
        return f"stopping after step {step}; {detail}", path


    # -- health checkpoints, rewind, clip-grad (docs/rewind.md) ---------------------------------------------

    def _start_ring(self) -> None:
        cfg, mon = self.monitor.config.checkpoint_ring, self.monitor
        every_s = None if cfg.every_minutes is None else cfg.every_minutes * 60.0
        every_steps = cfg.every_steps if cfg.every_steps is not None or every_s is not None else 100
        if mon.world.multi and every_s is not None and cfg.every_steps is None:
            log.warning("msmon: run %s: checkpoint_ring.every_minutes in a multi-rank run would save at a different "
                        "step on each rank, and a rewind needs the same checkpoint on all: saving every 100 steps "
                        "instead (set checkpoint_ring.every_steps)", mon.run_id)
            every_s, every_steps = None, 100
        elif mon.world.multi:
            every_s = None
        self.ring = Ring(RingPolicy(cfg.keep, every_steps, every_s, cfg.confirm_steps, cfg.suspect_steps),
                         self._clock())
        self._ring_dir = cfg.dir.replace("{run_id}", slug(mon.run_id)).replace(
            "{device}", slug(mon.default_device))

    def step_end(self, step: int, run_context: Any = None) -> None:
        """Called at every step boundary (MonitorCallback does; a custom loop calls it after each step, before
        `apply`): writes the health checkpoint when one is due, confirms the ring's pending ones, and sends a
        rewind's follow-up report. A few integer comparisons when nothing is due; never raises."""
        self.trained += 1
        self.last_step = step
        ring = self.ring
        if ring is not None:
            try:
                if ring.entries:
                    confirmed = ring.advance(step)
                    if confirmed:
                        self._publish_ring()
                if ring.due(step, self._clock()):
                    self._ring_save(step, run_context)
            except Exception:  # noqa: BLE001 - a health checkpoint must never take training down
                log.exception("msmon: run %s: the health checkpoint of step %d failed; training goes on",
                              self.monitor.run_id, step)
        report = self._report
        if report is not None and step >= report.at:
            self._report = None
            self._follow_up(step, report)

    def _ring_save(self, step: int, run_context: Any) -> None:
        ring, backend, mon = self.ring, self._rewinder(), self.monitor
        assert ring is not None
        if backend is None:
            self.ring = None
            log.warning("msmon: run %s: checkpoint_ring is on but the backend cannot load checkpoints "
                        "(read_checkpoint/restore, notifier.control.RewindBackend): no health checkpoints",
                        mon.run_id)
            return
        name = f"{slug(mon.run_id)}-device{slug(mon.default_device)}-a{self.attempt}-step{step}"
        started = time.perf_counter()
        try:
            os.makedirs(self._ring_dir, exist_ok=True)
            path = backend.save_checkpoint(step, name, self._ring_dir)
            self._write_state(path)
        except Exception as exc:  # noqa: BLE001 - reported, the ring keeps what it has
            self._save_failures += 1
            ring.restart_clock(self._clock())
            log.error("msmon: run %s step %d: health checkpoint not written (%s: %s); the ring keeps its %d "
                      "earlier ones, training goes on", mon.run_id, step, type(exc).__name__, exc, len(ring.entries))
            return
        firing = self._firing_text()
        data = self._data_position(run_context)
        gone = ring.saved(step, self._clock(), path, data, self.attempt, firing, self._curve(step))
        self._delete(gone)
        log.debug("msmon: health checkpoint of step %d in %.1f ms: %s", step, 1e3 * (time.perf_counter() - started),
                  path)
        self._publish_ring()

    def _write_state(self, checkpoint: str) -> None:
        """The monitor's state next to a health checkpoint (`<ckpt>.msmon.json`, atomically), unless the backend
        wrote it already (MonitorCallback's does)."""
        path = checkpoint + ".msmon.json"
        if os.path.exists(path):
            return
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            # one write: json.dump writes piecemeal, about 8x slower on a 60 KB state
            f.write(json.dumps(self.monitor.state_dict(), allow_nan=False, separators=(",", ":")))
        os.replace(tmp, path)

    def _data_position(self, run_context: Any) -> int | None:
        pos = getattr(self.backend, "data_position", None)
        if pos is None:
            return None
        try:
            value = pos(run_context)
        except Exception:  # noqa: BLE001 - not known
            return None
        return None if value is None else int(value)

    def _firing_text(self) -> str | None:
        """The alerts of the marking severity firing now, named (None: none)."""
        firing = [f"{rule} {sev.value}" for _, rule, sev in self.monitor.firing()
                  if sev.rank >= self._unhealthy_on.rank]
        return ", ".join(dict.fromkeys(firing)) or None

    def _mark_ring(self, step: int, why: str) -> None:
        self._last_alert = step
        ring = self.ring
        if ring is not None and ring.alert(step, why):
            self._publish_ring()

    def _delete(self, gone: list[Entry]) -> None:
        delete = getattr(self.backend, "delete_checkpoint", None)
        for e in gone:
            try:
                if delete is not None:
                    delete(e.path)
                if os.path.exists(e.path + ".msmon.json"):
                    os.remove(e.path + ".msmon.json")
            except OSError as exc:
                log.warning("msmon: the ring could not delete %s (%s); delete it by hand", e.path, exc)

    def _publish_ring(self) -> None:
        """What the bot knows of the ring: the heartbeat carries it (Heartbeat.checkpoints)."""
        tr, ring = self.monitor.transport, self.ring
        if tr is not None and ring is not None:
            tr.checkpoints = [RingCheckpoint(step=e.step, time=e.time, health=e.health.value, why=e.why[:512],
                                             attempt=e.attempt) for e in ring.entries[-64:]]
            tr.attempt = self.attempt

    def _rewinder(self) -> RewindBackend | None:
        """The backend, if it can load checkpoints (RewindBackend)."""
        b = self.backend
        return cast(RewindBackend, b) if b is not None and hasattr(b, "read_checkpoint") else None

    def _by_person(self) -> bool:
        src = self._req.source if self._req is not None else ""
        return not (src.startswith("rule ") or " from rule " in src)

    def _do_rewind(self, step: int, run_context: Any, to: int | None = None, before: int | None = None,
                   skip: int | None = None, alert: str | None = None, attempt: int | None = None) -> tuple[str, str]:
        """All or none across ranks (docs/rewind.md): every rank first decides what it would load and checks it
        without changing anything (`_rewind_plan`: the checkpoint chosen, its file read and checked, the data's
        new position checked against the batches left); then the ranks agree on the verdict in one all-reduce at
        this step boundary (the one every rank applies the command at); then every rank loads, or none does."""
        try:
            plan: _RewindPlan | None = self._rewind_plan(step, run_context, to, before, skip, alert, attempt)
            verdict, why = plan.entry.step if plan is not None else _MOOT, ""
        except Moot as exc:
            plan, verdict, why = None, _MOOT, str(exc)
        except Exception as exc:  # noqa: BLE001 - this rank's refusal: agreed on below, then answered
            plan, verdict, why = None, _REFUSED, (str(exc) if isinstance(exc, ActionError) else
                                                  f"{type(exc).__name__}: {exc}")
        agree = getattr(self._rewinder(), "agree", None)
        if agree is not None and self.monitor.world.multi:
            same, refused = agree(verdict, verdict == _REFUSED)
            if not same or refused:
                raise ActionError(_disagreement(self.monitor.world.rank, verdict, why, refused))
        if verdict == _MOOT:
            raise Moot(why)
        if plan is None:
            raise ActionError(why if why.startswith("not rewound") or why.startswith("rewind refused") else
                              f"not rewound: {why}" + ("" if "nothing was changed" in why else
                                                       "; nothing was changed, training goes on"))
        return self._rewind_apply(step, run_context, plan)

    def _rewind_plan(self, step: int, run_context: Any, to: Any, before: Any, skip: Any, alert: Any,
                     attempt: Any) -> _RewindPlan:
        """What this rank would load, checked: the checkpoint chosen, its file read into memory (changes nothing),
        the data's new position. Raises ActionError (refused), Moot (nothing to do)."""
        mon, ring, backend = self.monitor, self.ring, self._rewinder()
        if ring is None:
            raise ActionError("no health checkpoints to rewind to: this run keeps none (monitor_config "
                              "checkpoint_ring.enable: true, docs/rewind.md)")
        if backend is None:
            raise ActionError("this backend cannot load checkpoints (notifier.control.RewindBackend)")
        to = _int_param("to", to)
        if before is not None and not isinstance(before, bool) and before == -1:  # chat's `before-alert`
            if self._last_alert is None:
                raise ActionError("not rewound: no alert of this run marked a checkpoint yet, so there is nothing to "
                                  "rewind before; give `to <step>`, or nothing for the newest healthy checkpoint")
            before = self._last_alert
        before = _int_param("before", before)
        skip = _int_param("skip", skip)
        if attempt is not None and _int_param("attempt", attempt) < self.attempt:  # type: ignore[operator]
            raise Moot(f"not applied: the alert was raised in attempt {attempt}, which an earlier rewind already "
                       f"ended (this is attempt {self.attempt})")
        if to is not None and to > step:
            raise ActionError(f"cannot rewind forward: step {to} is after the current step {step}")
        spend, why = self.budget.decide(self.trained, self._by_person())
        if spend is Spend.REFUSE:
            then = mon.config.rewind.escalate
            if then != "none":
                self.request(then, f"rewind budget spent ({self._req.source if self._req else 'rule'})")
            raise ActionError(f"rewind refused: {why}; escalated: "
                              + ("nothing more done, the alert stands" if then == "none" else
                                 f"{then} queued for the next step boundary") + ", a person has to look")
        if before is not None:
            self._mark_ring(before, f"{alert or 'an alert'} at step {before} (rewind)")
        chosen = ring.choose(to, before)
        if not isinstance(chosen, Entry):
            raise ActionError(f"not rewound: {chosen}. Nothing was changed; training goes on")
        entry = chosen
        pos_now = self._data_position(run_context)
        target: int | None = None
        if entry.data is not None and pos_now is not None:
            target = pos_now if skip is None else entry.data + skip
        elif skip is not None:
            raise ActionError("not rewound: skip needs the data position, which this backend does not report "
                              "(data_position/seek_data); nothing was changed")
        if target is not None and target != pos_now:
            if getattr(backend, "seek_data", None) is None:
                raise ActionError("not rewound: this backend cannot move the data position (seek_data); nothing "
                                  "was changed")
            check = getattr(backend, "check_seek", None)
            if check is not None:  # past the last batch, sink mode: refused before anything moves
                check(target, run_context)
        loaded = backend.read_checkpoint(entry.path)  # changes nothing: a bad file is refused here
        return _RewindPlan(entry, loaded, pos_now, target, spend, why)

    def _rewind_apply(self, step: int, run_context: Any, plan: _RewindPlan) -> tuple[str, str]:
        """Every rank agreed: move the data, load. A failure from here on stops the job (no step may run on
        half-moved data or half-loaded weights)."""
        mon, ring, backend = self.monitor, self.ring, self._rewinder()
        assert ring is not None and backend is not None
        entry, target, pos_now, spend, why = plan.entry, plan.target, plan.pos_now, plan.spend, plan.why
        started = time.perf_counter()
        moved = ""
        diverged, before_curve = self._loss_now(), self._curve(entry.step)
        if entry.curve is not None and entry.curve[0]:  # recorded when the checkpoint was written: pre-fault
            before_curve = entry.curve
        try:
            if target is not None and target != pos_now:
                moved = backend.seek_data(target, run_context)
            restored = backend.restore(plan.loaded)
        except Exception as exc:  # data moved or weights half-loaded: no step may run on them
            self.stop_requested = True
            backend.stop(run_context)
            raise ActionError(f"the checkpoint of step {entry.step} failed to load half-way ({type(exc).__name__}: "
                              f"{exc}); the job stops rather than train on half-loaded weights") from exc
        n_skip = 0 if target is None or entry.data is None else max(target - entry.data, 0)
        resolved = self._close_firing(step, entry.step, n_skip)
        state = self._load_state(entry.path)
        gone = ring.rewound(entry.step)
        self._delete(gone)
        ring.restart_clock(self._clock())
        self.budget.spend(self.trained)
        self.attempt += 1
        self.rewound_to = entry.step
        self.last_step = entry.step
        tr = mon.transport
        if tr is not None:
            tr.proc = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"  # the bot sees a new attempt of the same run
            tr.progress(entry.step, paused=self.paused)
        self._publish_ring()
        if self.on_rewind is not None:
            self.on_rewind(step, entry.step, entry)
        took = time.perf_counter() - started
        redo = step - entry.step
        cost = self._device_hours(redo)
        skipped = ""
        if target is not None and entry.data is not None:
            n = target - entry.data
            skipped = (f"; batches {entry.data:,}-{target - 1:,} skipped ({n:,}, never read again)" if n > 0 else
                       "; no batch skipped")
        over = f" (over the budget: {why})" if spend is Spend.OVER else ""
        detail = (f"rewound from step {step:,} to the checkpoint of step {entry.step:,} ({entry.health.value}: "
                  f"{entry.why}){skipped}; {redo:,} steps to redo" + (f", about {cost:.3g} device-hours" if cost
                                                                      is not None else "")
                  + f"; {restored}" + (f"; {moved}" if moved else "") + f"; {state}"
                  + (f"; closed as rewound: {', '.join(resolved)}" if resolved else "")
                  + f"; now attempt {self.attempt}, {self.budget.left()} rewinds left{over}; took {took:.2f} s")
        if diverged is not None or before_curve[0]:
            n = mon.config.rewind.report_after
            req = self._req
            self._report = RewindReport(entry.step + n, f"follow-up of {req.name if req else 'rewind'}",
                                        None, before_curve[0], before_curve[1], before_curve[2], diverged,
                                        {"from": step, "to": entry.step,
                                         **({"follow_up": req.command_id} if req and req.command_id else {})})
            detail += f"; the loss after {n} steps follows at step {entry.step + n:,}"
        return detail, entry.path

    def _loss_now(self) -> float | None:
        recent = [s.loss for s in self.monitor.recent() if s.loss is not None and math.isfinite(s.loss)]
        return recent[-1] if recent else None

    def _curve(self, upto: int) -> tuple[str, float | None, float | None]:
        """The pre-fault curve: the loss of the last samples at or before step `upto` (mean, noise as the standard
        deviation of its step-to-step changes), from the samples the monitor keeps."""
        xs = [(s.step, s.loss) for s in self.monitor.recent() if s.step <= upto and s.loss is not None
              and math.isfinite(s.loss)][-20:]
        if len(xs) < 3:
            return "", None, None
        vals = [v for _, v in xs]
        mean = sum(vals) / len(vals)
        diffs = [b - a for a, b in zip(vals, vals[1:], strict=False)]
        noise = math.sqrt(sum(d * d for d in diffs) / len(diffs) / 2) if diffs else 0.0
        return f"{mean:.4g} +- {noise:.2g} over steps {xs[0][0]:,}-{xs[-1][0]:,}", mean, noise

    def _device_hours(self, steps: int) -> float | None:
        times = [s.step_time for s in self.monitor.recent() if s.step_time]
        if not times:
            return None
        return steps * (sum(times) / len(times)) * self.monitor.world.size / 3600.0

    def _close_firing(self, step: int, to_step: int, skipped: int = 0) -> list[str]:
        """Close every alert firing now as rewound: a resolution event each (the bot closes the episode, and the
        chat sees what happened even when a rule asked for the rewind)."""
        mon, out = self.monitor, []
        cost = self._device_hours(step - to_step)
        how = (f"; {skipped:,} batches skipped" if skipped else "") + (
            f"; {step - to_step:,} steps to redo, about {cost:.3g} device-hours" if cost is not None else "")
        for device, rule, sev in mon.firing():
            ev = Event(run_id=mon.run_id, device=device, step=step, time=time.time(), rule=rule, severity=sev,
                       status=Status.RESOLVED, value=math.nan, threshold=math.nan,
                       message=f"{rule} closed as rewound: the run went back from step {step:,} to the checkpoint "
                               f"of step {to_step:,}{how} (attempt {self.attempt + 1})", hint="rewound")
            if mon.transport is not None:
                mon.transport.event(ev)
            out.append(f"{rule} on {device}")
        return out

    def _load_state(self, checkpoint: str) -> str:
        path = checkpoint + ".msmon.json"
        try:
            with open(path, encoding="utf-8") as f:
                self.monitor.load_state_dict(json.load(f), continue_clock=False)
        except (OSError, ValueError) as exc:
            log.warning("msmon: run %s: the monitor's state of %s did not load (%s); its rules carry on from what they "
                        "knew at the rewind", self.monitor.run_id, checkpoint, exc)
            return "msmon's own state kept (the checkpoint's did not load)"
        return "msmon's rules carry on from their state at that step"

    def _follow_up(self, step: int, r: RewindReport) -> None:
        now = self._loss_now()
        xs = [s.loss for s in self.monitor.recent() if s.loss is not None and math.isfinite(s.loss)][-10:]
        mean = sum(xs) / len(xs) if xs else None
        if mean is None or r.mean is None:
            verdict = "no loss reported to compare"
        else:
            lim = r.mean + 3 * (r.noise or 0.0) + 1e-12
            verdict = (f"back on the pre-fault curve (at or below {r.mean:.4g} + 3 x {r.noise or 0:.2g})" if mean
                       <= lim else f"NOT back on the pre-fault curve yet (above {lim:.4g})")
        text = (f"{step - int(r.params['to']):,} steps after the rewind to step {int(r.params['to']):,}: loss "
                + (f"{mean:.4g} (mean of the last {len(xs)} samples; last {now:.4g})" if mean is not None else "n/a")
                + f" against the pre-fault {r.before or 'curve (not enough samples)'}"
                + (f", {r.diverged:.4g} when the rewind was asked" if r.diverged is not None else "")
                + f": {verdict}")
        req = Request("rewind", dict(r.params), r.source)
        self._result(step, req, True, text, None, planned=False)

    def _do_clip_grad(self, step: int, run_context: Any, max_norm: float) -> tuple[str, None]:
        try:
            value = float(check_param("clip_grad", "max_norm", max_norm))  # type: ignore[arg-type]
        except ParamError as exc:
            raise ActionError(f"{exc}; nothing was changed") from None
        clip = getattr(self._need_backend("clip gradients"), "clip_grad", None)
        if clip is None:
            raise ActionError("this backend cannot clip gradients (clip_grad): use notifier.mindspore's train cells")
        return clip(value), None


def _int_param(name: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ActionError(f"{name} is a step number, not {value!r}")
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise ActionError(f"{name} is a step number, not {value!r}") from None
    if n < 0 or n != float(value):
        raise ActionError(f"{name} is a whole number >= 0, not {value!r}")
    return n


# action -> its handler; pause and resume are CommandOrder's own outcomes. Checked against the action table at
# import: an action without a handler (or a handler without an action) fails here, not in a job at 2 a.m.
HANDLERS: dict[str, Callable[..., tuple[str, str | None]]] = {
    "save_checkpoint": JobControl._do_save_checkpoint,
    "scale_lr": JobControl._do_scale_lr,
    "rewind": JobControl._do_rewind,
    "clip_grad": JobControl._do_clip_grad,
    "stop": JobControl._do_stop,
    "set_threshold": JobControl._do_set_threshold,
    "loosen_threshold": JobControl._do_loosen_threshold,
    "restore_threshold": JobControl._do_restore_threshold,
    "acknowledge": JobControl._do_acknowledge,
}
ORDER_ACTIONS = ("pause", "resume")  # carried out by CommandOrder and JobControl.apply, not by a handler
if set(HANDLERS) | set(ORDER_ACTIONS) != set(ACTIONS) or set(HANDLERS) & set(ORDER_ACTIONS):
    raise ImportError(f"notifier.control.HANDLERS does not match msmon.contract.actions.ACTIONS: missing "
                      f"{sorted(set(ACTIONS) - set(HANDLERS) - set(ORDER_ACTIONS))}, extra "
                      f"{sorted(set(HANDLERS) - set(ACTIONS))}")


__all__ = ["HANDLERS", "ORDER_ACTIONS", "ActionError", "Backend", "CommandOrder", "JobControl", "Moot", "Outcome",
           "Request", "RewindBackend", "acceptance_order"]
