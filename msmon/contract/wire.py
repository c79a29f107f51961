"""The wire schema: the records that leave the training job.

One definition, shared by the notifier (which makes them) and the bot (which receives them), so
the two cannot drift apart. Every record is a `msgspec.Struct`: typed, cheap to build on the
training thread, and validated on decode at the bot's edge.

Floating-point values are plain `float` here, NaN and Inf included. JSON has neither, so on the
wire (`encode` / `decode` below) a non-finite float is the string "NaN", "Infinity" or
"-Infinity", and only where the schema says float: a message that reads "NaN" stays a string.
Everything else is plain JSON, validated strictly on decode.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable
from typing import Annotated, Any, TypeVar

import msgspec

SCHEMA_VERSION = 1

# -- limits: what a sane job sends, enforced on decode (docs/openapi.yaml states the same numbers) ------
MAX_ID = 256  # run_id, device, rule, action, command id, label keys
MAX_TEXT = 65_536  # message, hint, detail, a path: generous (a MindSpore error message can run long)
MAX_ITEMS = 10_000  # records of one kind in one envelope; values in one chart window
MAX_COUNT = 2**53 - 1  # steps and counts: exact in every JSON reader (and far inside SQLite's 64 bits)
MAX_DEPTH = 32  # JSON nesting; the schema itself needs 6
RunId = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_ID)]
Id = Annotated[str, msgspec.Meta(max_length=MAX_ID)]
Text = Annotated[str, msgspec.Meta(max_length=MAX_TEXT)]
Step = Annotated[int, msgspec.Meta(ge=-MAX_COUNT, le=MAX_COUNT)]
Count = Annotated[int, msgspec.Meta(ge=0, le=MAX_COUNT)]
Version = Annotated[int, msgspec.Meta(ge=0, le=2**31 - 1)]
MAX_LABELS = 64  # labels of one run
Labels = Annotated[dict[Id, Text], msgspec.Meta(max_length=MAX_LABELS)]
Params = Annotated[dict[Id, object], msgspec.Meta(max_length=64)]


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

    run_id: RunId
    device: Id
    step: Step
    time: float  # unix seconds
    loss: float | None = None
    learning_rate: float | None = None
    grad_norm: float | None = None  # the norm of the reduced (all-reduced) gradient, where the job computes it
    # This rank's own gradient norm before the all-reduce (data-parallel runs): what tells one bad rank
    # apart; computed from the rank's own gradients, no collective operation added.
    local_grad_norm: float | None = None
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    step_time: float | None = None  # mean seconds per step since the previous sample
    max_step_time: float | None = None  # slowest single step since the previous sample
    elapsed: float | None = None  # seconds since the previous sample: the span the rates cover
    # This rank's own mean wait for its input per step over the same span (from one step's end to the next's
    # begin, on the host): in lockstep data parallel every rank's step_time is the slowest's, this is not.
    data_time: float | None = None
    # fp16 dynamic loss scaling: whether this step overflowed (its update skipped, its grad norm not a
    # measurement), the loss scale it ran with, and the steps skipped so far in the run where the job counts them.
    overflow: bool | None = None
    loss_scale: float | None = None
    skipped_steps: Count | None = None


class Window(msgspec.Struct, kw_only=True):
    """Recent values of every metric, oldest first, for the snapshot chart."""

    steps: Annotated[list[Step], msgspec.Meta(max_length=MAX_ITEMS)]
    loss: Annotated[list[float | None], msgspec.Meta(max_length=MAX_ITEMS)]
    learning_rate: Annotated[list[float | None], msgspec.Meta(max_length=MAX_ITEMS)]
    grad_norm: Annotated[list[float | None], msgspec.Meta(max_length=MAX_ITEMS)]
    tokens_per_s: Annotated[list[float | None], msgspec.Meta(max_length=MAX_ITEMS)]
    # samples/s, for the chart when the job reports no tokens/s (an older job sends none: empty)
    samples_per_s: Annotated[list[float | None], msgspec.Meta(max_length=MAX_ITEMS)] = msgspec.field(
        default_factory=list)
    # the steps of the window whose update fp16 loss scaling skipped (overflow), marked on the chart: a skip is
    # a skipped step, not a fault (an older job, or a run without loss scaling, sends none: empty)
    overflow_steps: Annotated[list[Step], msgspec.Meta(max_length=MAX_ITEMS)] = msgspec.field(default_factory=list)

    @classmethod
    def of(cls, samples: Iterable[Sample]) -> Window:
        """The window of these samples, oldest first: an event's chart (the job) or a run's status (the bot)."""
        recent = list(samples)
        return cls(steps=[s.step for s in recent], loss=[s.loss for s in recent],
                   learning_rate=[s.learning_rate for s in recent], grad_norm=[s.grad_norm for s in recent],
                   tokens_per_s=[s.tokens_per_s for s in recent], samples_per_s=[s.samples_per_s for s in recent],
                   overflow_steps=[s.step for s in recent if s.overflow])


class Event(msgspec.Struct, kw_only=True):
    """An alert (or its resolution) raised by a rule on one device of one run."""

    run_id: RunId
    device: Id
    step: Step
    time: float
    rule: Id
    severity: Severity
    status: Status
    value: float
    threshold: float
    message: Text
    hint: Text = ""
    metric: Id = ""
    baseline: float | None = None
    phase: Id = "default"
    repeat: bool = False  # a reminder that a rule is still firing, not a new alert
    actions: Annotated[list[Params], msgspec.Meta(max_length=64)] = msgspec.field(default_factory=list)
    window: Window | None = None
    schema: Version = SCHEMA_VERSION

    @property
    def fingerprint(self) -> tuple[str, str, str]:
        """What makes two events "the same alert": run, rule and device."""
        return (self.run_id, self.rule, self.device)


class ActionResult(msgspec.Struct, kw_only=True):
    """What a job action (msmon/contract/actions.py: save_checkpoint, pause, resume, ...) did."""

    run_id: RunId
    device: Id
    step: Step
    time: float
    action: Id
    ok: bool
    detail: Text  # e.g. the checkpoint path, "lr 3e-4 -> 1.5e-4", or what went wrong
    params: Params = msgspec.field(default_factory=dict)
    source: Text = ""  # "rule grad_norm ERROR", "command c17 from @alice", "code"
    path: Text | None = None  # the checkpoint written, if any
    command_id: Id | None = None  # set when the action came from a chat command
    applied: bool = True  # False: answered but not acted on (cancelled by a later command, moot, job stopped)
    paused: bool | None = None  # pause / resume: whether the job is paused after this answer
    schema: Version = SCHEMA_VERSION


class Command(msgspec.Struct, kw_only=True):
    """A chat command on its way to a job: applied by every rank at the first step boundary at or
    after `apply_step` (so data-parallel ranks act together), at most once per id, answered with
    an ActionResult carrying `command_id`."""

    id: str
    run_id: str
    action: str  # a chat action of msmon/contract/actions.py: pause, resume, save_checkpoint, ...
    params: dict[str, object] = msgspec.field(default_factory=dict)
    apply_step: int = 0
    issued_by: str = ""
    issued_at: float = 0.0
    expires_at: float = 0.0
    schema: int = SCHEMA_VERSION


class ActionRequest(msgspec.Struct, kw_only=True):
    """A configured action (monitor_config `actions:`) that a rule fired on one rank of a multi-rank run,
    sent to the bot instead of applied there: the bot makes it a Command that every rank of the run applies
    at the same step (one command for the same action asked by several ranks while it waits)."""

    run_id: RunId
    device: Id
    step: Step  # the step the rule fired at
    time: float
    rule: Id
    severity: Severity
    action: Id  # an automatic action of msmon/contract/actions.py: pause, save_checkpoint, scale_lr, stop
    params: Params = msgspec.field(default_factory=dict)
    rank: Annotated[int, msgspec.Meta(ge=0, le=2**31 - 1)] | None = None
    host: Id = ""
    project: Id | None = None  # the job's project (Heartbeat.project): which project's run of that id it is
    schema: Version = SCHEMA_VERSION


class Poll(msgspec.Struct, kw_only=True):
    """A job's long poll for commands: those of its run issued after `after` (a cursor the bot hands
    back), waiting up to `wait` seconds for one."""

    run_id: RunId
    device: Id
    after: Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)] = 0
    wait: Annotated[float, msgspec.Meta(ge=0, le=3600)] = 20.0
    project: Id | None = None  # the job's project (Heartbeat.project): which project's run of that id it is


class PollAnswer(msgspec.Struct, kw_only=True):
    commands: list[Command] = msgspec.field(default_factory=list)
    cursor: int = 0


MAX_RING = 64  # health checkpoints a heartbeat lists (the job keeps checkpoint_ring.keep of them, plus one)


class RingCheckpoint(msgspec.Struct, kw_only=True):
    """One health checkpoint the job keeps (notifier/checkpoints.py): its step, when it was written, whether the
    rules judged its step healthy ("pending", "healthy", "unhealthy") and why, the run's attempt it was written in."""

    step: Step
    time: float
    health: Id
    why: Annotated[str, msgspec.Meta(max_length=512)] = ""
    attempt: Count = 0


class Heartbeat(msgspec.Struct, kw_only=True):
    """Sent every few seconds by a job's transport thread: alive, and at which step."""

    run_id: RunId
    device: Id
    time: float
    step: Step | None = None  # the last step reported (None: not started)
    paused: bool = False
    host: Id = ""
    pid: Annotated[int, msgspec.Meta(ge=0, le=2**32)] = 0
    total_steps: Count | None = None  # the run's plan (monitor_config training.*), for status and ETA
    target_loss: float | None = None
    final: bool = False  # the job ended normally: its last heartbeat (the bot raises no job_gone after it)
    # Who sends it, so that a heartbeat alone creates and credits the right run and rank (bot/runs): the project
    # the job says it belongs to (None: an older notifier; the token's project decides), its rank in the job's
    # world and the world's size (None: a single process, or not known), the sending process's own nonce
    # (one per start of the process: a re-run is a new attempt) and the process's own sequence number, which
    # orders its heartbeats so that one overtaken in flight never moves a rank back.
    project: Id | None = None
    rank: Annotated[int, msgspec.Meta(ge=0, le=2**31 - 1)] | None = None
    world: Annotated[int, msgspec.Meta(ge=1, le=2**31)] | None = None
    proc: Id = ""
    seq: Count | None = None
    # The job's health checkpoints, oldest first (None: it keeps none, or an older notifier), and its attempt: the
    # rewinds applied so far (a rewind makes the run's next attempt without a new process).
    checkpoints: Annotated[list[RingCheckpoint], msgspec.Meta(max_length=MAX_RING)] | None = None
    attempt: Count | None = None


class Envelope(msgspec.Struct, kw_only=True):
    """One POST from a job to the bot: whatever accumulated since the last one."""

    run_id: RunId
    device: Id
    sent_at: float
    project: Id = "default"
    # Who sent it, for the bot's view across ranks (bot/ranks): the rank in the job's world (None: a
    # single-process job, or not known) and the host it runs on.
    rank: Annotated[int, msgspec.Meta(ge=0, le=2**31 - 1)] | None = None
    host: Id = ""
    proc: Id = ""  # the sending process's nonce (Heartbeat.proc): an envelope of an older attempt is told apart
    labels: Labels = msgspec.field(default_factory=dict)
    events: Annotated[list[Event], msgspec.Meta(max_length=MAX_ITEMS)] = msgspec.field(default_factory=list)
    samples: Annotated[list[Sample], msgspec.Meta(max_length=MAX_ITEMS)] = msgspec.field(default_factory=list)
    heartbeats: Annotated[list[Heartbeat], msgspec.Meta(max_length=MAX_ITEMS)] = msgspec.field(default_factory=list)
    actions: Annotated[list[ActionResult], msgspec.Meta(max_length=MAX_ITEMS)] = msgspec.field(default_factory=list)
    # kind -> items dropped while unreachable
    dropped: Annotated[dict[Id, Count], msgspec.Meta(max_length=64)] = msgspec.field(default_factory=dict)
    schema: Version = SCHEMA_VERSION


# -- JSON with NaN and Inf ------------------------------------------------------------------

_TO_WIRE = {math.inf: "Infinity", -math.inf: "-Infinity"}
_FROM_WIRE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
T = TypeVar("T")


# -- what a job may call itself: one check for the job's config (msmon check-config), bot.yaml and the bot ----------

def project_problem(project: object) -> str | None:
    """Why the bot would refuse `project` as a job's project (None: it takes it)."""
    if not isinstance(project, str):
        return f"a project is a name (text), not {type(project).__name__}"
    if not project.strip():
        return "a project needs a name (it keeps its runs, routes and commands apart from other projects')"
    if len(project) > MAX_ID:
        return f"a project name has at most {MAX_ID} characters; this one has {len(project):,}"
    return None


def labels_problem(labels: object) -> str | None:
    """Why the bot would refuse a run's `labels` (None: it takes them): the wire's own Labels type decides;
    the message says which bound."""
    try:
        msgspec.convert(labels, Labels)
    except msgspec.ValidationError:
        pass
    else:
        return None
    if not isinstance(labels, dict):
        return f"labels are a mapping of names to text, not {type(labels).__name__}"
    if len(labels) > MAX_LABELS:
        return f"at most {MAX_LABELS} labels; these are {len(labels):,}"
    for key, value in labels.items():
        if not isinstance(key, str) or len(key) > MAX_ID:
            return f"a label name is text of at most {MAX_ID} characters: {str(key)[:40]!r}..."
        if not isinstance(value, str) or len(value) > MAX_TEXT:
            return f"label {key[:40]!r}: a value is text of at most {MAX_TEXT:,} characters"
    return "not labels the bot takes"


def tag_nonfinite(obj: Any) -> Any:
    """Builtins (dicts, lists, scalars) with every NaN and Inf as the wire's strings ("NaN", "Infinity",
    "-Infinity"): JSON any reader takes. The codec's own tagging, for the bot's API answers too."""
    if isinstance(obj, float):
        if obj != obj:
            return "NaN"
        return _TO_WIRE.get(obj, obj)
    if isinstance(obj, dict):
        return {k: tag_nonfinite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [tag_nonfinite(v) for v in obj]
    return obj


def _finite(obj: Any) -> bool:
    """No NaN or Inf anywhere in `obj` (Structs, lists, dicts, scalars)."""
    t = type(obj)
    if t is float:
        return bool(obj - obj == 0.0)  # False for NaN and +-Inf
    if t is str or t is int or obj is None or t is bool:
        return True
    if isinstance(obj, msgspec.Struct):
        return all(_finite(getattr(obj, f)) for f in obj.__struct_fields__)
    if t is list or t is tuple:
        return all(_finite(x) for x in obj)
    if t is dict:
        return all(_finite(x) for x in obj.values())
    return True


def encode(obj: Any) -> bytes:
    """JSON bytes for a wire Struct (or a list of them), non-finite floats as strings."""
    if _finite(obj):
        return msgspec.json.encode(obj)  # the common case: msgspec's own encoder, nothing to tag
    return msgspec.json.encode(tag_nonfinite(msgspec.to_builtins(obj)))


def _takes_float(t: Any) -> bool:
    if isinstance(t, msgspec.inspect.FloatType):
        return True
    return isinstance(t, msgspec.inspect.UnionType) and any(
        isinstance(x, msgspec.inspect.FloatType) for x in t.types)


def _untag(obj: Any, t: Any) -> Any:
    """Restore non-finite floats where the schema `t` (msgspec.inspect type info) expects a float."""
    if isinstance(obj, str):
        return _FROM_WIRE.get(obj, obj) if _takes_float(t) else obj
    if isinstance(t, msgspec.inspect.UnionType):
        for x in t.types:
            if isinstance(obj, dict) and isinstance(x, (msgspec.inspect.StructType, msgspec.inspect.DictType)):
                return _untag(obj, x)
            if isinstance(obj, list) and isinstance(x, msgspec.inspect.ListType):
                return _untag(obj, x)
        return obj
    if isinstance(t, msgspec.inspect.StructType) and isinstance(obj, dict):
        fields = {f.encode_name: f.type for f in t.fields}
        return {k: _untag(v, fields[k]) if k in fields else v for k, v in obj.items()}
    if isinstance(t, msgspec.inspect.ListType) and isinstance(obj, list):
        return [_untag(v, t.item_type) for v in obj]
    if isinstance(t, msgspec.inspect.DictType) and isinstance(obj, dict):
        return {k: _untag(v, t.value_type) for k, v in obj.items()}
    return obj


_INFO: dict[Any, Any] = {}
_FREE: dict[Any, tuple[str, ...]] = {}


def _untyped(t: Any) -> bool:
    """Whether msgspec type info `t` can hold untyped JSON (`object`) somewhere inside."""
    if isinstance(t, msgspec.inspect.AnyType) or (isinstance(t, msgspec.inspect.CustomType) and t.cls is object):
        return True
    if isinstance(t, msgspec.inspect.StructType):
        return any(_untyped(f.type) for f in t.fields)
    if isinstance(t, (msgspec.inspect.ListType, msgspec.inspect.SetType, msgspec.inspect.FrozenSetType,
                      msgspec.inspect.VarTupleType)):
        return _untyped(t.item_type)
    if isinstance(t, msgspec.inspect.DictType):
        return _untyped(t.value_type)
    if isinstance(t, msgspec.inspect.UnionType):
        return any(_untyped(x) for x in t.types)
    return False


def _free_fields(cls: type) -> tuple[str, ...]:
    """The fields of Struct `cls` that can hold untyped JSON (params, an event's actions), found once."""
    names = _FREE.get(cls)
    if names is None:
        info = msgspec.inspect.type_info(cls)
        assert isinstance(info, msgspec.inspect.StructType)
        names = _FREE[cls] = tuple(f.name for f in info.fields if _untyped(f.type))
    return names


def _too_deep(obj: Any, left: int) -> bool:
    """Whether `obj` nests deeper than `left` more levels, looking only where untyped JSON can be: the
    schema bounds the rest (a batch of samples is not walked at all)."""
    if left < 0:
        return True
    if isinstance(obj, msgspec.Struct):
        return any(_too_deep(getattr(obj, f), left - 1) for f in _free_fields(type(obj)))
    if isinstance(obj, (list, tuple)):
        return any(_too_deep(x, left - 1) for x in obj)
    if isinstance(obj, dict):
        return any(_too_deep(x, left - 1) for x in obj.values())
    return False


def decode(raw: bytes | str, type: type[T]) -> T:  # noqa: A002 - msgspec's own name for it
    """Parse and validate wire JSON into `type`; raises msgspec.ValidationError / DecodeError with
    the path of what is wrong (the bot turns those into 4xx answers). JSON nested deeper than
    MAX_DEPTH levels is a DecodeError: the schema bounds the typed parts, and the untyped ones (params)
    are measured, so that no deep value reaches code that recurses."""
    data = raw.encode() if isinstance(raw, str) else raw
    try:
        if b'"NaN"' not in data and b'Infinity"' not in data:
            obj = msgspec.json.decode(data, type=type)  # nothing tagged: msgspec's own fast, strict path
        else:
            info = _INFO.get(type)
            if info is None:
                info = _INFO[type] = msgspec.inspect.type_info(type)
            obj = msgspec.convert(_untag(msgspec.json.decode(data), info), type)
    except RecursionError:  # hundreds of levels: msgspec (or _untag) ran out of stack before the schema said no
        raise msgspec.DecodeError(f"JSON nested too deep; at most {MAX_DEPTH} levels are accepted") from None
    if isinstance(obj, msgspec.Struct) and _too_deep(obj, MAX_DEPTH):
        raise msgspec.DecodeError(f"JSON nested too deep (in params or actions); at most {MAX_DEPTH} levels are "
                                  "accepted")
    return obj
