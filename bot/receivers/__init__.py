"""Where messages go. A receiver posts, updates and replies; it raises DeliveryError to be retried.

A new alert is two steps: `post` (the text; its reference is stored at once) and `attach` (the chart
in its thread), so that a failed attachment is retried without posting the text again. The chart is
drawn by the outbox before `post`; when it cannot be drawn, `chart_problem` says why and the text
says so. Job data is escaped by each receiver for its markup (see render.py).
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

import msgspec

from msmon.contract.wire import Event, Severity, Status


class DeliveryError(Exception):
    """A failed delivery; the outbox retries it later (after `retry_after` seconds if given)."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


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

    @property
    def devices(self) -> list[str]:
        return sorted({e.device for e in self.events}, key=lambda d: (len(d), d))

    @property
    def lead(self) -> Event:
        return self.events[0]


class Note(msgspec.Struct):
    """A report in chat that is not an alert: a command's result, a status with its chart."""

    text: str
    thread_ts: str | None = None  # answer in this message's thread
    response_url: str | None = None  # Slack: answer the slash command or button through it
    command_id: str | None = None
    chart: bytes | None = None  # a PNG to attach
    private: bool = False  # only the asker sees it (Slack: an ephemeral answer through response_url)


class Receiver(Protocol):
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

    async def note(self, channel: str, note: Note) -> None:
        """A report in chat (a command's result, a status)."""
        ...
