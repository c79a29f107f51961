"""Job actions applied at a step boundary: save_checkpoint, pause/resume, scale_lr, set_threshold, stop.

Requests may come from any thread (a rule's `actions:`, code, later the bot's chat commands);
they queue here and run on the training thread between two steps, the only place where the
weights are consistent and a checkpoint is meaningful.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import mindspore as ms

from ..monitor import Monitor
from ..wire import ActionResult, Command, Event
from .lr import ActionError, LrHandle, global_step, lr_handles

log = logging.getLogger("msmon")

ACTIONS = ("save_checkpoint", "pause", "resume", "scale_lr", "set_threshold", "loosen_threshold",
           "restore_threshold", "stop")


class Request:
    __slots__ = ("action", "params", "source", "command_id", "at_step")

    def __init__(self, action: str, params: dict[str, Any], source: str, command_id: str | None = None,
                 at_step: int | None = None) -> None:
        self.action, self.params, self.source = action, params, source
        self.command_id, self.at_step = command_id, at_step


class JobControl:
    """Executes job actions for one training process. Thread-safe `request()`; `apply()` on the
    training thread at a step boundary."""

    def __init__(
        self,
        monitor: Monitor,
        checkpoint_dir: str = "./checkpoints",
        pause_timeout: float | None = None,
        heartbeat_every: float = 30.0,
        on_result: Callable[[ActionResult], None] | None = None,
        on_paused: Callable[[int, float], None] | None = None,
    ) -> None:
        self.monitor = monitor
        self.checkpoint_dir = checkpoint_dir
        self.pause_timeout = pause_timeout
        self.heartbeat_every = heartbeat_every
        self.on_result = on_result
        self.on_paused = on_paused  # called while paused: (step, seconds paused), every heartbeat_every
        self.results: deque[ActionResult] = deque(maxlen=1000)
        self._pending: deque[Request] = deque()
        # Command ids taken (delivery is at-least-once, from two threads: the poll and the sender's answers).
        self._seen: dict[str, None] = {}
        self._seen_lock = threading.Lock()
        self._undo: dict[str, Any] = {}  # loosen_threshold's levels to restore, by token
        self._resume = threading.Event()
        self._resumed_by: Request | None = None
        self.last_step = 0  # the last step boundary seen
        self.paused = False
        self.train_network: Any = None
        self.optimizer: Any = None
        self.stop_requested = False

    def bind(self, train_network: Any, optimizer: Any) -> None:
        self.train_network, self.optimizer = train_network, optimizer

    # -- any thread --------------------------------------------------------------------------

    def request(self, action: str, source: str = "code", command_id: str | None = None, at_step: int | None = None,
                **params: Any) -> None:
        """Queue an action for the first step boundary at or after `at_step` (None: the next one).
        A chat command's id makes it idempotent: a second delivery of the same id is ignored.
        `resume` acts at once (the job is blocked in its pause)."""
        if action not in ACTIONS:
            raise ValueError(f"unknown action {action!r}; actions are {', '.join(ACTIONS)}")
        if command_id is not None:
            with self._seen_lock:
                if command_id in self._seen:
                    return
                self._seen[command_id] = None
                if len(self._seen) > 10_000:
                    del self._seen[next(iter(self._seen))]
        req = Request(action, params, source, command_id, at_step)
        if action == "resume":
            if not self.paused:
                self._result(self.last_step, req, True, "the job was not paused: nothing to resume", None)
                return
            self._resumed_by = req
            self._resume.set()
            return
        self._pending.append(req)

    def listen(self) -> None:
        """Take the bot's chat commands, when the Monitor reports to a bot and `bot.commands` is on."""
        tr = self.monitor.transport
        if tr is not None and self.monitor.config.bot.commands:
            tr.listen(self.take_commands)

    def take_event(self, ev: Event) -> None:
        """Queue the configured actions an event carries (monitor_config `actions:`)."""
        for act in ev.actions:
            params: dict[str, Any] = {k: v for k, v in act.items() if k != "action"}
            self.request(str(act["action"]), f"rule {ev.rule} {ev.severity.value}", **params)

    def take_commands(self, commands: list[Command]) -> None:
        """Chat commands from the bot (any thread): queued for their apply step."""
        for c in commands:
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
        return bool(self._pending)

    # -- the training thread -------------------------------------------------------------------

    def apply(self, step: int, run_context: Any = None) -> list[ActionResult]:
        """Run every queued action that is due, in order; the others wait for their step. Never raises:
        a failed action is a result with ok=False."""
        done = []
        self.last_step = step
        for _ in range(len(self._pending)):
            req = self._pending.popleft()
            if req.at_step is not None and step < req.at_step:
                self._pending.append(req)  # not yet: every rank acts at the same step
                continue
            try:
                if req.action == "pause":  # reports itself: when the pause starts, and when it ends
                    self._do_pause(step, run_context, req, **req.params)
                    continue
                outcome = getattr(self, "_do_" + req.action)(step, run_context, **req.params)
            except Exception as exc:  # noqa: BLE001 - an action must not take training down
                done.append(self._result(step, req, False, f"{type(exc).__name__}: {exc}", None))
                continue
            done.append(self._result(step, req, True, *outcome))
        return done

    def _result(self, step: int, req: Request, ok: bool, detail: str, path: str | None) -> ActionResult:
        mon = self.monitor
        if req.at_step is not None and step > req.at_step:
            detail += (f" (at step {step}, {step - req.at_step} after the planned step {req.at_step}: the command "
                       "reached this rank late)")
        params = {k: v for k, v in req.params.items() if k != "undo"}
        res = ActionResult(run_id=mon.run_id, device=mon.default_device, step=step, time=time.time(),
                           action=req.action, ok=ok, detail=detail, params=params, source=req.source,
                           path=path, command_id=req.command_id)
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
        if self.train_network is None:
            raise ActionError("no network to save yet (training has not started)")
        os.makedirs(self.checkpoint_dir, exist_ok=True)
        mon = self.monitor
        name = f"{mon.run_id}-device{mon.default_device}-step{step}.ckpt"
        path = os.path.join(self.checkpoint_dir, name)
        ms.save_checkpoint(self.train_network, path)
        return f"checkpoint of step {step} written to {path}", path

    def _do_pause(self, step: int, run_context: Any, req: Request | None = None,
                  timeout: float | None = None) -> None:
        limit = timeout if timeout is not None else self.pause_timeout
        self._resume.clear()
        self._resumed_by = None
        self.paused = True
        tr = self.monitor.transport
        if tr is not None:
            tr.progress(step, paused=True)  # heartbeats now say "alive, paused"
        started = time.monotonic()
        how = f"; resumes by itself after {limit:.0f} s" if limit else "; waiting for resume"
        if req is not None:
            self._result(step, req, True, f"paused at step {step}{how}", None)
        log.warning("[run %s step %d] paused%s", self.monitor.run_id, step, how)
        try:
            while True:
                waited = time.monotonic() - started
                slice_ = self.heartbeat_every if limit is None else min(self.heartbeat_every, max(limit - waited, 0))
                if self._resume.wait(slice_):
                    break
                waited = time.monotonic() - started
                if limit is not None and waited >= limit:
                    break
                log.info("[run %s step %d] still paused after %.0f s", self.monitor.run_id, step, waited)
                if self.on_paused is not None:
                    self.on_paused(step, waited)
        finally:
            self.paused = False
            if tr is not None:
                tr.progress(step, paused=False)
        waited = time.monotonic() - started
        by = self._resumed_by or Request("resume", {}, f"its {limit:.0f} s timeout" if limit else "code")
        self._result(step, by, True, f"resumed at step {step} after {waited:.1f} s paused", None)

    def _do_scale_lr(self, step: int, run_context: Any, factor: float) -> tuple[str, None]:
        if self.optimizer is None:
            raise ActionError("no optimizer known yet (training has not started)")
        handles = lr_handles(self.optimizer)
        idx = max(global_step(self.optimizer) - 1, 0)
        before = [h.read(idx) for h in handles]
        for h in handles:
            h.scale(float(factor))
        after = [h.read(idx) for h in handles]
        self.monitor.note_lr_change()
        return "lr " + ", ".join(f"{a:.3g} -> {b:.3g}" for a, b in zip(before, after, strict=True)), None

    def _do_set_threshold(self, step: int, run_context: Any, rule: str, value: float,
                          level: str = "warning") -> tuple[str, None]:
        old = self.monitor.set_threshold(rule, float(value), level)
        return f"{rule} {level} level {old} -> {float(value):g}", None

    def _do_loosen_threshold(self, step: int, run_context: Any, rule: str, value: float | None = None,
                             factor: float | None = None, duration: float | None = None,
                             undo: str | None = None) -> tuple[str, None]:
        desc, levels = self.monitor.loosen(rule, value=value, factor=factor)
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
        self.monitor.restore(levels)
        return f"{rule} levels restored", None

    def _do_stop(self, step: int, run_context: Any) -> tuple[str, str | None]:
        detail, path = self.save_checkpoint(step)
        self.stop_requested = True
        if run_context is not None:
            run_context.request_stop()
        return f"stopping after step {step}; {detail}", path


__all__ = ["ACTIONS", "ActionError", "JobControl", "LrHandle"]
