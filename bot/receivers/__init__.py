"""Where messages go. A receiver posts, updates and replies; it raises DeliveryError to be retried.

A new alert is two steps: `post` (the text; its reference is stored at once) and `attach` (the chart
in its thread), so that a failed attachment is retried without posting the text again. The chart is
drawn by the outbox before `post`; when it cannot be drawn, `chart_problem` says why and the text
says so. Job data is escaped by each receiver for its markup (see render.py).

Answers to a command (`Note`) go where the command came from: its `ReplyTo`, made by the chat edge
the command came in through and read only by the receiver of that name.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import msgspec

from msmon.common.retry import retry_after as parse_retry_after
from msmon.contract.wire import Event, Severity, Status, decode


class DeliveryError(Exception):
    """A failed delivery; the outbox retries it later (after `retry_after` seconds if given). `permanent`:
    the platform said the same request can never succeed (a bad signature, a removed robot, a refused
    body): a dead letter at once, named in the log, instead of retries for half an hour."""

    def __init__(self, message: str, retry_after: float | None = None, permanent: bool = False) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.permanent = permanent


class Held(DeliveryError):
    """Not a failure: the message waits for its robot's next summary (bot/chat/robot.py). The outbox defers the
    row by `wait` seconds without counting a try (bot/delivery/worker.py)."""

    def __init__(self, message: str, wait: float) -> None:
        super().__init__(message)
        self.wait = wait


class PartlyRefused(DeliveryError):
    """A mail the SMTP server took for some recipients and refused for `refused` (a 550): the outbox keeps
    only those in the row, says so in the channel and retries them."""

    def __init__(self, message: str, refused: list[str]) -> None:
        super().__init__(message)
        self.refused = refused


@dataclasses.dataclass
class Message:
    """What a receiver renders: one group of events (one per device), newest state."""

    key: str
    run_id: str
    project: str
    rule: str
    severity: Severity
    status: Status
    events: list[Event]
    repeat: bool = False
    chart: bytes | None = None  # the PNG to attach (drawn by the outbox for a firing ERROR)
    chart_problem: str | None = None  # why there is no chart although one was wanted
    link: str | None = None  # the run's page in the web console ("open in msmon"; console.web.public_url set)
    ranks: dict[str, int] = dataclasses.field(default_factory=dict)  # device -> the rank that sent its event
    known_ranks: int = 0  # ranks the bot knows in the run (bot/ranks): a storm says "on 12/64 ranks"
    resolution: str = ""  # a resolved message's reason when it is not "back to normal" (its run ended)

    @property
    def devices(self) -> list[str]:
        return sorted({e.device for e in self.events}, key=lambda d: (len(d), d))

    @property
    def lead(self) -> Event:
        return self.events[0]


class ReplyTo(msgspec.Struct, frozen=True, omit_defaults=True):
    """Where a receiver answers a command, in that receiver's terms: made by the chat edge the command
    came in through (bot/chat/slack/inbound.py for Slack), read by the receiver of the same name. The
    command service, bot/commands/jobs.py and the outbox carry it unread, but for `channel`: an outbox
    row's channel, as a route's is for alerts (the lane rate limits and Retry-After pace). All empty:
    the receiver's default (the console prints; Slack has nowhere to post)."""

    channel: str = ""  # the conversation (Slack: the channel the command was typed in, or of the alert)
    thread: str = ""  # a message to answer under (Slack: the alert's ts)
    url: str = ""  # a one-off address for the answer (Slack: the response_url of a slash command or button)

    @classmethod
    def before(cls, stored: Mapping[str, Any]) -> ReplyTo:
        """The address in a row stored before ReplyTo, the one place that knows that shape: Slack's
        `channel` ("commands" where there was none), `thread_ts` and `response_url`. A command's stored
        origin holds all three; an undelivered note the last two, the channel being its outbox row's."""
        channel = stored.get("channel")
        return cls(channel="" if channel in (None, _NO_CHANNEL_BEFORE) else str(channel),
                   thread=str(stored.get("thread_ts") or ""), url=str(stored.get("response_url") or ""))


_NO_CHANNEL_BEFORE = "commands"  # what rows stored before ReplyTo name the absence of a channel with


class Note(msgspec.Struct):
    """A report in chat that is not an alert: a command's result, a status with its chart."""

    text: str
    reply_to: ReplyTo = ReplyTo()  # where it goes
    command_id: str | None = None
    chart: bytes | None = None  # a PNG to attach
    private: bool = False  # only the asker sees it (Slack: an ephemeral answer through its url)
    mentions: list[str] = msgspec.field(default_factory=list)  # who to notify (an escalation step): from bot.yaml


class Mail(msgspec.Struct):
    """An email of an escalation step, as its outbox row (kind "mail", receiver "email") stores it.
    Every step of one alert threads under `thread` (the first mail's Message-ID); `event_json` is the
    alert's event as the job sent it (the chart is drawn from its window); a failure to deliver is
    reported to `report_to` on the receiver `report_via`."""

    to: list[str]
    subject: str
    text: str  # plain text body (msmon's text, job data in it)
    message_id: str
    thread: str = ""  # In-Reply-To / References ("" for the first mail of the alert)
    ack_url: str = ""
    event_json: str = ""
    report_via: str = ""
    report_to: ReplyTo = ReplyTo()
    since: float = 0.0  # when the escalation started: the first line's "in ERROR for N" is its age when sent
    devices: int = 0  # the run's devices, for that line


def decode_note(raw: bytes | str, channel: str) -> Note:
    """A note as an outbox row stores it; `channel` is the row's. A row queued before ReplyTo (its
    channel in the row, its thread and response_url in the note) is read into the new shape."""
    note = decode(raw, Note)
    stored = msgspec.json.decode(raw)  # an object: it decoded as a Note
    if "reply_to" not in stored:
        note.reply_to = ReplyTo.before({**stored, "channel": channel})
    return note


class Receiver(Protocol):
    """A destination of messages. A receiver may also say `chart_in_post = False`: its chart goes after the text,
    on its own (`attach`), so the text never waits for the chart to be drawn (the outbox reads it with getattr;
    without it the text waits for its chart at most bot.delivery.worker.CHART_WAIT)."""

    name: str
    charts: bool  # wants a chart for each firing ERROR

    async def attach(self, channel: str, ref: str, msg: Message) -> None:
        """The follow-up of `post`: `msg.chart` in the thread of `ref` (nothing when there is none)."""
        ...

    async def post(self, channel: str, msg: Message) -> str:
        """Send a new message; returns a reference (Slack: its ts) for later updates and replies."""
        ...

    async def update(self, channel: str, ref: str, msg: Message) -> None:
        """Rewrite the message `ref` (more devices joined; resolved)."""
        ...

    async def reply(self, channel: str, ref: str, msg: Message) -> None:
        """Answer in the thread of `ref` (a reminder, a resolution, a WARNING under its run's alert)."""
        ...

    async def note(self, note: Note) -> None:
        """A report in chat (a command's result, a status), to `note.reply_to`."""
        ...


@runtime_checkable
class Mailer(Protocol):
    """A receiver that sends `Mail` (bot/receivers/email.py)."""

    name: str

    async def mail(self, m: Mail) -> None:
        """Send one mail; DeliveryError to be retried."""
        ...


def retry_after(value: Any) -> float | None:
    """Seconds from a Retry-After header (a list of values, a number, delta seconds or an HTTP date, read
    as the job reads it: msmon.common.retry), for every
    receiver; None when absent, garbage, zero or infinite."""
    if isinstance(value, list | tuple):
        value = value[0] if value else None
    if value is None:
        return None
    seconds = parse_retry_after(str(value), time.time(), math.inf)
    return seconds if seconds is not None and 0 < seconds < math.inf else None
