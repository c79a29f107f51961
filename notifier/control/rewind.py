"""A rewind, all or none across ranks (docs/rewind.md): `Rewinder` plans what this rank would load (checked, changing
nothing), has the ranks agree in one collective, then loads, closes the alerts as rewound and reports the loss
against the pre-fault curve some steps later. The health checkpoints it loads are HealthRing's (ring.py); the budget
is notifier/checkpoints.py's `RewindBudget`."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from msmon.contract.wire import Event, Status

from ..checkpoints import BudgetPolicy, Entry, RewindBudget, Spend
from .backend import ActionError, Backend, Moot
from .order import Request
from .ring import HealthRing, data_position, loss_curve, rewinder

if TYPE_CHECKING:
    from ..monitor import Monitor

log = logging.getLogger("msmon")


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
    """What one rank would do for a rewind, checked and changing nothing yet (Rewinder._plan)."""

    entry: Entry
    loaded: Any  # the checkpoint's contents, read and checked (RewindBackend.read_checkpoint)
    pos_now: int | None
    target: int | None  # the data position to move to (None: the data does not move)
    spend: Spend
    why: str | None  # why the rewind is over the budget, if it is


class HalfLoaded(ActionError):
    """A rewind failed after it began to move the data or load the weights: the job must stop (the backend was
    told already)."""


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


def _by_person(req: Request | None) -> bool:
    src = req.source if req is not None else ""
    return not (src.startswith("rule ") or " from rule " in src)


class Rewinder:
    """Rewinds of one rank and their budget. `ask(action, source)` queues an action (the budget's escalation)."""

    def __init__(self, monitor: Monitor, backend: Backend | None, health: HealthRing,
                 ask: Callable[[str, str], None]) -> None:
        self.monitor, self.backend, self.health, self._ask = monitor, backend, health, ask
        cfg = monitor.config.rewind
        self.budget = RewindBudget(BudgetPolicy(cfg.max_rewinds, cfg.min_steps_between))
        self.trained = 0  # step boundaries seen (redone steps included): what the rewind budget counts
        self.rewound_to: int | None = None  # the step the training carries on from after the last rewind
        self.report: RewindReport | None = None

    def count_step(self) -> None:
        """A step boundary was trained (redone steps included): what the budget counts."""
        self.trained += 1

    def due_report(self, step: int) -> RewindReport | None:
        """The rewind's follow-up report if it is due at `step` (returned once)."""
        report = self.report
        if report is None or step < report.at:
            return None
        self.report = None
        return report

    def take_rewound_to(self) -> int | None:
        """The step a rewind carries the training on from, once (a custom loop sets its step counter to it)."""
        to, self.rewound_to = self.rewound_to, None
        return to

    def rewind(self, step: int, run_context: Any, req: Request | None, **params: Any) -> tuple[str, Entry]:
        """All or none across ranks: every rank first decides what it would load and checks it without changing
        anything (`_plan`: the checkpoint chosen, its file read and checked, the data's new position checked against
        the batches left); then the ranks agree on the verdict in one all-reduce at this step boundary (the one every
        rank applies the command at); then every rank loads, or none does. Returns the answer and the checkpoint
        loaded; raises ActionError (refused: nothing changed), HalfLoaded (the job must stop) or Moot."""
        try:
            plan: _RewindPlan | None = self._plan(step, run_context, req, **params)
            verdict, why = plan.entry.step if plan is not None else _MOOT, ""
        except Moot as exc:
            plan, verdict, why = None, _MOOT, str(exc)
        except Exception as exc:  # noqa: BLE001 - this rank's refusal: agreed on below, then answered
            plan, verdict, why = None, _REFUSED, (str(exc) if isinstance(exc, ActionError) else
                                                  f"{type(exc).__name__}: {exc}")
        agree = getattr(rewinder(self.backend), "agree", None)
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
        return self._apply(step, run_context, req, plan)

    def _plan(self, step: int, run_context: Any, req: Request | None, to: Any = None, before: Any = None,
              skip: Any = None, alert: Any = None, attempt: Any = None) -> _RewindPlan:
        """What this rank would load, checked: the checkpoint chosen, its file read into memory (changes nothing),
        the data's new position. Raises ActionError (refused), Moot (nothing to do)."""
        ring, backend = self.health.ring, rewinder(self.backend)
        if ring is None:
            raise ActionError("no health checkpoints to rewind to: this run keeps none (monitor_config "
                              "checkpoint_ring.enable: true, docs/rewind.md)")
        if backend is None:
            raise ActionError("this backend cannot load checkpoints (notifier.control.RewindBackend)")
        to, before, skip = _int_param("to", to), self._before(before), _int_param("skip", skip)
        if attempt is not None and _int_param("attempt", attempt) < self.health.attempt:  # type: ignore[operator]
            raise Moot(f"not applied: the alert was raised in attempt {attempt}, which an earlier rewind already "
                       f"ended (this is attempt {self.health.attempt})")
        if to is not None and to > step:
            raise ActionError(f"cannot rewind forward: step {to} is after the current step {step}")
        spend, why = self._spend(req)
        if before is not None:
            self.health.mark(before, f"{alert or 'an alert'} at step {before} (rewind)")
        chosen = ring.choose(to, before)
        if not isinstance(chosen, Entry):
            raise ActionError(f"not rewound: {chosen}. Nothing was changed; training goes on")
        pos_now = data_position(self.backend, run_context)
        target = self._target(backend, chosen, pos_now, skip, run_context)
        loaded = backend.read_checkpoint(chosen.path)  # changes nothing: a bad file is refused here
        return _RewindPlan(chosen, loaded, pos_now, target, spend, why)

    def _before(self, before: Any) -> int | None:
        if before is not None and not isinstance(before, bool) and before == -1:  # chat's `before-alert`
            if self.health.last_alert is None:
                raise ActionError("not rewound: no alert of this run marked a checkpoint yet, so there is nothing to "
                                  "rewind before; give `to <step>`, or nothing for the newest healthy checkpoint")
            return self.health.last_alert
        return _int_param("before", before)

    def _spend(self, req: Request | None) -> tuple[Spend, str | None]:
        spend, why = self.budget.decide(self.trained, _by_person(req))
        if spend is Spend.REFUSE:
            then = self.monitor.config.rewind.escalate
            if then != "none":
                self._ask(then, f"rewind budget spent ({req.source if req else 'rule'})")
            raise ActionError(f"rewind refused: {why}; escalated: "
                              + ("nothing more done, the alert stands" if then == "none" else
                                 f"{then} queued for the next step boundary") + ", a person has to look")
        return spend, why

    @staticmethod
    def _target(backend: Any, entry: Entry, pos_now: int | None, skip: int | None, run_context: Any) -> int | None:
        """The data position the rewind moves to (None: the data does not move), checked before anything moves."""
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
        return target

    def _apply(self, step: int, run_context: Any, req: Request | None, plan: _RewindPlan) -> tuple[str, Entry]:
        """Every rank agreed: move the data, load. A failure from here on stops the job (no step may run on
        half-moved data or half-loaded weights): HalfLoaded."""
        mon, backend = self.monitor, rewinder(self.backend)
        assert backend is not None
        entry, target, pos_now = plan.entry, plan.target, plan.pos_now
        started = time.perf_counter()
        moved = ""
        diverged, before_curve = self._loss_now(), loss_curve(mon, entry.step)
        if entry.curve is not None and entry.curve[0]:  # recorded when the checkpoint was written: pre-fault
            before_curve = entry.curve
        try:
            if target is not None and target != pos_now:
                moved = backend.seek_data(target, run_context)
            restored = backend.restore(plan.loaded)
        except Exception as exc:  # data moved or weights half-loaded: no step may run on them
            backend.stop(run_context)
            raise HalfLoaded(f"the checkpoint of step {entry.step} failed to load half-way ({type(exc).__name__}: "
                             f"{exc}); the job stops rather than train on half-loaded weights") from exc
        n_skip = 0 if target is None or entry.data is None else max(target - entry.data, 0)
        resolved = self._close_firing(step, entry.step, n_skip)
        state = self._load_state(entry.path)
        self.health.rewound(entry.step)
        self.budget.spend(self.trained)
        self.rewound_to = entry.step
        detail = self._detail(step, plan, restored, moved, state, resolved, time.perf_counter() - started)
        if diverged is not None or before_curve[0]:
            n = mon.config.rewind.report_after
            self.report = RewindReport(entry.step + n, f"follow-up of {req.name if req else 'rewind'}",
                                       None, before_curve[0], before_curve[1], before_curve[2], diverged,
                                       {"from": step, "to": entry.step,
                                        **({"follow_up": req.command_id} if req and req.command_id else {})})
            detail += f"; the loss after {n} steps follows at step {entry.step + n:,}"
        return detail, entry

    def _detail(self, step: int, plan: _RewindPlan, restored: str, moved: str, state: str, resolved: list[str],
                took: float) -> str:
        """What a rewind answers: from where to where, what was skipped and restored, what it cost."""
        entry, target = plan.entry, plan.target
        redo = step - entry.step
        cost = self._device_hours(redo)
        skipped = ""
        if target is not None and entry.data is not None:
            n = target - entry.data
            skipped = (f"; batches {entry.data:,}-{target - 1:,} skipped ({n:,}, never read again)" if n > 0 else
                       "; no batch skipped")
        over = f" (over the budget: {plan.why})" if plan.spend is Spend.OVER else ""
        return (f"rewound from step {step:,} to the checkpoint of step {entry.step:,} ({entry.health.value}: "
                f"{entry.why}){skipped}; {redo:,} steps to redo" + (f", about {cost:.3g} device-hours" if cost
                                                                    is not None else "")
                + f"; {restored}" + (f"; {moved}" if moved else "") + f"; {state}"
                + (f"; closed as rewound: {', '.join(resolved)}" if resolved else "")
                + f"; now attempt {self.health.attempt}, {self.budget.left()} rewinds left{over}; took {took:.2f} s")

    def _loss_now(self) -> float | None:
        recent = [s.loss for s in self.monitor.recent() if s.loss is not None and math.isfinite(s.loss)]
        return recent[-1] if recent else None

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
                               f"of step {to_step:,}{how} (attempt {self.health.attempt + 1})", hint="rewound")
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

    def follow_up(self, step: int, r: RewindReport) -> str:
        """The follow-up report's text: the loss now against the pre-fault curve."""
        now = self._loss_now()
        xs = [s.loss for s in self.monitor.recent() if s.loss is not None and math.isfinite(s.loss)][-10:]
        mean = sum(xs) / len(xs) if xs else None
        if mean is None or r.mean is None:
            verdict = "no loss reported to compare"
        else:
            lim = r.mean + 3 * (r.noise or 0.0) + 1e-12
            verdict = (f"back on the pre-fault curve (at or below {r.mean:.4g} + 3 x {r.noise or 0:.2g})" if mean
                       <= lim else f"NOT back on the pre-fault curve yet (above {lim:.4g})")
        return (f"{step - int(r.params['to']):,} steps after the rewind to step {int(r.params['to']):,}: loss "
                + (f"{mean:.4g} (mean of the last {len(xs)} samples; last {now:.4g})" if mean is not None else "n/a")
                + f" against the pre-fault {r.before or 'curve (not enough samples)'}"
                + (f", {r.diverged:.4g} when the rewind was asked" if r.diverged is not None else "")
                + f": {verdict}")


__all__ = ["HalfLoaded", "RewindReport", "Rewinder"]
