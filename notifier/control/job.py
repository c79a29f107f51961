"""`JobControl`, one training process's controller: takes requests from any thread (a chat command, a rule's
`actions:`, code), asks CommandOrder (order.py) what applies at each step boundary, and carries it out on the
training thread: the pause's wait here, every other action through `Actions` (actions.py), the health checkpoints
through `HealthRing` (ring.py), a rewind through `Rewinder` (rewind.py). Every request gets one answer, an
`ActionResult`, sent to the bot and logged."""

from __future__ import annotations

import inspect
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from msmon.contract.actions import ACTIONS, ParamError, check_param
from msmon.contract.wire import ActionRequest, ActionResult, Command, Event, Status

from ..checkpoints import Entry, Ring
from .actions import HANDLERS, Actions
from .backend import Backend, Moot
from .order import CommandOrder, Outcome, Request
from .rewind import Rewinder
from .ring import HealthRing

if TYPE_CHECKING:
    from ..monitor import Monitor

log = logging.getLogger("msmon")


class JobControl:
    """Executes job actions for one training process. Thread-safe `request()`; `apply()` on the
    training thread at a step boundary. What applies when is CommandOrder's decision; the actions
    themselves are `Actions`', and the framework's part (checkpoint, LR, the framework's stop) is `backend`'s. With no
    backend, save_checkpoint and scale_lr fail saying so, and a stop sets `stop_requested` (for a custom loop to end
    on) but writes no checkpoint. `on_rewind(from step, to step, checkpoint)` is told of each rewind applied
    (MonitorCallback renumbers its steps); `on_paused(step, seconds)` is called every `heartbeat_every` while
    paused; `on_result` gets every answer."""

    def __init__(
        self,
        monitor: Monitor,
        backend: Backend | None = None,
        pause_timeout: float | None = None,
        heartbeat_every: float = 30.0,
        on_result: Callable[[ActionResult], None] | None = None,
        on_paused: Callable[[int, float], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_rewind: Callable[[int, int, Entry], None] | None = None,
    ) -> None:
        self.monitor = monitor
        self.backend = backend
        self.heartbeat_every = heartbeat_every
        self.on_result, self.on_paused, self.on_rewind = on_result, on_paused, on_rewind
        self.results: deque[ActionResult] = deque(maxlen=1000)
        self._order = CommandOrder(pause_timeout)
        self._cond = threading.Condition()  # guards _order; wakes a pause when a request arrives
        self._woken = False
        self._clock = clock
        self._beat_at = 0.0
        self.last_step = 0  # the last step boundary seen
        self.paused = False
        # Health checkpoints and rewinds (monitor_config checkpoint_ring, rewind; docs/rewind.md)
        self.health = HealthRing(monitor, backend, clock)
        self.rewinder = Rewinder(monitor, backend, self.health, self.request)
        self.actions = Actions(monitor, backend, self.rewinder, self.request, self._rewound)

    @property
    def pause_timeout(self) -> float | None:
        return self._order.pause_timeout

    @pause_timeout.setter
    def pause_timeout(self, value: float | None) -> None:
        self._order.pause_timeout = value

    @property
    def stop_requested(self) -> bool:
        """A stop was applied (or a rewind failed half-way): a custom loop ends on it."""
        return self.actions.stop_requested

    @property
    def ring(self) -> Ring | None:
        """The health checkpoints (None: this run keeps none)."""
        return self.health.ring

    @property
    def attempt(self) -> int:
        """Rewinds applied so far: the run's attempt, the same on every rank."""
        return self.health.attempt

    @property
    def rewound_to(self) -> int | None:
        """Set by a rewind: the step the training carries on from (a custom loop sets its step counter to it, then
        calls `take_rewound_to()`; MonitorCallback renumbers MindSpore's steps)."""
        return self.rewinder.rewound_to

    @rewound_to.setter
    def rewound_to(self, value: None) -> None:
        """`control.rewound_to = None`, as custom loops written before take_rewound_to() clear it: still works."""
        if value is not None:
            raise AttributeError("rewound_to is set by a rewind; a custom loop reads it with take_rewound_to()")
        self.rewinder.take_rewound_to()

    def take_rewound_to(self) -> int | None:
        """The step a rewind carries the training on from, once (None: no rewind since the last call)."""
        return self.rewinder.take_rewound_to()

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
        if ev.status is Status.FIRING and self.health.marks(ev.severity) and not ev.repeat:
            self.health.mark(ev.step, f"{ev.rule} {ev.severity.value} at step {ev.step}")
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

    def step_end(self, step: int, run_context: Any = None) -> None:
        """Called at every step boundary (MonitorCallback does; a custom loop calls it after each step, before
        `apply`): writes the health checkpoint when one is due, confirms the ring's pending ones, and sends a
        rewind's follow-up report. A few integer comparisons when nothing is due; never raises."""
        self.rewinder.count_step()
        self.last_step = step
        self.health.step_end(step, run_context)
        report = self.rewinder.due_report(step)
        if report is not None:
            req = Request("rewind", dict(report.params), report.source)
            self._result(step, req, True, self.rewinder.follow_up(step, report), None, planned=False)

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

    def save_checkpoint(self, step: int) -> tuple[str, str]:
        """Write the checkpoint of `step` through the backend: (what to answer, the path written)."""
        return self.actions.save_checkpoint(None, step)

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
            return self._pause(step, o)
        if o.kind == "resume":
            self.paused = False
            self.monitor.release_clock()
            if tr is not None:
                tr.progress(step, paused=False)
            return self._result(step, req, True, o.detail, None, planned=False)
        return self._run(step, run_context, req)

    def _pause(self, step: int, o: Outcome) -> ActionResult:
        self.paused = True
        self.monitor.hold_clock()  # time paused on purpose is no step time: no step_stall after it
        tr = self.monitor.transport
        if tr is not None:
            tr.progress(step, paused=True)  # heartbeats now say "alive, paused"
        self._beat_at = self._clock() + self.heartbeat_every
        log.warning("[run %s step %d] %s (%s); heartbeats say paused, no step runs until a resume or a stop",
                    self.monitor.run_id, step, o.detail, o.req.source)
        return self._result(step, o.req, True, o.detail, None)

    def _run(self, step: int, run_context: Any, req: Request) -> ActionResult:
        """Carry out one action through its handler, after checking its parameters again here on every rank."""
        handler = HANDLERS[req.action]
        try:  # the bounds the bot checked already, again here on every rank (any source: code, a rule, a command)
            for name, value in req.params.items():
                if ACTIONS[req.action].param(name) is not None:
                    check_param(req.action, name, value)
        except ParamError as exc:
            return self._result(step, req, False, f"not applied: {exc}; nothing was changed, training goes on", None)
        try:
            inspect.signature(handler).bind(self.actions, req, step, run_context, **req.params)
        except TypeError as exc:  # parameters the handler does not take, or one missing (a hand-made command)
            return self._result(step, req, False, f"{req.action}: {exc}", None)
        try:
            detail, path = handler(self.actions, req, step, run_context, **req.params)
        except Moot as exc:
            return self._result(step, req, True, str(exc), None, applied=False)
        except Exception as exc:  # noqa: BLE001 - an action must not take training down
            return self._result(step, req, False, f"{type(exc).__name__}: {exc}", None)
        return self._result(step, req, True, detail, path)

    def _rewound(self, step: int, entry: Entry) -> None:
        """A rewind from `step` to the checkpoint `entry` was applied: the steps go on from its step, the bot sees a
        new attempt of the same run."""
        self.last_step = entry.step
        tr = self.monitor.transport
        if tr is not None:
            tr.new_attempt()
            tr.progress(entry.step, paused=self.paused)
        self.health.publish()
        if self.on_rewind is not None:
            self.on_rewind(step, entry.step, entry)

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


__all__ = ["JobControl"]
