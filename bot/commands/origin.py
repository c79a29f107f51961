"""Where a command came from, and so where its answers go."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class Origin:
    """Where a command came from, and so where its answers go."""

    source: str  # "slack" (slash command, HTTP or Socket Mode), "slack-button", "cli"
    user: str  # Slack user ID or operator name: what permissions name
    user_name: str = ""
    receiver: str = "console"  # "slack" or "console": where reports go
    channel: str | None = None  # Slack channel the command was typed in / of the alert message
    thread_ts: str | None = None  # the alert message a button sat on
    response_url: str | None = None

    @property
    def who(self) -> str:
        return f"@{self.user_name}" if self.user_name else self.user
