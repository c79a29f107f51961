"""bot.yaml: the service's settings, validated with the same machinery as monitor_config."""

from __future__ import annotations

import dataclasses
import os
import re
import stat
import string
import urllib.parse
from collections.abc import Iterator, Mapping
from typing import Any, Literal

from msmon.common.urls import webhook_problem
from msmon.config.errors import ConfigError, Issue, shown
from msmon.config.validate import Context, build, setting, url_problem
from msmon.config.yamlio import check_shape, load_yaml, location_of
from msmon.contract.actions import ACTIONS
from msmon.contract.wire import project_problem

_f = setting
DAY = 86_400.0
_MAX_KEPT_SAMPLES = 20_000_000  # window_samples x max_runs: the metric windows' memory, per device of the runs
_SAMPLE_BYTES = 74  # bot/store/windows.py: 8 numbers and a step of 8 bytes, 2 bytes of flags
_MAX_SECRET_BYTES = 64 << 10  # a token is tens of bytes; `file: /dev/zero` must not hang the bot


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
            if not stat.S_ISREG(os.stat(self.file or "").st_mode):  # a FIFO would block the bot's start
                return None
            with open(self.file or "", encoding="utf-8", errors="replace") as f:
                return f.read(_MAX_SECRET_BYTES).strip() or None
        except (OSError, ValueError):
            return None

    def source(self) -> str:
        """Where the secret comes from, for messages (never the secret itself)."""
        return f"env {self.env}" if self.env is not None else f"file {self.file}"


@dataclasses.dataclass
class JobToken(Secret):
    """A bearer token jobs of `project` present."""

    project: str = _f("default", "project the token is for ('*': any)")

    def check(self) -> Iterator[tuple[str, str]]:
        yield from super().check()
        problem = project_problem(self.project) if self.project != "*" else None
        if problem:
            yield "project", problem


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
    """Who may run the commands that change a job on the runs of `project` (the list: GUARDED_VERBS, below)."""

    project: str = _f("*", "project ('*': every project)")
    users: list[str] = _f([], "Slack user IDs (U...) or operator names")
    groups: list[str] = _f([], "group names from commands.groups")


# The chat verbs only those in commands.allow may send: every job action that changes the job (the action table's
# own word, msmon/contract/actions.py), in `help`'s order. The reference page's list is this one.
GUARDED_VERBS = tuple(a.verb for a in ACTIONS.values() if a.chat and a.destructive)
Permission.__doc__ = (f"Who may run the commands that change a job ({', '.join(GUARDED_VERBS)}) on the runs of "
                      "`project`.")


@dataclasses.dataclass
class CommandsConfig:
    enable: bool = _f(True, "accept chat and CLI commands")
    allow: list[Permission] = _f([], "who may change jobs (none: nobody; read-only commands are for everyone)")
    groups: dict[str, list[str]] = _f({}, "user groups: name -> Slack user IDs or operator names")
    operators: list[Operator] = _f([], "tokens for `msmon cmd` (POST /v1/commands)")
    expire_after: float = _f(600.0, "seconds after which a command no job picked up expires (the user is told)",
                             ge=0.1, le=7 * DAY)
    apply_lead: float = _f(0.25, "seconds ahead of a run's latest step at which its ranks apply a command", ge=0,
                           le=3600)
    long_poll: float = _f(20.0, "longest wait of a job's command poll, seconds", gt=0, le=60)


@dataclasses.dataclass
class Route:
    """First matching route wins. Empty match fields match everything."""

    receiver: str = _f("console", "where its alerts go: one of RECEIVERS")
    channel: str = _f("", "Slack channel ID (C...) for slack; a label for console")
    project: str | None = _f(None, "match: project")
    severity: Literal["WARNING", "ERROR"] | None = _f(None, "match: severity (null: both)")
    labels: dict[str, str] = _f({}, "match: every label given must be equal")
    warnings: Literal["thread", "channel"] = _f(
        "thread", "WARNINGs: in the thread of the run's alert message, or as messages in `channel`")
    escalation: str | None = _f(None, "name of an escalation policy (bot.escalations) for this route's ERRORs")

    def check(self) -> Iterator[tuple[str, str]]:
        if self.receiver not in RECEIVERS:
            yield "receiver", f"unknown receiver {shown(self.receiver)}; receivers are {', '.join(RECEIVERS)}"
        if self.receiver in ("slack", "digest", "matrix") and not self.channel:
            yield "channel", f"a {self.receiver} route needs a channel ID"
        if self.labels and self.project is None:
            yield "labels", ("a route that matches labels names its project too (project: <name>, or '*' for every "
                             "project on purpose): labels are the job's own word, and any project's job can set them")


RECEIVERS = ("console", "slack", "digest", "matrix",
             "alertmanager", "alertmanager_api", "webhook",
             "feishu", "dingtalk", "wecom")  # digest: held for the next digest (bot/delivery/digest.py)


@dataclasses.dataclass
class EscalationLevel:
    """One level of a policy: `after` seconds into the alert, tell `mention` in the route's channel and
    mail `email`."""

    after: float = _f(0.0, "seconds after the alert started firing", ge=0, le=7 * DAY)
    mention: list[str] = _f([], "who to mention in the route's channel: Slack user IDs (U...), group IDs "
                                "(S...), or here/channel")
    email: list[str] = _f([], "addresses to mail (bot.email must be set)")

    def check(self) -> Iterator[tuple[str, str]]:
        if not self.mention and not self.email:
            yield "mention", "a level tells someone: give mention or email (or both)"
        for i, addr in enumerate(self.email):
            if "@" not in addr or any(c in addr for c in " <>,\r\n"):
                yield f"email[{i}]", f"not an email address: {shown(addr)}"


@dataclasses.dataclass
class EscalationPolicy:
    """Ordered levels, the whole chain repeated `repeat` more times, a round every `repeat_every` s."""

    levels: list[EscalationLevel] = _f([], "the levels, in order of `after`")
    repeat: int = _f(0, "times the whole chain runs again after the first", ge=0, le=100)
    repeat_every: float = _f(3600.0, "seconds from the start of one round to the next", ge=1, le=30 * DAY)
    severities: list[Literal["WARNING", "ERROR"]] = _f(["ERROR"], "which alerts escalate (WARNING is for the log "
                                                                  "and the channel; ERROR pages)")

    def check(self) -> Iterator[tuple[str, str]]:
        if not self.levels:
            yield "levels", "a policy needs at least one level"
        afters = [lv.after for lv in self.levels]
        if afters != sorted(afters):
            yield "levels", f"levels must be in order of `after`; got {afters}"
        if self.repeat and afters and afters[-1] >= self.repeat_every:
            yield "repeat_every", (f"{self.repeat_every:g} s is not after the last level ({afters[-1]:g} s): "
                                   "the next round would start before this one ends")


@dataclasses.dataclass
class EmailConfig:
    """SMTP for escalation email (aiosmtplib). The password and the ack-link key come from the environment."""

    host: str = _f("", "SMTP server (empty: no email)")
    port: int = _f(587, "SMTP port (465 for tls: ssl, 587 for starttls)", ge=1, le=65535)
    tls: Literal["ssl", "starttls", "none"] = _f("starttls", "ssl: TLS from the start; starttls: upgrade; none: "
                                                             "plain (loopback tests only)")
    username_env: str | None = _f(None, "environment variable with the SMTP user name (none: no login)")
    password_env: str = _f("MSMON_SMTP_PASSWORD", "environment variable with the SMTP password")
    sender: str = _f("msmon@localhost", "From: address")
    ca_file: str | None = _f(None, "CA certificates (PEM) to verify the server with (none: the system's)")
    timeout: float = _f(20.0, "seconds before a silent SMTP server counts as a failed try", gt=0, le=600)
    public_url: str | None = _f(None, "the bot's address as people reach it, for the acknowledge link "
                                      "(none: no link)")
    ack_secret_env: str = _f("MSMON_ACK_SECRET", "environment variable with the key that signs ack links")
    ack_link_ttl: float = _f(86_400.0, "seconds an acknowledge link stays valid", ge=60, le=30 * DAY)

    def check(self) -> Iterator[tuple[str, str]]:
        yield from _url_problems(self, "public_url", empty_ok=False)
        if not _MAIL_ADDRESS.fullmatch(self.sender):
            yield "sender", (f"not one plain address (name@host, no spaces, line breaks or control characters: "
                             f"they would write headers of their own): {shown(self.sender)}")


def chart_url_problem(template: str) -> str | None:
    """Why alertmanager.chart_url cannot be filled in for every alert (None: it can): only {run_id} and
    {rule}, no positional field, index, attribute, conversion or format spec, and an http(s) URL once filled."""
    try:
        fields = [(name, conv, spec) for _, name, spec, conv in string.Formatter().parse(template) if name is not None]
    except ValueError as exc:
        return f"not a template of {{run_id}} and {{rule}} ({exc}; a literal brace is written {{{{ or }}}})"
    for name, conv, spec in fields:
        if name not in ("run_id", "rule") or conv or spec:
            return (f"{{{name}{'!' + conv if conv else ''}{':' + spec if spec else ''}}} cannot be filled in: the "
                    "fields are {run_id} and {rule}, as they are")
    return url_problem(template.format(run_id="run-1", rule="grad_norm"))


_MAIL_ADDRESS = re.compile(r"[^\s@<>()\[\],;:\"\\]{1,64}@[A-Za-z0-9.-]{1,253}")


@dataclasses.dataclass
class Digest:
    """A scheduled summary for one channel: active runs, progress, loss trend, ETA, alerts since the last."""

    channel: str = _f("", "channel the digest goes to (and whose `receiver: digest` routes it collects)")
    receiver: str = _f("slack", "console or slack")
    cron: str = _f("0 9 * * *", "crontab expression (minute hour day month weekday)")
    timezone: str = _f("UTC", "time zone of the cron expression")

    def check(self) -> Iterator[tuple[str, str]]:
        if not self.channel:
            yield "channel", "a digest needs a channel"
        if self.receiver not in ("console", "slack"):
            yield "receiver", f"unknown receiver {shown(self.receiver)}; a digest goes to console or slack"
        problem = cron_problem(self.cron, self.timezone)
        if problem:
            yield "cron", problem


def cron_problem(expr: str, timezone: str) -> str | None:
    """Why apscheduler's crontab parser refuses `expr` in `timezone`, or None."""
    from apscheduler.triggers.cron import CronTrigger  # type: ignore[import-untyped]

    try:
        CronTrigger.from_crontab(expr, timezone=timezone)
    except (ValueError, LookupError, KeyError) as exc:
        return f"not a crontab expression in time zone {shown(timezone)}: {shown(expr)} ({exc})"
    return None


@dataclasses.dataclass
class SlackConfig:
    token_env: str = _f("SLACK_BOT_TOKEN", "environment variable with the bot token (xoxb-...)")
    base_url: str | None = _f(None, "Slack API base URL (tests point it at a local server)")
    max_retries: int = _f(5, "retries on 429 / 5xx by slack-sdk's retry handlers", ge=0, le=100)
    signing_secret_env: str = _f("SLACK_SIGNING_SECRET", "environment variable with the signing secret that "
                                 "verifies slash commands and button clicks")
    socket_mode: bool = _f(False, "receive commands over Socket Mode (no public URL needed) instead of HTTP")
    app_token_env: str = _f("SLACK_APP_TOKEN", "environment variable with the app-level token (xapp-...) for "
                            "Socket Mode")
    timeout: float = _f(10.0, "seconds before a silent Slack API call counts as a failed try (slack-sdk's own "
                        "default is 30; each retry of max_retries waits as long)", gt=0, le=600)

    def check(self) -> Iterator[tuple[str, str]]:
        yield from _url_problems(self, "base_url", empty_ok=False)


@dataclasses.dataclass
class MatrixConfig:
    """The Matrix receiver and `!msmon` commands (bot/chat/matrix/receiver.py, bot/chat/matrix/inbound.py)."""

    homeserver: str = _f("", "homeserver URL, e.g. https://matrix.example.org (empty: no Matrix)")
    user_id: str = _f("", "the bot's Matrix user, e.g. @msmon:example.org")
    token_env: str = _f("MATRIX_ACCESS_TOKEN", "environment variable with that user's access token")
    rooms: list[str] = _f([], "room IDs (!abc:example.org) the bot joins and reads `!msmon <command>` in")
    prefix: str = _f("!msmon", "what starts a command message")
    timeout: float = _f(20.0, "seconds before a silent homeserver counts as a failed try", gt=0, le=600)

    def check(self) -> Iterator[tuple[str, str]]:
        if not self.homeserver:
            return
        problem = url_problem(self.homeserver)
        if problem:
            yield "homeserver", problem
        if not (self.user_id.startswith("@") and ":" in self.user_id):
            yield "user_id", f"not a Matrix user ID (@name:server): {shown(self.user_id)}"
        for i, room in enumerate(self.rooms):
            if not room.startswith("!") or any(c.isspace() for c in room):
                yield f"rooms[{i}]", f"not a room ID (!id:server, or !id in room version 12; an alias #name:server " \
                                     f"is not one): {shown(room)}"
        if not self.prefix.strip():
            yield "prefix", "a command prefix cannot be empty"


@dataclasses.dataclass
class WebConsoleConfig:
    """The web console (bot/web/): pages at /console on the bot's own port, behind an operator's login."""

    enabled: bool = _f(True, "serve the web console at /console (operators log in with their commands.operators "
                             "token)")
    public_url: str | None = _f(None, "the bot's address as people reach it: chat messages link to the run's "
                                      "console page (null: no links)")
    session_ttl: float = _f(43_200.0, "seconds a console login lasts", ge=60, le=30 * DAY)
    max_sessions: int = _f(1000, "console logins kept at once (the oldest is logged out first)", ge=1, le=100_000)
    max_streams: int = _f(64, "live-update streams open at once (more get 503)", ge=1, le=10_000)
    stream_interval: float = _f(1.0, "seconds between a page's live updates", ge=0.05, le=60)
    stream_write_timeout: float = _f(10.0, "seconds a browser may take to read an update before its stream is "
                                           "closed (a stalled client holds no memory)", ge=0.1, le=600)

    def check(self) -> Iterator[tuple[str, str]]:
        yield from _url_problems(self, "public_url", empty_ok=False)


@dataclasses.dataclass
class ConsoleConfig:
    charts_dir: str = _f("./msmon-charts", "where chart PNGs are written")
    charts: bool = _f(True, "render a chart for each ERROR")
    web: WebConsoleConfig = _f(WebConsoleConfig(), "the web console (bot/web/) and the links to it")


@dataclasses.dataclass
class PipelineConfig:
    repeat_interval: float = _f(3600.0, "seconds before the same alert at the same severity is sent again", ge=0,
                             le=30 * DAY)
    group_wait: float = _f(5.0, "seconds to collect devices hitting the same rule into one message", ge=0, le=3600)
    inhibit_warnings: bool = _f(True, "hold back a run's WARNINGs while it has an ERROR firing")
    heartbeat_timeout: float = _f(60.0, "seconds without a heartbeat before a job is declared gone", ge=0.1,
                               le=7 * DAY)
    stall_timeout: float = _f(600.0, "seconds of heartbeats without step progress before a stall alert",
                           ge=0.1, le=7 * DAY)


@dataclasses.dataclass
class RateLimitConfig:
    per_channel: float = _f(1.0, "messages per second per channel (Slack allows about 1)", ge=0.001, le=10_000)
    per_run: float = _f(0.5, "messages per second per run", ge=0.001, le=10_000)
    global_rate: float = _f(10.0, "messages per second in all", ge=0.001, le=10_000)
    burst: int = _f(3, "messages allowed at once before the rates apply", ge=1, le=10_000)


@dataclasses.dataclass
class DeliveryConfig:
    """How the outbox retries a message a receiver did not take (bot/pipeline/schedule.py's Policy)."""

    backoff_base: float = _f(1.0, "seconds before the first retry (jittered between half and all of it)", ge=0.01,
                             le=3600)
    backoff_max: float = _f(30.0, "longest wait between two tries: a receiver back from an outage gets its waiting "
                                  "messages within this (its first success sends the rest at once)", ge=0.1, le=DAY)
    max_attempts: int = _f(10, "tries before a delivery error makes the message a dead letter (an outage of the "
                               "whole channel does not count: nothing got through since it was queued)", ge=1, le=1000)
    max_error_attempts: int = _f(3, "tries when the receiver failed in another way (data it cannot take)", ge=1,
                                 le=1000)
    max_retry_after: float = _f(900.0, "longest Retry-After honoured", ge=1, le=DAY)


@dataclasses.dataclass
class OverloadConfig:
    """What the ingest sheds while the bot falls behind its own work (bot/ingest/overload.py): samples, charts,
    WARNING firings; never an ERROR nor a resolution. Judged by the bot's backlog, not by the machine's load."""

    enable: bool = _f(True, "shed under overload (false: every envelope is taken whole, however far behind the bot)")
    samples_wait: float = _f(1.0, "seconds the oldest work waiting for the bot has waited (a job's request in the "
                                  "bot, a NATS message since it was stored, a chart in the drawing executor; the "
                                  "median of the last 40, sampled every 50 ms; an idle bot: 0) at which metric "
                                  "samples are shed, and charts (an ERROR's text goes without, saying why)", gt=0,
                             le=600)
    warnings_wait: float = _f(5.0, "wait at which WARNING firings are shed too (dropped, counted)", gt=0, le=600)
    samples_lag: float = _f(0.25, "seconds late the event loop runs timers (the median of its last 40 lags) at which "
                                  "samples are shed, counted only while some work waits (a busy host makes an idle "
                                  "bot's loop 10 ms late: that is not the bot's overload)", gt=0, le=60)
    warnings_lag: float = _f(1.0, "lag (while some work waits) at which WARNING firings are shed too", gt=0, le=60)
    cool: float = _f(15.0, "seconds the wait and lag must stay under half a level's thresholds before the level is "
                           "left (one level at a time)", ge=0, le=3600)


@dataclasses.dataclass
class AlertmanagerInbound:
    """`POST /v1/alertmanager`: Alertmanager's webhooks in, correlated to runs by host or job labels."""

    token_env: str = _f("MSMON_ALERTMANAGER_TOKEN", "environment variable with the bearer token Alertmanager sends "
                        "(http_config.authorization.credentials)")
    basic_user: str | None = _f(None, "user name of basic auth instead (http_config.basic_auth.username)")
    basic_password_env: str = _f("MSMON_ALERTMANAGER_PASSWORD", "environment variable with the basic auth password")
    host_labels: list[str] = _f(["instance", "host", "node", "hostname"], "labels of an Alertmanager alert naming "
                                "its host (a port after ':' is ignored)")
    job_labels: list[str] = _f(["job", "run"], "labels of an Alertmanager alert naming a job (matched to run ids "
                               "and to the run labels in run_job_labels)")
    run_host_labels: list[str] = _f(["host", "hosts", "node", "nodes"], "run labels (monitor_config labels) "
                                    "listing a run's hosts, comma-separated")
    run_job_labels: list[str] = _f(["job"], "run labels naming a run's job")


@dataclasses.dataclass
class AlertmanagerConfig:
    """msmon and Alertmanager: the `alertmanager` and `alertmanager_api` receivers, and the inbound webhook."""

    webhook_url: str = _f("", "where the `alertmanager` receiver POSTs Alertmanager's webhook body")
    api_url: str = _f("", "a real Alertmanager (http://host:9093) the `alertmanager_api` receiver pushes to")
    api_urls: list[str] = _f([], "the other peers of an Alertmanager cluster: each gets every push too")
    resend_interval: float = _f(30.0, "seconds between pushes of a still-firing alert to Alertmanager (each "
                                "valid 4 intervals: it stays active whatever its resolve_timeout)", ge=1, le=DAY)
    chart_url: str = _f("", "chart link in each alert's annotations, {run_id} and {rule} filled in (e.g. a "
                            "Grafana dashboard URL)")
    timeout: float = _f(10.0, "seconds before an unanswered POST counts as a failed try", gt=0, le=600)
    inbound: AlertmanagerInbound = _f(AlertmanagerInbound(), "Alertmanager webhooks in (POST /v1/alertmanager)")

    def check(self) -> Iterator[tuple[str, str]]:
        yield from _url_problems(self, "webhook_url", "api_url")
        for i, url in enumerate(self.api_urls):
            problem = url_problem(url)
            if problem:
                yield f"api_urls[{i}]", problem
        problem = chart_url_problem(self.chart_url) if self.chart_url else None
        if problem:
            yield "chart_url", problem


@dataclasses.dataclass
class WebhookConfig:
    """The plain webhook receiver: signed JSON per alert (docs/webhook.md)."""

    url: str = _f("", "where the `webhook` receiver POSTs")
    secret_env: str = _f("MSMON_WEBHOOK_SECRET", "environment variable with the HMAC-SHA256 signing key")
    timeout: float = _f(10.0, "seconds before an unanswered POST counts as a failed try", gt=0, le=600)

    def check(self) -> Iterator[tuple[str, str]]:
        yield from _url_problems(self, "url")


def _url_problems(section: object, *keys: str, empty_ok: bool = True) -> Iterator[tuple[str, str]]:
    """(key, why) for each of `keys` set to something that is not a usable http(s) URL. Unset (None) is
    fine; so is an empty string where `empty_ok` (a key whose empty default means "off")."""
    for key in keys:
        value = getattr(section, key)
        problem = url_problem(value) if value is not None and (value or not empty_ok) else None
        if problem:
            yield key, problem


@dataclasses.dataclass
class RanksConfig:
    """The view across the ranks of a multi-rank run, and the rules that compare them (bot/ranks)."""

    enable: bool = _f(True, "keep the view across ranks and run the cross-rank rules")
    period: float = _f(5.0, "seconds between two checks of the cross-rank rules", ge=0.1, le=3600)
    max_runs: int = _f(200, "multi-rank runs kept in the view; the least recently seen are forgotten first", ge=1,
                       le=100_000)
    max_ranks: int = _f(4096, "ranks kept per run (a rank past this is counted, not kept)", ge=2, le=1_000_000)
    history: int = _f(8, "a rank's recent step times whose median is its pace", ge=1, le=10_000)
    straggler_ratio: float = _f(1.3, "straggler: its pace over the others' median step time by this factor",
                                gt=1, le=1000)
    straggler_sigmas: float = _f(4.0, "straggler: and by this many robust sigmas (MAD) of the others", ge=0,
                                 le=1000)
    straggler_checks: int = _f(3, "straggler: checks in a row before its WARNING", ge=1, le=10_000)
    straggler_wait_share: float = _f(0.1, "straggler by input wait (ranks that report data_time): it waits this "
                                     "fraction of its step more than the others' median", gt=0, le=1000)
    outlier_sigmas: float = _f(6.0, "outlier: loss or grad norm this many robust sigmas (MAD) from the others",
                               ge=0, le=1000)
    outlier_rel: float = _f(0.2, "outlier: and at least this fraction of the others' median away", ge=0,
                            le=1000)
    outlier_checks: int = _f(3, "outlier: checks in a row before its WARNING", ge=1, le=10_000)
    outlier_error_checks: int = _f(12, "outlier: checks in a row before it is an ERROR", ge=1, le=100_000)
    missing_after: float = _f(30.0, "missing: seconds a rank is silent while the others report", ge=0.1,
                              le=7 * DAY)
    skew_steps: int = _f(100, "step skew: steps between the most and the least advanced rank", ge=1,
                         le=2**53 - 1)
    skew_checks: int = _f(2, "step skew: checks in a row before its WARNING", ge=1, le=10_000)
    min_ranks: int = _f(2, "ranks a run needs before its ranks are compared", ge=2, le=1_000_000)

    def check(self) -> Iterator[tuple[str, str]]:
        if self.outlier_error_checks < self.outlier_checks:
            yield "outlier_error_checks", (f"{self.outlier_error_checks} is fewer than outlier_checks "
                                           f"{self.outlier_checks}: an outlier is a WARNING before it is an ERROR")


@dataclasses.dataclass
class ChartLinksConfig:
    """Charts the bot serves behind signed, expiring links (bot/charts/links.py), for the robots that cannot
    take an image from msmon: a Feishu custom bot (a link in a card), a DingTalk robot (an actionCard)."""

    public_url: str | None = _f(None, "the bot's address as people reach it (null: no chart links)")
    secret_env: str = _f("MSMON_CHART_LINK_SECRET", "environment variable with the key that signs the links")
    ttl: float = _f(7 * DAY, "seconds a chart link works", ge=60, le=90 * DAY)

    def check(self) -> Iterator[tuple[str, str]]:
        yield from _url_problems(self, "public_url", empty_ok=False)


@dataclasses.dataclass
class FeishuConfig:
    """A Feishu/Lark custom bot (bot/chat/feishu/): its webhook URL and signing secret from the environment."""

    webhook_env: str = _f("FEISHU_WEBHOOK_URL", "environment variable with the bot's webhook URL "
                          "(https://open.feishu.cn/open-apis/bot/v2/hook/...)")
    secret_env: str = _f("FEISHU_SECRET", "environment variable with the signing secret (empty or unset: unsigned)")
    verification_token_env: str = _f("FEISHU_VERIFICATION_TOKEN", "environment variable with the app's event "
                                     "subscription Verification Token (unset: /feishu/events refuses every request)")
    encrypt_key_env: str = _f("FEISHU_ENCRYPT_KEY", "environment variable with the app's Encrypt Key (set: events "
                              "must be encrypted and signed)")
    app_id: str = _f("", "the app's App ID (cli_...), to upload charts as images (empty: chart links, if any)")
    app_secret_env: str = _f("FEISHU_APP_SECRET", "environment variable with the app's App Secret")
    api_base: str = _f("https://open.feishu.cn", "Open API address (Lark: https://open.larksuite.com)")
    timeout: float = _f(10.0, "seconds before an unanswered POST counts as a failed try (its lane alone waits)", gt=0,
                        le=600)

    def check(self) -> Iterator[tuple[str, str]]:
        yield from _url_problems(self, "api_base", empty_ok=False)


@dataclasses.dataclass
class DingTalkConfig:
    """A DingTalk custom robot (bot/chat/dingtalk/receiver.py); a firing ERROR `at`s the on-call."""

    webhook_env: str = _f("DINGTALK_WEBHOOK_URL", "environment variable with the robot's webhook URL "
                          "(https://oapi.dingtalk.com/robot/send?access_token=...)")
    secret_env: str = _f("DINGTALK_SECRET", "environment variable with the signing secret (SEC...; unset: unsigned)")
    at_mobiles: list[str] = _f([], "mobile numbers of the on-call, @-mentioned on a firing ERROR")
    at_user_ids: list[str] = _f([], "DingTalk user IDs of the on-call, @-mentioned on a firing ERROR")
    app_secret_env: str = _f("DINGTALK_APP_SECRET", "environment variable with the enterprise robot app's AppSecret, "
                             "which signs its message callbacks (unset: /dingtalk/callback refuses every request)")
    timeout: float = _f(10.0, "seconds before an unanswered POST counts as a failed try (its lane alone waits)", gt=0,
                        le=600)

    def check(self) -> Iterator[tuple[str, str]]:
        for i, m in enumerate(self.at_mobiles):
            if not m.lstrip("+").replace("-", "").isdigit():
                yield f"at_mobiles[{i}]", f"not a mobile number: {shown(m)}"


@dataclasses.dataclass
class WeComConfig:
    """A WeCom group robot (bot/chat/wecom/receiver.py): its webhook URL from the environment."""

    webhook_env: str = _f("WECOM_WEBHOOK_URL", "environment variable with the robot's webhook URL "
                          "(https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key=...)")
    timeout: float = _f(10.0, "seconds before an unanswered POST counts as a failed try (its lane alone waits)", gt=0,
                        le=600)


@dataclasses.dataclass
class NatsConfig:
    """Jobs' envelopes from NATS JetStream (bot/ingest/nats.py), beside HTTP: every replica consumes the one
    durable consumer, so each envelope is ingested by one of them; command polls on the runs' subjects."""

    url: str | None = _f(None, "NATS server(s), e.g. nats://127.0.0.1:4222 (null: HTTP only)")
    prefix: str = _f("msmon", "first token(s) of the subjects (the jobs' bot.nats_prefix)")
    stream: str = _f("MSMON", "the JetStream stream of envelopes and heartbeats (created or updated on start)")
    durable: str = _f("msmon-bot", "the durable consumer all replicas share")
    batch: int = _f(256, "messages one fetch takes", ge=1, le=10_000)
    ack_wait: float = _f(30.0, "seconds before a message a replica took and did not ack goes to another", ge=1,
                         le=3600)
    max_deliver: int = _f(10, "deliveries of one message before it is given up as a dead letter (logged)", ge=1,
                          le=1000)
    max_ack_pending: int = _f(20_000, "messages out and not yet acked, over all replicas", ge=1, le=1_000_000)
    duplicate_window: float = _f(600.0, "seconds JetStream remembers a message id (a job's retries within it are "
                                 "stored once)", ge=1, le=DAY)
    max_age: float = _f(7 * DAY, "seconds an envelope waits for a bot before JetStream drops it", ge=60,
                        le=365 * DAY)
    max_mb: float = _f(10_240.0, "the stream's size cap; a full stream refuses publishes (jobs spool)", ge=1,
                       le=1e8)
    memory: bool = _f(False, "keep the stream in memory instead of on disk (lost if NATS restarts)")

    def check(self) -> Iterator[tuple[str, str]]:
        from msmon.contract.subjects import name_problem, nats_url_problem, prefix_problem

        problems = [("url", nats_url_problem(self.url) if self.url is not None else None),
                    ("prefix", prefix_problem(self.prefix)), ("stream", name_problem(self.stream)),
                    ("durable", name_problem(self.durable))]
        for key, problem in problems:
            if problem:
                yield key, problem


@dataclasses.dataclass
class StoreConfig:
    """Where the bot keeps its state (bot/store): unset, the SQLite file bot.state_path; a PostgreSQL URL
    for several `msmon serve` replicas on one database (README "PostgreSQL and replicas")."""

    url: str | None = _f(None, "sqlite:///path/to/file.sqlite or postgresql://user@host:5432/db (the password "
                         "from PGPASSWORD or ~/.pgpass rather than the URL; never logged) (null: bot.state_path)")
    schema: str | None = _f(None, "PostgreSQL schema of the tables, created if missing (null: the URL's search_path, "
                            "usually public)")
    lease: float = _f(60.0, "seconds a replica's claim on outbox rows, and its hold on the escalator and digests, "
                      "lasts unrenewed; another replica takes over after it (longer than the slowest delivery)",
                      ge=1, le=3600)

    def check(self) -> Iterator[tuple[str, str]]:
        url = self.url
        if url is not None and not url.startswith(("sqlite://", "postgresql://", "postgres://")):
            scheme = url.split(":", 1)[0] if ":" in url else url[:20]
            yield "url", f"expected sqlite:///path or postgresql://..., got scheme {shown(scheme)}"
        elif url is not None and not urllib.parse.urlsplit(url).path.strip("/") and \
                "dbname=" not in urllib.parse.urlsplit(url).query:
            yield "url", ("names no database (sqlite:///path/to/file.sqlite, postgresql://user@host:5432/<database>): "
                          "the tables would go into whatever the server's default database is")
        if self.schema is not None and not _SCHEMA_NAME.match(self.schema):
            yield "schema", (f"{shown(self.schema)} is not a plain schema name (lowercase letters, digits and _, "
                             "63 at most)")


_SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


@dataclasses.dataclass
class BotConfig:
    host: str = _f("127.0.0.1", "listen address")
    port: int = _f(8080, "listen port (0: any free port)", ge=0, le=65535)
    state_path: str = _f("./msmon-bot.sqlite", "SQLite file for all state (WAL mode)")
    max_request_bytes: int = _f(4 << 20, "largest request accepted", ge=1024, le=256 << 20)
    read_timeout: float = _f(30.0, "seconds a client has to send a whole request's headers, and again its body; a "
                                   "slower one is cut (closed, or 408), as is a keep-alive connection idle this long",
                             ge=1, le=3600)
    window_samples: int = _f(600, "metric samples kept per run and device (memory bound)", ge=10, le=100_000)
    max_runs: int = _f(1000, "runs kept in memory; the least recently seen are forgotten first", ge=1,
                       le=100_000)
    retention: float = _f(30 * DAY, "seconds a run is kept after it was last seen, with its alerts and attempts (the "
                                    "command log stays); never one with an alert firing, an escalation open or a "
                                    "command waiting; 0: kept for ever", ge=0, le=3650 * DAY)
    max_devices: int = _f(4096, "devices (ranks) one run may report from; one more is refused (each costs about "
                                "window_samples x 74 bytes of memory: 44 KB at 600)", ge=1, le=1_000_000)
    tokens: list[JobToken] = _f([], "job tokens (none: every job is refused)")
    metrics_token_env: str = _f("", "environment variable with the token Prometheus scrapes GET /metrics with: "
                                    "it reads every project's series and can do nothing else (a job token reads "
                                    "its own project's runs only; no token: 401)")
    routes: list[Route] = _f([], "where alerts go (none: console)")
    pipeline: PipelineConfig = _f(PipelineConfig(), "dedup / group / inhibit settings")
    rate_limit: RateLimitConfig = _f(RateLimitConfig(), "outgoing message rates")
    delivery: DeliveryConfig = _f(DeliveryConfig(), "retries, backoff and dead letters of undelivered messages")
    slack: SlackConfig = _f(SlackConfig(), "Slack receiver")
    console: ConsoleConfig = _f(ConsoleConfig(), "console receiver")
    commands: CommandsConfig = _f(CommandsConfig(), "chat commands and who may use them")
    escalations: dict[str, EscalationPolicy] = _f({}, "escalation policies by name (routes name them)")
    email: EmailConfig = _f(EmailConfig(), "SMTP for escalation email")
    digests: list[Digest] = _f([], "scheduled summaries, one per channel")
    alertmanager: AlertmanagerConfig = _f(AlertmanagerConfig(), "Alertmanager out (receivers) and in (webhooks)")
    webhook: WebhookConfig = _f(WebhookConfig(), "the plain signed webhook receiver")
    matrix: MatrixConfig = _f(MatrixConfig(), "Matrix receiver and commands")
    feishu: FeishuConfig = _f(FeishuConfig(), "Feishu/Lark custom bot receiver")
    dingtalk: DingTalkConfig = _f(DingTalkConfig(), "DingTalk custom robot receiver")
    wecom: WeComConfig = _f(WeComConfig(), "WeCom group robot receiver")
    chart_links: ChartLinksConfig = _f(ChartLinksConfig(), "chart links for Feishu and DingTalk robots")
    nats: NatsConfig = _f(NatsConfig(), "jobs' envelopes over NATS JetStream (optional; HTTP stays on)")
    store: StoreConfig = _f(StoreConfig(), "the state's store: SQLite (bot.state_path) or PostgreSQL for replicas")
    ranks: RanksConfig = _f(RanksConfig(), "the view across a run's ranks and the cross-rank rules")
    overload: OverloadConfig = _f(OverloadConfig(), "what the ingest sheds while the bot falls behind (ERRORs "
                                                    "go first)")

    def check(self) -> Iterator[tuple[str, str]]:
        if not self.matrix.homeserver and any(r.receiver == "matrix" for r in self.routes):
            yield "matrix", "routes use matrix but bot.matrix.homeserver is not set"
        used = {r.receiver for r in self.routes}
        needs = (("alertmanager", "alertmanager", "webhook_url", self.alertmanager.webhook_url),
                 ("alertmanager_api", "alertmanager", "api_url", self.alertmanager.api_url),
                 ("webhook", "webhook", "url", self.webhook.url))
        for receiver, section, key, value in needs:
            if receiver in used and not value:
                yield section, f"routes use {receiver} but bot.{section}.{key} is not set"
        mails = any(lv.email for p in self.escalations.values() for lv in p.levels)
        if mails and not self.email.host:
            yield "email", "escalation levels send email but bot.email.host is not set"
        for section, robot in (("feishu", self.feishu), ("dingtalk", self.dingtalk), ("wecom", self.wecom)):
            url = os.environ.get(robot.webhook_env, "")
            problem = webhook_problem(url) if url else None
            if problem is not None:
                yield f"{section}.webhook_env", (f"the environment variable {robot.webhook_env} {problem}; set it to "
                                                 f"the robot's https:// webhook URL")
        kept = self.window_samples * self.max_runs
        if kept > _MAX_KEPT_SAMPLES:
            yield "window_samples", (f"with max_runs {self.max_runs}, up to {kept:,} samples per device would be kept "
                                     f"in memory (about {kept * _SAMPLE_BYTES / 1e9:.0f} GB for each device of the "
                                     f"runs); keep window_samples x max_runs at most {_MAX_KEPT_SAMPLES:,}")


def _check_tokens(cfg: BotConfig, section: Mapping[str, Any], ctx: Context) -> None:
    """No two holders share a token: an operator's equal to a job's would let a job send commands, two
    projects' would let one project's jobs report as the other's, two operators' would record one's commands
    under the other's name. Compared by where they come from and, where set, by value; never shown."""
    holders: list[tuple[str, str, Secret, object]] = []  # (key path, who, secret, its mapping in the file)
    raw_tokens = section.get("tokens")
    for i, t in enumerate(cfg.tokens):
        item = raw_tokens[i] if isinstance(raw_tokens, list) and i < len(raw_tokens) else None
        holders.append((f"bot.tokens[{i}]", f"project {t.project}", t, item))
    raw_cmds = section.get("commands")
    raw_ops = raw_cmds.get("operators") if isinstance(raw_cmds, Mapping) else None
    for i, o in enumerate(cfg.commands.operators):
        item = raw_ops[i] if isinstance(raw_ops, list) and i < len(raw_ops) else None
        holders.append((f"bot.commands.operators[{i}]", f"operator {o.user}", o, item))
    values = [h[2].value() for h in holders]
    for j, (path, _, secret, item) in enumerate(holders):
        for i in range(j):
            first_path, first_who, first, _ = holders[i]
            jobs = first_path.startswith("bot.tokens") and path.startswith("bot.tokens")
            if jobs and isinstance(first, JobToken) and isinstance(secret, JobToken) and \
                    first.project == secret.project:
                continue  # one project's token given twice: harmless
            same_source = (secret.env, secret.file) == (first.env, first.file)
            if same_source or (values[j] is not None and values[j] == values[i]):
                how = f"both read {secret.source()}" if same_source else "their values are equal"
                why = ("each project needs its own, or one project's jobs could report as the other's" if jobs else
                       "an operator's token must differ from every job token and every other operator's, or a job "
                       "could send commands (or one operator's commands be recorded as another's)")
                where = item if isinstance(item, Mapping) else None
                ctx.error(path, f"same token as {first_path} ({first_who}): {how}; {why}", where,
                          "env" if secret.env is not None else "file")
                break


def _check_escalations(cfg: BotConfig, section: Mapping[str, Any], ctx: Context) -> None:
    """Every policy a route names exists (named with the route's line)."""
    raw = section.get("routes")
    for i, r in enumerate(cfg.routes):
        if r.escalation is not None and r.escalation not in cfg.escalations:
            item = raw[i] if isinstance(raw, list) and i < len(raw) else None
            ctx.error(f"bot.routes[{i}].escalation", f"no escalation policy {shown(r.escalation)}; bot.escalations "
                      f"has {', '.join(cfg.escalations) or 'none'}", item if isinstance(item, Mapping) else None,
                      "escalation")


def load_bot_config(source: str | os.PathLike[str] | Mapping[str, Any] | None) -> BotConfig:
    """A validated BotConfig from a bot.yaml path or a parsed mapping; a ConfigError naming key and line."""
    if source is None:
        return BotConfig()
    name = None if isinstance(source, Mapping) else os.fspath(source)
    try:
        if isinstance(source, Mapping):
            check_shape(source, None, "bot config")
            data: Any = source
        else:
            data = load_yaml(os.fspath(source))
    except ConfigError as exc:
        raise ConfigError(exc.issues, name, "bot config") from None
    if not isinstance(data, Mapping) or "bot" not in data:
        raise ConfigError([Issue("bot", "expected a top-level `bot:` section")], name, "bot config")
    section = data["bot"] or {}
    if not isinstance(section, Mapping):
        raise ConfigError([Issue("bot", f"expected a mapping of settings, got {type(section).__name__}",
                                 location_of(data, "bot"))], name, "bot config")
    ctx = Context()
    cfg = build(BotConfig, section, "bot", ctx)
    if not ctx.issues:
        _check_tokens(cfg, section, ctx)
        _check_escalations(cfg, section, ctx)
    if ctx.issues:
        raise ConfigError(ctx.issues, name, "bot config")
    return cfg
