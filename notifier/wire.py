"""The wire schema: the records that leave the training job.

One definition, shared by the notifier (which makes them) and the bot (which receives them), so
the two cannot drift apart. Every record is a `msgspec.Struct`: typed, cheap to build on the
training thread, and validated on decode at the bot's edge.

Floating-point values are plain `float` here, NaN and Inf included; how they travel over JSON
(which has neither) is decided by the transport, not by these types.
"""

from __future__ import annotations

import enum

import msgspec

SCHEMA_VERSION = 1


class Severity(str, enum.Enum):
    """How bad a finding is. ERROR pages someone; WARNING is read in the morning."""

    WARNING = "WARNING"
    ERROR = "ERROR"

    @property
    def rank(self) -> int:
        return 2 if self is Severity.ERROR else 1


class Status(str, enum.Enum):
    FIRING = "firing"
    RESOLVED = "resolved"


class Sample(msgspec.Struct, kw_only=True, gc=False):
    """The metrics of one sampled step on one device (also one CSV row)."""

    run_id: str
    device: str
    step: int
    time: float  # unix seconds
    loss: float | None = None
    learning_rate: float | None = None
    grad_norm: float | None = None
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    step_time: float | None = None  # mean seconds per step since the previous sample
    max_step_time: float | None = None  # slowest single step since the previous sample
    elapsed: float | None = None  # seconds since the previous sample: the span the rates cover


class Window(msgspec.Struct, kw_only=True):
    """Recent values of every metric, oldest first, for the snapshot chart."""

    steps: list[int]
    loss: list[float | None]
    learning_rate: list[float | None]
    grad_norm: list[float | None]
    tokens_per_s: list[float | None]


class Event(msgspec.Struct, kw_only=True):
    """An alert (or its resolution) raised by a rule on one device of one run."""

    run_id: str
    device: str
    step: int
    time: float
    rule: str
    severity: Severity
    status: Status
    value: float
    threshold: float
    message: str
    hint: str = ""
    metric: str = ""
    baseline: float | None = None
    phase: str = "default"
    repeat: bool = False  # a reminder that a rule is still firing, not a new alert
    actions: list[dict[str, object]] = msgspec.field(default_factory=list)
    window: Window | None = None
    schema: int = SCHEMA_VERSION

    @property
    def fingerprint(self) -> tuple[str, str, str]:
        """What makes two events "the same alert": run, rule and device."""
        return (self.run_id, self.rule, self.device)


class ActionResult(msgspec.Struct, kw_only=True):
    """What a job action (save_checkpoint, pause, resume, scale_lr, set_threshold, stop) did."""

    run_id: str
    device: str
    step: int
    time: float
    action: str
    ok: bool
    detail: str  # e.g. the checkpoint path, "lr 3e-4 -> 1.5e-4", or what went wrong
    params: dict[str, object] = msgspec.field(default_factory=dict)
    source: str = ""  # "rule grad_norm ERROR", "command 17 from @alice", "code"
    path: str | None = None  # the checkpoint written, if any
    schema: int = SCHEMA_VERSION
