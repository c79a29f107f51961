"""The msmon command language: text in, a `Parsed` command (or a `CommandError` to show the user) out.

Pure code: no I/O, no clock. Grammar (verbs are case-insensitive; run ids keep their case)::

    status <run>                 step, loss/lr/grad norm/throughput vs baseline, firing alerts, ETA, chart
    runs                         the runs the bot knows
    pause <run>
    resume <run>
    save-checkpoint <run>
    loosen-threshold <run> <rule> <value|xFACTOR> [for <duration>]
    scale-lr <run> <factor>
    rewind <run> [to <step>|before-alert] [skip <N>]   load a healthy checkpoint on every rank (docs/rewind.md)
    clip-grad <run> <max_norm|off>
    stop <run> [confirm]         checkpoint, then stop; without `confirm` the bot asks for confirmation
    ack <run>/<rule>[/<device>]  (`ack <run> <rule> [<device>]` is read the same way)
    silence <run> [rule] <duration>
    help [command]

Tokens:
  * text is split on whitespace (U+00A0 counts as a space); backticks and quotes (" “ ” ' ‘ ’) are dropped,
    so Slack rich text parses like plain text; a leading `/msmon` or `msmon` is ignored; empty text is `help`.
  * aliases: checkpoint/save/ckpt -> save-checkpoint, loosen/threshold -> loosen-threshold, lr -> scale-lr,
    acknowledge -> ack, mute -> silence, list -> runs, unpause/continue -> resume; `_` may stand for `-`.
  * <run>, <device>: `[A-Za-z0-9._:@+-]+` (no `/`). <rule>: `[a-z_][a-z0-9_]*`, lower-cased (not checked
    against the job's rules here).
  * <value>: a finite number > 0 (an absolute threshold level). xFACTOR: `x1.5`, `×1.5` or `*1.5`, finite > 0.
    scale-lr's <factor>: a number (an `x` prefix is allowed) in (0, 100].
  * <duration>: number+unit parts, `90s`, `15m`, `1h`, `2d`, `1h30m`, `1.5h` (units s, m, h, d, also
    sec/min/hr/hour/day and plurals); a unit is required; > 0 and at most 30 days; stored in seconds
    (rounded to the millisecond). `loosen-threshold` takes it after `for` (a bare duration is accepted too).

`Parsed.text()` is the canonical text of a command; it parses back to an equal `Parsed`.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from collections.abc import Callable, Sequence

from msmon.contract.actions import ACTIONS, VERB_ACTION, ParamError, check_param

MAX_DURATION_S = 30 * 86400.0
MAX_LR_FACTOR = 100.0
MAX_ID = 256  # run, device and rule ids: as long as the wire schema allows (msmon/contract/wire.py)
MAX_COMMAND = 4000  # characters of one command's text (Slack's own limit on a slash command's)
_ID = re.compile(r"[A-Za-z0-9._:@+-]+")
_RULE = re.compile(r"[a-z_][a-z0-9_]*")
_PLAIN_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)")
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)([a-z]+)")
_UNITS: dict[str, float] = {
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), 1.0),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), 60.0),
    **dict.fromkeys(("h", "hr", "hrs", "hour", "hours"), 3600.0),
    **dict.fromkeys(("d", "day", "days"), 86400.0),
}
_DURATION_FORMS = "90s, 15m, 1h30m, 2d"
_FACTOR_PREFIXES = ("x", "X", "×", "*")
_DROPPED = str.maketrans({c: None for c in "`\"'“”‘’"} | {"\u00a0": " "})
_PREFIXES = ("/msmon", "msmon")


class CommandError(ValueError):
    """A command that cannot be run; `str(exc)` is the whole answer to show the user."""

    def __init__(self, message: str, verb: str | None = None) -> None:
        super().__init__(message)
        self.verb = verb


@dataclasses.dataclass(frozen=True)
class Parsed:
    verb: str
    run: str | None = None
    rule: str | None = None
    device: str | None = None
    value: float | None = None
    factor: float | None = None
    duration: float | None = None
    confirmed: bool = False
    topic: str | None = None
    # rewind and clip-grad (the names of their action parameters): `before` -1 is `before-alert`, the job's own
    # newest alert; `alert` and `attempt` are filled in by the job for a rule's rewind, never by chat
    to: int | None = None
    before: int | None = None
    skip: int | None = None
    max_norm: float | None = None
    alert: str | None = None
    attempt: int | None = None

    @property
    def destructive(self) -> bool:
        return COMMANDS[self.verb].destructive

    def text(self) -> str:
        """The canonical command text; `parse(p.text()) == p`."""
        loosen = self.verb == "loosen-threshold"
        parts: list[str | None]
        if self.verb == "ack":
            parts = [self.verb, "/".join(p for p in (self.run, self.rule, self.device) if p)]
        else:
            parts = [self.verb, self.topic, self.run, self.rule]
        if self.to is not None:
            parts += ["to", str(self.to)]
        if self.before is not None:
            parts.append("before-alert" if self.before < 0 else f"before {self.before}")
        if self.skip is not None:
            parts += ["skip", str(self.skip)]
        if self.max_norm is not None:
            parts.append(format_number(self.max_norm) if self.max_norm > 0 else "off")
        if self.value is not None:
            parts.append(format_number(self.value))
        if self.factor is not None:
            parts.append(("x" if loosen else "") + format_number(self.factor))
        if self.duration is not None:
            parts += ["for" if loosen else None, format_duration(self.duration)]
        if self.confirmed:
            parts.append("confirm")
        return " ".join(p for p in parts if p)


# --- tokens -------------------------------------------------------------------------------------------------------

def format_number(x: float) -> str:
    """Shortest text that reads back as exactly `x` (`2`, not `2.0`)."""
    return str(int(x)) if x.is_integer() and abs(x) < 1e15 else repr(x)


def format_duration(seconds: float) -> str:
    """`5400` -> `1h30m`; reads back through `parse_duration` to the same value."""
    seconds = float(seconds)  # an int is a float to the type checker, not to is_integer()
    rest, frac = int(seconds), round(seconds - int(seconds), 3)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        n, rest = divmod(rest, size)
        if n:
            parts.append(f"{n}{unit}")
    if rest or frac or not parts:
        parts.append(f"{format_number(rest + frac)}s")
    return "".join(parts)


def parse_duration(text: str) -> float:
    """`90s`, `15m`, `1h`, `2d`, `1h30m`, `1.5h` -> seconds. A unit is required; > 0 and at most 30 days."""
    s = text.strip().lower()
    if _PLAIN_NUMBER.fullmatch(s):
        raise CommandError(f"'{text}' needs a unit: s, m, h or d (e.g. {_DURATION_FORMS})")
    total, pos = 0.0, 0
    if not s:
        raise CommandError(f"'{text}' is not a duration (e.g. {_DURATION_FORMS})")
    while pos < len(s):
        m = _DURATION_PART.match(s, pos)
        if m is None or m.group(2) not in _UNITS:
            raise CommandError(f"'{text}' is not a duration (e.g. {_DURATION_FORMS})")
        total, pos = total + float(m.group(1)) * _UNITS[m.group(2)], m.end()
    total = round(total, 3)
    if total <= 0:
        raise CommandError(f"duration '{text}' must be longer than 0")
    if total > MAX_DURATION_S:
        raise CommandError(f"duration '{text}' is longer than the 30-day maximum")
    return total


def _number(token: str, body: str | None = None) -> float:
    try:
        x = float(token if body is None else body)
    except ValueError:
        x = math.nan
    if not math.isfinite(x):
        raise CommandError(f"'{token}' is not a number")
    return x


def _positive(token: str, what: str, body: str | None = None, maximum: float = math.inf) -> float:
    x = _number(token, body)
    if not 0 < x <= maximum:
        bound = "> 0" if maximum == math.inf else f"in (0, {format_number(maximum)}]"
        raise CommandError(f"{what} must be {bound}, got '{token}'")
    return x


def _strip_factor_prefix(token: str) -> str | None:
    """`x1.5`/`×1.5`/`*1.5` -> `1.5`; None when the token has no factor prefix."""
    return token[1:] if token.startswith(_FACTOR_PREFIXES) else None


def _factor(token: str, maximum: float = math.inf) -> float:
    return _positive(token, "factor", _strip_factor_prefix(token), maximum)


def _ident(token: str, what: str) -> str:
    if len(token) > MAX_ID:
        raise CommandError(f"a {what} id has at most {MAX_ID} characters; '{token[:40]}...' has {len(token):,}")
    if "/" in token:
        raise CommandError(f"{what} ids have no '/': '{token}'")
    if not _ID.fullmatch(token):
        raise CommandError(f"'{token}' is not a {what} id (letters, digits and . _ : @ + -)")
    return token


def _run(token: str) -> str:
    return _ident(token, "run")


def _rule(token: str) -> str:
    rule = token.lower()
    if len(rule) > MAX_ID:
        raise CommandError(f"a rule name has at most {MAX_ID} characters; '{token[:40]}...' has {len(token):,}")
    if not _RULE.fullmatch(rule):
        raise CommandError(f"'{token}' is not a rule name (letters, digits and _, not starting with a digit)")
    return rule


def _arity(args: Sequence[str], required: Sequence[str], most: int) -> None:
    if len(args) < len(required):
        raise CommandError("missing " + " ".join(required[len(args):]))
    extra = args[most:]
    if extra:
        raise CommandError(f"unexpected extra argument{'s' if len(extra) > 1 else ''} '{' '.join(extra)}'")


# --- verbs --------------------------------------------------------------------------------------------------------

def _no_args(verb: str, args: Sequence[str]) -> Parsed:
    _arity(args, (), 0)
    return Parsed(verb)


def _run_only(verb: str, args: Sequence[str]) -> Parsed:
    _arity(args, ("<run>",), 1)
    return Parsed(verb, run=_run(args[0]))


def _stop(verb: str, args: Sequence[str]) -> Parsed:
    _arity(args, ("<run>",), 2)
    run = _run(args[0])
    if len(args) == 2 and args[1].lower() != "confirm":
        raise CommandError(f"unexpected '{args[1]}'; to confirm, send `stop {run} confirm`")
    return Parsed(verb, run=run, confirmed=len(args) == 2)


def _scale_lr(verb: str, args: Sequence[str]) -> Parsed:
    _arity(args, ("<run>", "<factor>"), 2)
    return Parsed(verb, run=_run(args[0]), factor=_factor(args[1], MAX_LR_FACTOR))


def _count(token: str, what: str) -> int:
    """A step or batch count: digits (`,` and `_` between them allowed), at most 2**53 - 1."""
    body = token.replace(",", "").replace("_", "")
    if not (body.isascii() and body.isdigit()) or len(body) > 16 or int(body) > 2**53 - 1:
        raise CommandError(f"{what} is a whole number of steps >= 0, got '{token}'")
    return int(body)


def _rewind(verb: str, args: Sequence[str]) -> Parsed:
    _arity(args, ("<run>",), 5)
    run, to, before, skip = _run(args[0]), None, None, None
    rest = list(args[1:])
    while rest:
        word = rest.pop(0).lower().replace("_", "-")
        if word in ("to", "skip", "before"):
            if not rest:
                raise CommandError(f"missing <step> after '{word}'" if word != "skip" else "missing <N> after 'skip'")
            n = _count(rest.pop(0), "a step" if word != "skip" else "skip")
            if word == "skip":
                skip = n
            elif word == "to":
                to = n
            else:
                before = n
        elif word == "before-alert":
            before = -1
        else:
            raise CommandError(f"unexpected '{word}'; after the run: `to <step>` or `before-alert`, then `skip <N>`")
    if to is not None and before is not None:
        raise CommandError("give `to <step>` or `before-alert`, not both")
    return Parsed(verb, run=run, to=to, before=before, skip=skip)


def _clip_grad(verb: str, args: Sequence[str]) -> Parsed:
    _arity(args, ("<run>", "<max_norm|off>"), 2)
    word = args[1].lower()
    value = 0.0 if word in ("off", "none", "0") else _number(args[1])
    return Parsed(verb, run=_run(args[0]), max_norm=value)


def _loosen(verb: str, args: Sequence[str]) -> Parsed:
    fors = [i for i, a in enumerate(args) if i >= 2 and a.lower() == "for"]
    head, tail = (args[:fors[0]], args[fors[0] + 1:]) if fors else (args[:3], args[3:])
    _arity(head, ("<run>", "<rule>", "<value|xFACTOR>"), 3)
    if fors:
        _arity(tail, ("<duration> after 'for'",), 1)
    else:
        _arity(tail, (), 1)
    level = head[2]
    factor_body = _strip_factor_prefix(level)
    return Parsed(verb, run=_run(head[0]), rule=_rule(head[1]),
                  value=None if factor_body is not None else _positive(level, "threshold"),
                  factor=None if factor_body is None else _factor(level),
                  duration=parse_duration(tail[0]) if tail else None)


def _ack(verb: str, args: Sequence[str]) -> Parsed:
    _arity(args, ("<run>/<rule>",), 3)
    alert = "/".join(args)
    parts = alert.split("/")
    if not 2 <= len(parts) <= 3 or not all(parts):
        raise CommandError(f"'{alert}' is not an alert: use <run>/<rule> or <run>/<rule>/<device>")
    device = _ident(parts[2], "device") if len(parts) == 3 else None
    return Parsed(verb, run=_run(parts[0]), rule=_rule(parts[1]), device=device)


def _silence(verb: str, args: Sequence[str]) -> Parsed:
    _arity(args, ("<run>", "<duration>"), 3)
    rule = _rule(args[1]) if len(args) == 3 else None
    return Parsed(verb, run=_run(args[0]), rule=rule, duration=parse_duration(args[-1]))


def _help(verb: str, args: Sequence[str]) -> Parsed:
    _arity(args, (), 1)
    return Parsed(verb, topic=_resolve(args[0], verb) if args else None)


Parser = Callable[[str, Sequence[str]], Parsed]


@dataclasses.dataclass(frozen=True)
class Verb:
    """One chat command: its help texts and aliases, whether it changes the job, and how its arguments parse."""

    name: str
    usage: str
    summary: str
    example: str
    parser: Parser
    aliases: tuple[str, ...] = ()
    destructive: bool = False


# The bot's own verbs, answered from the bot's state; the job's verbs come from the job-action table.
_BOT_VERBS = (
    Verb("status", "status <run>", "step, loss/lr/grad norm/throughput vs baseline, firing alerts, ETA and a chart",
         "status run-42", _run_only),
    Verb("runs", "runs", "the runs the bot knows", "runs", _no_args, aliases=("list",)),
    Verb("ack", "ack <run>/<rule>[/<device>]", "acknowledge a firing alert, on all devices or on one",
         "ack run-42/loss_spike/npu3", _ack, aliases=("acknowledge",)),
    Verb("silence", "silence <run> [rule] <duration>", "mute a run's alerts (or one rule's) for a while",
         "silence run-42 loss_spike 30m", _silence, aliases=("mute",)),
    Verb("help", "help [command]", "all commands, or one command's usage with an example", "help loosen-threshold",
         _help),
)
_JOB_PARSERS: dict[str, Parser] = {"pause": _run_only, "resume": _run_only, "save-checkpoint": _run_only,
                                   "loosen-threshold": _loosen, "scale-lr": _scale_lr, "stop": _stop,
                                   "rewind": _rewind, "clip-grad": _clip_grad}
_JOB_VERBS = tuple(Verb(a.verb, a.usage, a.summary, a.example, _JOB_PARSERS[a.verb], a.aliases, a.destructive)
                   for a in ACTIONS.values() if a.chat)

# Every verb, in the order `help` lists them: looking at a run, changing the job, the alerts, help.
COMMANDS: dict[str, Verb] = {v.name: v for v in (*_BOT_VERBS[:2], *_JOB_VERBS, *_BOT_VERBS[2:])}
VERBS: tuple[str, ...] = tuple(COMMANDS)
_ALIASES: dict[str, str] = {alias: v.name for v in COMMANDS.values() for alias in v.aliases}


# --- entry points -------------------------------------------------------------------------------------------------

def _usage_hint(verb: str) -> str:
    v = COMMANDS[verb]
    return f"Usage: {v.usage} (e.g. {v.example})"


def _canonical(word: str) -> str | None:
    w = word.lower().replace("_", "-")
    return w if w in COMMANDS else _ALIASES.get(w)


def _resolve(word: str, context: str | None = None) -> str:
    """The canonical verb for `word`, or a CommandError naming the closest verb (or all of them)."""
    verb = _canonical(word)
    if verb is not None:
        return verb
    close = difflib.get_close_matches(word.lower().replace("_", "-"), [*VERBS, *_ALIASES], n=1, cutoff=0.6)
    if close:
        guess = _canonical(close[0]) or close[0]
        raise CommandError(f"unknown command '{word}'; did you mean `{guess}`? {_usage_hint(guess)}", context)
    raise CommandError(f"unknown command '{word}'. Commands: {', '.join(VERBS)}. Try `help`.", context)


def _tokens(text: str) -> list[str]:
    tokens = text.translate(_DROPPED).split()
    if tokens and tokens[0].lower() in _PREFIXES:
        tokens = tokens[1:]
    return tokens


def parse(text: str) -> Parsed:
    """Parse one command; raises CommandError (its text is the answer for the user)."""
    if len(text) > MAX_COMMAND:
        raise CommandError(f"a command has at most {MAX_COMMAND:,} characters; this one has {len(text):,}")
    tokens = _tokens(text)
    if not tokens:
        return Parsed("help")
    verb = _resolve(tokens[0])
    try:
        parsed = COMMANDS[verb].parser(verb, tokens[1:])
        action = VERB_ACTION.get(verb)
        for param in ACTIONS[action].params if action else ():  # the bounds job and bot share
            value = getattr(parsed, param.name, None)
            if value is not None:
                check_param(action or "", param.name, value)
        return parsed
    except ParamError as exc:
        raise CommandError(f"{verb}: {exc}. {_usage_hint(verb)}", verb) from None
    except CommandError as exc:
        if exc.verb is not None:
            raise
        raise CommandError(f"{verb}: {exc}. {_usage_hint(verb)}", verb) from None


def help_text(verb: str | None = None) -> str:
    """All commands (usage and summary), or one command's usage, summary, example and aliases."""
    if verb is None:
        width = max(len(v.usage) for v in COMMANDS.values())
        lines = [f"{v.usage:<{width}}  {v.summary}" for v in COMMANDS.values()]
        return "\n".join([*lines, f"Durations: {_DURATION_FORMS} (at most 30d). `help <command>` for more."])
    v = COMMANDS[_resolve(verb, "help")]
    aliases = sorted(v.aliases)
    lines = [v.usage, f"  {v.summary}", f"  e.g. {v.example}"]
    if aliases:
        lines.append(f"  aliases: {', '.join(aliases)}")
    return "\n".join(lines)
