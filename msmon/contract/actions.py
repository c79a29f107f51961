"""The job actions: one table that the job (JobControl, the config's `actions:`) and the bot (the command
parser, the command service) read, so a new action is added in one place.

Each action has a wire name (`Command.action`, `ActionResult.action`), a chat verb (`save-checkpoint`),
and says whether a chat user may send it, whether it changes the job (only `commands.allow` may send
those), whether a rule's `actions:` may run it by itself, which parameters it takes and, for chat, its
usage, summary, example and aliases. The order is the order `help` lists the chat verbs in.

Each parameter has a kind (`KINDS`): what values it takes, checked by `check_param` / `check_params` where a
command enters (the chat parser, the command service, the bot's `/v1/actions/request`, the job's `actions:`) and
again where it acts (every rank's JobControl), so job and bot refuse the same values with the same words.

Standard library only: importable by the job and the bot alike.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping


@dataclasses.dataclass(frozen=True)
class Param:
    """One parameter of an action: its name, what it means, whether the action needs it, a sample value."""

    name: str
    doc: str
    required: bool = False
    example: str = ""
    rule_key: bool = True  # a rule's `actions:` entry may set it (False: the job or the bot fills it in)
    kind: str = "name"  # what values it takes: a key of KINDS


@dataclasses.dataclass(frozen=True)
class Action:
    """One job action, as every part of msmon knows it."""

    name: str  # the wire name: save_checkpoint
    params: tuple[Param, ...] = ()
    chat: bool = False  # a chat user may send it, as `verb`
    destructive: bool = True  # it changes the job: only those in commands.allow may send it
    automatic: bool = False  # a rule's `actions:` may run it when the rule fires
    usage: str = ""  # chat only, like the other texts below
    summary: str = ""
    example: str = ""
    aliases: tuple[str, ...] = ()

    @property
    def verb(self) -> str:
        """The chat verb: the wire name with `-` for `_` (`save-checkpoint`)."""
        return self.name.replace("_", "-")

    def param(self, name: str) -> Param | None:
        """The parameter called `name`, or None when the action takes no such parameter."""
        return next((p for p in self.params if p.name == name), None)



# -- what a parameter's value may be ---------------------------------------------------------------------------------

FLOAT32_MIN_NORMAL = 1.1754943508222875e-38  # the smallest positive normal float32 (numpy.finfo(float32).tiny)
MAX_NORM = 1e12  # clip-grad's max_norm: at most this (a float32 holds it exactly enough; larger clips nothing anyway)
MAX_LR_FACTOR = 100.0  # scale-lr's factor: in (0, MAX_LR_FACTOR]
MAX_SECONDS = 30 * 86400.0  # a pause's timeout, a loosening's duration: at most 30 days
MAX_STEP = 2**53 - 1  # a step number: what a float64 (JSON, the store) holds exactly
MAX_SKIP = 2**31 - 1  # batches a rewind skips: MindSpore's dataset position is a 32-bit step; the job checks the
# batches it has left (dataset size x epochs) when it acts
MAX_NAME = 256  # a rule, device or command id: as long as the wire's ids


class ParamError(ValueError):
    """A parameter value an action does not take; the message names the action, the key and the allowed values."""


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    x = float(value)
    return x if math.isfinite(x) else None


def _whole(lo: int, hi: int, what: str) -> Callable[[object], tuple[object, str]]:
    def check(value: object) -> tuple[object, str]:
        x = _number(value)
        ok = x is not None and x.is_integer() and lo <= x <= hi
        return (int(x) if ok and x is not None else None), f"a whole number of {what} in [{lo:,}, {hi:,}]"
    return check


def _real(lo: float, hi: float, lo_open: bool, what: str) -> Callable[[object], tuple[object, str]]:
    def check(value: object) -> tuple[object, str]:
        x = _number(value)
        ok = x is not None and (lo < x if lo_open else lo <= x) and x <= hi
        return (x if ok else None), f"{what} in {'(' if lo_open else '['}{lo:g}, {hi:g}]"
    return check


def _norm(value: object) -> tuple[object, str]:
    """0 (no clipping), or a positive normal float32 at most MAX_NORM: the job's clip norm is a float32 Parameter,
    where 1e-50 would be 0 (clipping off) and 1e-40 a subnormal."""
    x = _number(value)
    ok = x is not None and (x == 0 or FLOAT32_MIN_NORMAL <= x <= MAX_NORM)
    return (x if ok else None), (f"0 (no clipping) or a number in [{FLOAT32_MIN_NORMAL:.9g}, {MAX_NORM:g}] (a positive "
                                 "normal float32: a smaller one is 0 or a subnormal in the job's float32 clip norm)")


def _name(value: object) -> tuple[object, str]:
    ok = isinstance(value, str) and 0 < len(value) <= MAX_NAME and value.isprintable()
    return (value if ok else None), f"a name of 1 to {MAX_NAME} printable characters"


def _level(value: object) -> tuple[object, str]:
    ok = isinstance(value, str) and value.lower() in ("warning", "error")
    return (value.lower() if ok and isinstance(value, str) else None), "warning or error"


# kind -> check(value) -> (the value to use, or None when refused; what the kind takes, for the message)
KINDS: dict[str, Callable[[object], tuple[object, str]]] = {
    "step": _whole(0, MAX_STEP, "steps"),
    "before": _whole(-1, MAX_STEP, "steps (-1: the job's newest alert)"),
    "batches": _whole(0, MAX_SKIP, "batches"),
    "attempt": _whole(0, 2**31 - 1, "attempts"),
    "norm": _norm,
    "lr_factor": _real(0.0, MAX_LR_FACTOR, True, "a number"),
    "positive": _real(0.0, 1e300, True, "a number"),
    "level_value": _real(-1e300, 1e300, False, "a finite number"),
    "seconds": _real(0.0, MAX_SECONDS, True, "seconds"),
    "level": _level,
    "name": _name,
}

_TIMEOUT = Param("timeout", "seconds before the pause ends by itself (none: waits for a resume)", example="600",
                 kind="seconds")
_FACTOR = Param("factor", "the LR multiplier", required=True, example="0.5", kind="lr_factor")
_RULE = Param("rule", "the rule whose levels change", required=True, example="grad_norm")
# rewind's parameters. `before` and `alert` are filled in by the job when a rule's `actions:` asks for a rewind (the
# step the rule fired at, and the rule); `attempt` is the run's attempt the alert was raised in (a rewind asked for
# in an attempt already rewound is moot): the same on every rank, so every rank decides the same.
_REWIND = (
    Param("to", "the step to go back to: the newest healthy checkpoint at or before it", example="41000",
          rule_key=False, kind="step"),
    Param("before", "go back to the newest healthy checkpoint before this step (the alert's first step; -1, chat's "
                    "`before-alert`: the job's own newest alert)", example="41200", rule_key=False, kind="before"),
    Param("skip", "batches to skip after the checkpoint's data position (none: every batch read since the "
                  "checkpoint, nothing is read twice; at most the batches the job has left)", example="300",
          kind="batches"),
    Param("alert", "the rule whose alert asked for the rewind (its episode is closed as rewound)",
          example="loss_spike", rule_key=False),
    Param("attempt", "the run's attempt the alert was raised in (a rewind from an attempt already rewound is "
                     "moot)", example="0", rule_key=False, kind="attempt"),
)

ACTIONS: dict[str, Action] = {a.name: a for a in (
    Action("pause", (_TIMEOUT,), chat=True, automatic=True, usage="pause <run>",
           summary="pause training (resume continues it)", example="pause run-42"),
    Action("resume", chat=True, usage="resume <run>", summary="resume a paused run", example="resume run-42",
           aliases=("unpause", "continue")),
    Action("save_checkpoint", chat=True, automatic=True, usage="save-checkpoint <run>",
           summary="save a checkpoint now", example="save-checkpoint run-42", aliases=("checkpoint", "save", "ckpt")),
    Action("loosen_threshold", (
        _RULE,
        Param("value", "the main level (WARNING if set, else ERROR) it gets; the other moves in proportion",
              kind="positive"),
        Param("factor", "what both levels are multiplied by (instead of a value)", kind="positive"),
        Param("duration", "seconds after which the levels are restored (none: for the rest of the run)",
              kind="seconds"),
    ), chat=True, usage="loosen-threshold <run> <rule> <value|xFACTOR> [for <duration>]",
        summary="raise a rule's threshold to a level or by a factor (xFACTOR), optionally for a while",
        example="loosen-threshold run-42 grad_norm x1.5 for 2h", aliases=("loosen", "threshold")),
    Action("scale_lr", (_FACTOR,), chat=True, automatic=True, usage="scale-lr <run> <factor>",
           summary="multiply the learning rate by a factor in (0, 100]", example="scale-lr run-42 0.5",
           aliases=("lr",)),
    Action("rewind", _REWIND, chat=True, automatic=True, usage="rewind <run> [to <step>|before-alert] [skip <N>]",
           summary="load a healthy checkpoint on every rank at one step and skip the batches after it",
           example="rewind run-42 before-alert skip 300"),
    Action("clip_grad", (Param("max_norm", "the global grad norm gradients are clipped to (0: no clipping; else a "
                                           "positive normal float32 at most 1e12)", required=True, example="1.0",
                               kind="norm"),),
           chat=True, automatic=True, usage="clip-grad <run> <max_norm|off>",
           summary="clip the global grad norm from the next step on (off: no clipping)",
           example="clip-grad run-42 1.0"),
    Action("stop", chat=True, automatic=True, usage="stop <run> [confirm]",
           summary="checkpoint, then stop; asks for confirmation (`stop <run> confirm` confirms)",
           example="stop run-42 confirm"),
    Action("set_threshold", (
        _RULE, Param("value", "the new level", required=True, kind="level_value"),
        Param("level", "warning (the default) or error", kind="level"),
    )),
    Action("restore_threshold", (
        Param("undo", "the loosening to undo (the id of the command that loosened)", required=True),
        Param("rule", "the rule, for the answer"),
    )),
    # Sent by the bot when a person acks an alert in chat (`ack <run>/<rule>`): a shift the rule holds is the
    # new normal. Changes no training, so anyone who may ack may send it.
    Action("acknowledge", (
        Param("rule", "the rule whose alert was acknowledged", required=True),
        Param("device", "the device it was acknowledged on (none: every device)"),
    ), destructive=False),
)}



def check_param(action: str, name: str, value: object) -> object:
    """The value `action`'s parameter `name` takes for `value` (a whole number as an int, a level lower-cased);
    ParamError naming the action, the key and what it takes otherwise."""
    a = ACTIONS.get(action)
    if a is None:
        raise ParamError(f"unknown action {action[:40]!r}; actions are {', '.join(ACTIONS)}")
    p = a.param(name)
    if p is None:
        takes = ", ".join(x.name for x in a.params) or "none"
        raise ParamError(f"{action} takes no parameter {name[:40]!r} (its parameters: {takes})")
    got, takes = KINDS[p.kind](value)
    if got is None:
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
        raise ParamError(f"{action}'s {name} must be {takes}, not {shown}")
    return got


def check_params(action: str, params: Mapping[str, object]) -> dict[str, object]:
    """Every parameter of `params` checked (`check_param`), and every required one there: the parameters as the
    job applies them. ParamError for the first that is not."""
    out = {name: check_param(action, name, value) for name, value in params.items()}
    for p in ACTIONS[action].params:
        if p.required and p.name not in out:
            raise ParamError(f"{action} needs a {p.name}, e.g. {p.example}")
    return out


# chat verb -> wire name of the action it queues (`save-checkpoint` -> `save_checkpoint`)
VERB_ACTION: dict[str, str] = {a.verb: a.name for a in ACTIONS.values() if a.chat}
# what a rule's `actions:` may run by itself
AUTOMATIC: tuple[str, ...] = tuple(a.name for a in ACTIONS.values() if a.automatic)

if any(p.kind not in KINDS for a in ACTIONS.values() for p in a.params):
    raise ImportError("msmon.contract.actions: a parameter's kind is not one of KINDS")

__all__ = ["ACTIONS", "AUTOMATIC", "FLOAT32_MIN_NORMAL", "KINDS", "MAX_NORM", "MAX_SKIP", "VERB_ACTION", "Action",
           "Param", "ParamError", "check_param", "check_params"]
