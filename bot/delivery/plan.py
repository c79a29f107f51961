"""What the delivery worker does with one due group of alert rows: post a new message, reply in a thread,
rewrite a message, attach the chart to a post an earlier try made, or nothing. Pure: the worker reads what
the store knows about the group (`Known`), `step` decides, the worker carries it out and records it.

    kind      what the store knows                                  the step
    alert     posted on an earlier try                              ATTACH to it (its chart is what is left)
              no message for the group, a WARNING, the run has a    REPLY in the root's thread, kept as the
                root message in the channel                           group's message
              no message for the group                              POST (the run's root if it has none yet)
              a message for the group (more devices joined)         UPDATE it with every device
    repeat    posted on an earlier try                              ATTACH
              no message for the group                              POST
              a message for the group                               REPLY in its thread (a reminder)
    resolve   nothing was posted for the episode                    NOTHING
              the episode's firing post, its reply not sent yet     REPLY in its thread ...
              ... and every device that fired has resolved          ... and CLOSE: rewrite the post as resolved
"""

from __future__ import annotations

import dataclasses
import enum


class Op(enum.Enum):
    POST = "post"  # a new message; its reference is stored at once, its chart follows
    REPLY = "reply"  # in the thread of `ref`
    UPDATE = "update"  # rewrite the message `ref` (more devices joined its group)
    ATTACH = "attach"  # the message went out on an earlier try (`ref`): only its chart is left
    NOTHING = "nothing"


@dataclasses.dataclass(frozen=True)
class Known:
    """What the store knows about a group when it is tried (read by the worker)."""

    posted: str | None = None  # this group's message went out on an earlier try (its reference)
    own: str | None = None  # the message stored under the group's key
    root: str | None = None  # alerts: the run's first message in this channel
    thread: bool = False  # alerts: the group's first event asks to go in the run's thread (a WARNING)
    firing: str | None = None  # resolves: the episode's firing post
    all_resolved: bool = False  # resolves: every device that fired has now resolved


@dataclasses.dataclass(frozen=True)
class Step:
    op: Op
    ref: str | None = None  # the message replied to, rewritten or attached to
    as_root: bool = False  # POST: the new message is the run's root in this channel
    keep_reply: bool = False  # REPLY: store the reply's thread under the group's key (it stands for the alert)
    close: str | None = None  # resolves: rewrite this firing post as resolved, then retire it


def step(kind: str, known: Known) -> Step:
    """The step for a group of `kind` ("alert", "repeat" or "resolve") given what the store knows."""
    if kind == "resolve":
        if known.firing is None:
            return Step(Op.NOTHING)
        close = known.firing if known.all_resolved else None
        if known.posted is not None:
            return Step(Op.NOTHING, close=close)
        return Step(Op.REPLY, known.firing, close=close)
    if known.posted is not None:
        return Step(Op.ATTACH, known.posted)
    if kind == "repeat":
        return Step(Op.POST) if known.own is None else Step(Op.REPLY, known.own)
    if known.own is not None:
        return Step(Op.UPDATE, known.own)
    if known.thread and known.root is not None:
        return Step(Op.REPLY, known.root, keep_reply=True)
    return Step(Op.POST, as_root=known.root is None)
