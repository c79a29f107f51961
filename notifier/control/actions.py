"""The job actions themselves: `Actions` carries out one action at a step boundary (a checkpoint, the LR, the
thresholds, an acknowledgement, a stop, a rewind, clip-grad), and `HANDLERS` maps each action of
msmon/contract/actions.py to its method, checked against that table at import (pause and resume are CommandOrder's
own). When an action applies is CommandOrder's decision; JobControl calls the handler."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from msmon.common.safenames import slug
from msmon.contract.actions import ACTIONS, ParamError, check_param

from ..checkpoints import Entry
from ..levels_effect import change_levels
from .backend import ActionError, Backend
from .order import Request
from .rewind import HalfLoaded, Rewinder

if TYPE_CHECKING:
    from ..monitor import Monitor

Answer = tuple[str, str | None]  # what to answer, and the checkpoint written or loaded (if any)


class Actions:
    """One process's actions. `ask(action, source, **params)` queues an action for a later boundary (the end of a
    timed loosening, the rewind budget's escalation); `rewound(step, checkpoint)` is told of each rewind applied.
    `stop_requested` is set by a stop, and by a rewind that failed half-way (a custom loop ends on it)."""

    def __init__(self, monitor: Monitor, backend: Backend | None, rewinder: Rewinder, ask: Callable[..., None],
                 rewound: Callable[[int, Entry], None]) -> None:
        self.monitor, self.backend, self.rewinder, self._ask, self._rewound = monitor, backend, rewinder, ask, rewound
        self._undo: dict[str, Any] = {}  # loosen_threshold's levels to restore, by token
        self.stop_requested = False

    def save_checkpoint(self, req: Request | None, step: int, run_context: Any = None) -> tuple[str, str]:
        """Write the checkpoint of `step` through the backend: (what to answer, the path written)."""
        mon = self.monitor
        # job data names the file only as safe slugs (a run id `../x` stays a name); the backend keeps it in its folder
        path = self._need_backend("save a checkpoint").save_checkpoint(
            step, f"{slug(mon.run_id)}-device{slug(mon.default_device)}-step{step}")
        return f"checkpoint of step {step} written to {path}", path

    def scale_lr(self, req: Request, step: int, run_context: Any, factor: float) -> Answer:
        detail = self._need_backend("scale the LR").scale_lr(float(factor))
        self.monitor.note_lr_change()
        return detail, None

    def _need_backend(self, what: str) -> Backend:
        if self.backend is None:
            raise ActionError(f"no backend to {what} with: this JobControl was made without one (pass "
                              "backend=, e.g. notifier.mindspore's MindSporeBackend, or your own)")
        return self.backend

    def set_threshold(self, req: Request, step: int, run_context: Any, rule: str, value: float,
                      level: str = "warning") -> Answer:
        mon = self.monitor
        old, effect = change_levels(mon, step, rule, lambda: mon.set_threshold(rule, float(value), level),
                                    "set_threshold")
        return f"{rule} {level} level {old} -> {float(value):g}; {effect}", None

    def loosen_threshold(self, req: Request, step: int, run_context: Any, rule: str, value: float | None = None,
                         factor: float | None = None, duration: float | None = None,
                         undo: str | None = None) -> Answer:
        mon = self.monitor
        (desc, levels), effect = change_levels(mon, step, rule, lambda: mon.loosen(rule, value=value, factor=factor),
                                               "loosen_threshold")
        desc += f"; {effect}"
        if duration and undo:
            self._undo[undo] = levels
            timer = threading.Timer(float(duration), self._ask, args=("restore_threshold",),
                                    kwargs={"source": f"end of the {duration:.0f} s loosening", "undo": undo,
                                            "rule": rule})
            timer.daemon = True
            timer.start()
            desc += f", for {float(duration):.0f} s"
        return desc, None

    def restore_threshold(self, req: Request, step: int, run_context: Any, undo: str, rule: str = "") -> Answer:
        levels = self._undo.pop(undo, None)
        if levels is None:
            return f"{rule} levels were already restored", None
        if not rule:  # an undo from before the rule was named: nothing to judge the effect by
            self.monitor.restore(levels)
            return "levels restored", None
        _, effect = change_levels(self.monitor, step, rule, lambda: self.monitor.restore(levels), "restore_threshold")
        return f"{rule} levels restored; {effect}", None

    def acknowledge(self, req: Request, step: int, run_context: Any, rule: str, device: str | None = None) -> Answer:
        return self.monitor.acknowledge(rule, device), None

    def stop(self, req: Request, step: int, run_context: Any) -> Answer:
        self.stop_requested = True  # first: a stop applies even when its checkpoint cannot be written
        if self.backend is not None:
            self.backend.stop(run_context)
        try:
            detail, path = self.save_checkpoint(req, step)
        except Exception as exc:  # noqa: BLE001 - reported as the stop's failure; the job stops all the same
            raise ActionError(f"stopping after step {step}, but the checkpoint failed: {type(exc).__name__}: "
                              f"{exc}") from exc
        return f"stopping after step {step}; {detail}", path

    def rewind(self, req: Request, step: int, run_context: Any, to: int | None = None, before: int | None = None,
               skip: int | None = None, alert: str | None = None, attempt: int | None = None) -> Answer:
        try:
            detail, entry = self.rewinder.rewind(step, run_context, req, to=to, before=before, skip=skip,
                                                 alert=alert, attempt=attempt)
        except HalfLoaded:
            self.stop_requested = True  # the backend was told to stop: no step may run on half-loaded weights
            raise
        self._rewound(step, entry)
        return detail, entry.path

    def clip_grad(self, req: Request, step: int, run_context: Any, max_norm: float) -> Answer:
        try:
            value = float(check_param("clip_grad", "max_norm", max_norm))  # type: ignore[arg-type]
        except ParamError as exc:
            raise ActionError(f"{exc}; nothing was changed") from None
        clip = getattr(self._need_backend("clip gradients"), "clip_grad", None)
        if clip is None:
            raise ActionError("this backend cannot clip gradients (clip_grad): use notifier.mindspore's train cells")
        return clip(value), None


# action -> its handler; pause and resume are CommandOrder's own outcomes. Checked against the action table at
# import: an action without a handler (or a handler without an action) fails here, not in a job at 2 a.m.
HANDLERS: dict[str, Callable[..., Answer]] = {
    "save_checkpoint": Actions.save_checkpoint,
    "scale_lr": Actions.scale_lr,
    "rewind": Actions.rewind,
    "clip_grad": Actions.clip_grad,
    "stop": Actions.stop,
    "set_threshold": Actions.set_threshold,
    "loosen_threshold": Actions.loosen_threshold,
    "restore_threshold": Actions.restore_threshold,
    "acknowledge": Actions.acknowledge,
}
ORDER_ACTIONS = ("pause", "resume")  # carried out by CommandOrder and JobControl.apply, not by a handler
if set(HANDLERS) | set(ORDER_ACTIONS) != set(ACTIONS) or set(HANDLERS) & set(ORDER_ACTIONS):
    raise ImportError(f"notifier.control.HANDLERS does not match msmon.contract.actions.ACTIONS: missing "
                      f"{sorted(set(ACTIONS) - set(HANDLERS) - set(ORDER_ACTIONS))}, extra "
                      f"{sorted(set(HANDLERS) - set(ACTIONS))}")


__all__ = ["HANDLERS", "ORDER_ACTIONS", "Actions", "Answer"]
