"""bot.yaml: the service's settings, validated with the same machinery as monitor_config."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Mapping
from typing import Any, Literal

from notifier.config.errors import ConfigError, Issue
from notifier.config.validate import Context, build, setting
from notifier.config.yamlio import load_yaml

_f = setting


@dataclasses.dataclass
class Secret:
    """A secret read from an environment variable or a file (never written in the config itself)."""

    env: str | None = _f(None, "environment variable holding it")
    file: str | None = _f(None, "file holding it")

    def check(self) -> Iterator[tuple[str, str]]:
        if (self.env is None) == (self.file is None):
            yield "env", "give exactly one of env or file"

    def value(self) -> str | None:
        if self.env is not None:
            return os.environ.get(self.env) or None
        try:
            with open(self.file or "", encoding="utf-8") as f:
                return f.read().strip() or None
        except OSError:
            return None


@dataclasses.dataclass
class JobToken(Secret):
    """A bearer token jobs of `project` present."""

    project: str = _f("default", "project the token is for ('*': any)")


@dataclasses.dataclass
class Operator(Secret):
    """Someone using `msmon cmd` (or a script): the name commands are recorded under, and their token."""

    user: str = _f("", "name used in permissions and the audit log, e.g. cli:alice")

    def check(self) -> Iterator[tuple[str, str]]:
        yield from super().check()
        if not self.user:
            yield "user", "an operator needs a user name"


@dataclasses.dataclass
class Permission:
    """Who may run the commands that change a job (pause, resume, stop, scale-lr, loosen-threshold,
    save-checkpoint) on the runs of `project`."""

    project: str = _f("*", "project ('*': every project)")
    users: list[str] = _f([], "Slack user IDs (U...) or operator names")
    groups: list[str] = _f([], "group names from commands.groups")


@dataclasses.dataclass
class CommandsConfig:
    enable: bool = _f(True, "accept chat and CLI commands")
    allow: list[Permission] = _f([], "who may change jobs (none: nobody; read-only commands are for everyone)")
    groups: dict[str, list[str]] = _f({}, "user groups: name -> Slack user IDs or operator names")
    operators: list[Operator] = _f([], "tokens for `msmon cmd` (POST /v1/commands)")
    expire_after: float = _f(600.0, "seconds after which a command no job picked up expires (the user is told)",
                             gt=0)
    apply_lead: float = _f(0.25, "seconds ahead of a run's latest step at which its ranks apply a command", ge=0)
    long_poll: float = _f(20.0, "longest wait of a job's command poll, seconds", gt=0, le=60)


@dataclasses.dataclass
class Route:
    """First matching route wins. Empty match fields match everything."""

    receiver: str = _f("console", "console or slack")
    channel: str = _f("", "Slack channel ID (C...) for slack; a label for console")
    project: str | None = _f(None, "match: project")
    severity: Literal["WARNING", "ERROR"] | None = _f(None, "match: severity (null: both)")
    labels: dict[str, str] = _f({}, "match: every label given must be equal")
    warnings: Literal["thread", "channel"] = _f(
        "thread", "WARNINGs: in the thread of the run's alert message, or as messages in `channel`")

    def check(self) -> Iterator[tuple[str, str]]:
        if self.receiver not in ("console", "slack"):
            yield "receiver", f"unknown receiver {self.receiver!r}; receivers are console, slack"
        if self.receiver == "slack" and not self.channel:
            yield "channel", "a slack route needs a channel ID"


@dataclasses.dataclass
class SlackConfig:
    token_env: str = _f("SLACK_BOT_TOKEN", "environment variable with the bot token (xoxb-...)")
    base_url: str | None = _f(None, "Slack API base URL (tests point it at a local server)")
    max_retries: int = _f(5, "retries on 429 / 5xx by slack-sdk's retry handlers", ge=0)
    signing_secret_env: str = _f("SLACK_SIGNING_SECRET", "environment variable with the signing secret that "
                                 "verifies slash commands and button clicks")
    socket_mode: bool = _f(False, "receive commands over Socket Mode (no public URL needed) instead of HTTP")
    app_token_env: str = _f("SLACK_APP_TOKEN", "environment variable with the app-level token (xapp-...) for "
                            "Socket Mode")


@dataclasses.dataclass
class ConsoleConfig:
    charts_dir: str = _f("./msmon-charts", "where chart PNGs are written")
    charts: bool = _f(True, "render a chart for each ERROR")


@dataclasses.dataclass
class PipelineConfig:
    repeat_interval: float = _f(3600.0, "seconds before the same alert at the same severity is sent again", ge=0)
    group_wait: float = _f(5.0, "seconds to collect devices hitting the same rule into one message", ge=0)
    inhibit_warnings: bool = _f(True, "hold back a run's WARNINGs while it has an ERROR firing")
    heartbeat_timeout: float = _f(60.0, "seconds without a heartbeat before a job is declared gone", gt=0)
    stall_timeout: float = _f(600.0, "seconds of heartbeats without step progress before a stall alert", gt=0)


@dataclasses.dataclass
class RateLimitConfig:
    per_channel: float = _f(1.0, "messages per second per channel (Slack allows about 1)", gt=0)
    per_run: float = _f(0.5, "messages per second per run", gt=0)
    global_rate: float = _f(10.0, "messages per second in all", gt=0)
    burst: int = _f(3, "messages allowed at once before the rates apply", ge=1)


@dataclasses.dataclass
class BotConfig:
    host: str = _f("127.0.0.1", "listen address")
    port: int = _f(8080, "listen port (0: any free port)", ge=0, le=65535)
    state_path: str = _f("./msmon-bot.sqlite", "SQLite file for all state (WAL mode)")
    max_request_bytes: int = _f(4 << 20, "largest request accepted", ge=1024)
    window_samples: int = _f(600, "metric samples kept per run and device (memory bound)", ge=10)
    max_runs: int = _f(1000, "runs kept in memory; the least recently seen are forgotten first", ge=1)
    tokens: list[JobToken] = _f([], "job tokens (none: every job is refused)")
    routes: list[Route] = _f([], "where alerts go (none: console)")
    pipeline: PipelineConfig = _f(PipelineConfig(), "dedup / group / inhibit settings")
    rate_limit: RateLimitConfig = _f(RateLimitConfig(), "outgoing message rates")
    slack: SlackConfig = _f(SlackConfig(), "Slack receiver")
    console: ConsoleConfig = _f(ConsoleConfig(), "console receiver")
    commands: CommandsConfig = _f(CommandsConfig(), "chat commands and who may use them")


def load_bot_config(source: str | os.PathLike[str] | Mapping[str, Any] | None) -> BotConfig:
    if source is None:
        return BotConfig()
    data = source if isinstance(source, Mapping) else load_yaml(os.fspath(source))
    name = None if isinstance(source, Mapping) else os.fspath(source)
    if not isinstance(data, Mapping) or "bot" not in data:
        raise ConfigError([Issue("bot", "expected a top-level `bot:` section")], name, "bot config")
    section = data["bot"] or {}
    ctx = Context()
    cfg = build(BotConfig, section, "bot", ctx)
    if ctx.issues:
        raise ConfigError(ctx.issues, name, "bot config")
    return cfg
