"""Where a command came from, and so where its answers go: who sent it, through which receiver, and
that receiver's own address for the answers (`ReplyTo`, which nothing here reads)."""

from __future__ import annotations

from typing import Any

import msgspec

from bot.receivers import ReplyTo


class Origin(msgspec.Struct, frozen=True, kw_only=True):
    """Who sent a command and where its answers go; stored with the command (its `origin` JSON)."""

    source: str  # how it came in: "slack" (slash command, HTTP or Socket Mode), "slack-button", "cli"
    user: str  # the chat system's user ID or the operator's name: what permissions name
    user_name: str = ""
    receiver: str = "console"  # the receiver that reports go through
    reply_to: ReplyTo = ReplyTo()  # that receiver's address for them (empty: its default)

    @property
    def who(self) -> str:
        return f"@{self.user_name}" if self.user_name else self.user

    def to_stored(self) -> dict[str, Any]:
        """The JSON object store.commands keeps."""
        stored: dict[str, Any] = msgspec.to_builtins(self)
        return stored

    @classmethod
    def from_stored(cls, stored: dict[str, Any]) -> Origin:
        """A stored command's origin; one stored before ReplyTo has its address read by ReplyTo.before."""
        origin = msgspec.convert(stored, cls)
        return origin if "reply_to" in stored else msgspec.structs.replace(origin, reply_to=ReplyTo.before(stored))
