"""The job actions: one table that the job (JobControl, the config's `actions:`) and the bot (the command
parser, the command service) read, so a new action is added in one place.

Each action has a wire name (`Command.action`, `ActionResult.action`), a chat verb (`save-checkpoint`),
and says whether a chat user may send it, whether it changes the job (only `commands.allow` may send
those), whether a rule's `actions:` may run it by itself, which parameters it takes and, for chat, its
usage, summary, example and aliases. The order is the order `help` lists the chat verbs in.

Standard library only: importable by the job and the bot alike.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Param:
    """One parameter of an action: its name, what it means, whether the action needs it, a sample value."""

    name: str
    doc: str
    required: bool = False
    example: str = ""
    rule_key: bool = True  # a rule's `actions:` entry may set it (False: the job or the bot fills it in)


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


_TIMEOUT = Param("timeout", "seconds before the pause ends by itself (none: waits for a resume)", example="600")
_FACTOR = Param("factor", "the LR multiplier", required=True, example="0.5")
_RULE = Param("rule", "the rule whose levels change", required=True, example="grad_norm")
# rewind's parameters. `before` and `alert` are filled in by the job when a rule's `actions:` asks for a rewind (the
# step the rule fired at, and the rule); `attempt` is the run's attempt the alert was raised in (a rewind asked for
# in an attempt already rewound is moot): the same on every rank, so every rank decides the same.
_REWIND = (
    Param("to", "the step to go back to: the newest healthy checkpoint at or before it", example="41000",
          rule_key=False),
    Param("before", "go back to the newest healthy checkpoint before this step (the alert's first step; -1, chat's "
                    "`before-alert`: the job's own newest alert)", example="41200", rule_key=False),
    Param("skip", "batches to skip after the checkpoint's data position (none: every batch read since the "
                  "checkpoint, nothing is read twice)", example="300"),
    Param("alert", "the rule whose alert asked for the rewind (its episode is closed as rewound)",
          example="loss_spike", rule_key=False),
    Param("attempt", "the run's attempt the alert was raised in (a rewind from an attempt already rewound is "
                     "moot)", example="0", rule_key=False),
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
        Param("value", "the main level (WARNING if set, else ERROR) it gets; the other moves in proportion"),
        Param("factor", "what both levels are multiplied by (instead of a value)"),
        Param("duration", "seconds after which the levels are restored (none: for the rest of the run)"),
    ), chat=True, usage="loosen-threshold <run> <rule> <value|xFACTOR> [for <duration>]",
        summary="raise a rule's threshold to a level or by a factor (xFACTOR), optionally for a while",
        example="loosen-threshold run-42 grad_norm x1.5 for 2h", aliases=("loosen", "threshold")),
    Action("scale_lr", (_FACTOR,), chat=True, automatic=True, usage="scale-lr <run> <factor>",
           summary="multiply the learning rate by a factor in (0, 100]", example="scale-lr run-42 0.5",
           aliases=("lr",)),
    Action("rewind", _REWIND, chat=True, automatic=True, usage="rewind <run> [to <step>|before-alert] [skip <N>]",
           summary="load a healthy checkpoint on every rank at one step and skip the batches after it",
           example="rewind run-42 before-alert skip 300"),
    Action("clip_grad", (Param("max_norm", "the global grad norm gradients are clipped to (0: no clipping)",
                               required=True, example="1.0"),),
           chat=True, automatic=True, usage="clip-grad <run> <max_norm|off>",
           summary="clip the global grad norm from the next step on (off: no clipping)",
           example="clip-grad run-42 1.0"),
    Action("stop", chat=True, automatic=True, usage="stop <run> [confirm]",
           summary="checkpoint, then stop; asks for confirmation (`stop <run> confirm` confirms)",
           example="stop run-42 confirm"),
    Action("set_threshold", (
        _RULE, Param("value", "the new level", required=True), Param("level", "warning (the default) or error"),
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

# chat verb -> wire name of the action it queues (`save-checkpoint` -> `save_checkpoint`)
VERB_ACTION: dict[str, str] = {a.verb: a.name for a in ACTIONS.values() if a.chat}
# what a rule's `actions:` may run by itself
AUTOMATIC: tuple[str, ...] = tuple(a.name for a in ACTIONS.values() if a.automatic)

__all__ = ["ACTIONS", "AUTOMATIC", "VERB_ACTION", "Action", "Param"]
