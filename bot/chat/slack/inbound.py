"""Slack's way in: the `/msmon` slash command and the buttons on alert messages.

Every HTTP request is verified with slack-sdk's SignatureVerifier on the raw body, timestamp window
included, before anything is parsed; a bot without a signing secret refuses them all. Slack wants an
answer within 3 s: the command service answers from memory and SQLite in milliseconds, and anything
slower (a status chart, the job's result) goes out later through the durable outbox, by
`response_url` or in the alert's thread. Socket Mode (bot/chat/slack/socket_mode.py) feeds the same `command`
and `interaction` methods.

This is where a Slack request becomes an `Origin` for the command service: who (the user's ID and
name) and the `ReplyTo` that the Slack receiver answers through (the channel, the alert's thread, the
response_url). Nothing past here reads Slack's fields.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Callable
from typing import Annotated, Any
from urllib.parse import parse_qsl

import msgspec
from aiohttp import web
from slack_sdk.signature import Clock, SignatureVerifier

from bot.chat.replay import ReplayGuard
from bot.commands import jobs
from bot.commands.origin import Origin
from bot.commands.service import Answer, CommandService
from bot.config import BotConfig
from bot.receivers import ReplyTo
from bot.receivers.render import escape_slack

log = logging.getLogger("msmon.bot")

WINDOW = 300.0  # seconds: Slack's timestamp window (SignatureVerifier refuses anything older or newer)


class BadRequest(ValueError):
    """A Slack request that is signed but not the shape Slack sends; the message says what is wrong."""


_Str = Annotated[str, msgspec.Meta(max_length=2000)]  # Slack's own longest values (a button's value: 2000)


class _User(msgspec.Struct):
    id: _Str
    username: _Str = ""
    name: _Str = ""


class _Action(msgspec.Struct):
    value: _Str


class _Channel(msgspec.Struct):
    id: _Str | None = None


class _Container(msgspec.Struct):
    channel_id: _Str | None = None


class _Message(msgspec.Struct):
    ts: _Str | None = None
    thread_ts: _Str | None = None


class _Click(msgspec.Struct):
    """The parts of a block_actions payload msmon reads (the rest is ignored)."""

    user: _User
    actions: Annotated[list[_Action], msgspec.Meta(min_length=1, max_length=25)]
    channel: _Channel | None = None
    container: _Container | None = None
    message: _Message | None = None
    response_url: _Str | None = None


def _click(payload: Any) -> _Click | None:
    """A block_actions payload checked for shape; None for other interaction types (ignored)."""
    if not isinstance(payload, dict):
        raise BadRequest("not an interaction: the payload is not an object")
    kind = payload.get("type")
    if not isinstance(kind, str):
        raise BadRequest("not an interaction: the payload has no type")
    if kind != "block_actions":
        return None
    try:
        return msgspec.convert(payload, _Click)
    except msgspec.ValidationError as exc:
        raise BadRequest(f"not a button click Slack sends: {exc}") from None


class _AppClock(Clock):
    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock

    def now(self) -> float:
        return self.clock()


class SlackInbound:
    def __init__(self, svc: CommandService, verifier: SignatureVerifier | None, charts: bool = True,
                 replays: ReplayGuard | None = None) -> None:
        self.svc, self.verifier, self.charts = svc, verifier, charts
        self.replays = replays if replays is not None else ReplayGuard()
        self.tasks: set[asyncio.Task[None]] = set()

    # -- what Slack sends, verified (HTTP) or trusted (Socket Mode) ----------------------------------

    async def command(self, form: dict[str, str]) -> dict[str, Any]:
        """A slash command; returns the immediate answer."""
        reply_to = ReplyTo(channel=form.get("channel_id", ""), url=form.get("response_url", ""))
        origin = Origin(source="slack", user=form.get("user_id", ""), user_name=form.get("user_name", ""),
                        receiver="slack", reply_to=reply_to)
        answer = self.svc.submit(form.get("text", ""), origin)
        self._chart_later(answer, origin)
        return _message(answer)

    async def interaction(self, payload: dict[str, Any]) -> dict[str, Any] | None:
        """A button click on an alert (or on a confirmation); answers go in the alert's thread.
        BadRequest when the payload is not the shape Slack sends."""
        click = _click(payload)
        if click is None:
            return None
        channel = (click.channel.id if click.channel else None) or (
            click.container.channel_id if click.container else None)
        thread = (click.message.thread_ts or click.message.ts) if click.message else None
        origin = Origin(source="slack-button", user=click.user.id, user_name=click.user.username or click.user.name,
                        receiver="slack", reply_to=ReplyTo(channel=channel or "", thread=thread or ""))
        answer = self.svc.submit(click.actions[0].value, origin)
        if answer.private and click.response_url:  # only the clicker sees it
            jobs.note(self.svc.state, _answer_url(origin, click.response_url), answer.text, private=True)
        else:
            jobs.note(self.svc.state, origin, f"{origin.who}: {answer.text}")
        self._chart_later(answer, origin)
        return None

    def _chart_later(self, answer: Answer, origin: Origin) -> None:
        """A status answer's chart, drawn off the event loop, then posted in the channel (a response_url
        takes no file)."""
        if answer.chart is None or not self.charts or not origin.reply_to.channel:
            return
        from bot.charts import render_chart_off_loop
        from bot.charts.draw import alert_starts, rank_throughput

        event = answer.chart
        ranks = rank_throughput(self.svc.state.windows, event.run_id)  # one throughput line per rank
        starts = alert_starts(self.svc.state.firing(event.run_id))  # where they began

        async def draw() -> None:
            try:
                png = await render_chart_off_loop(event, ranks, starts)
            except Exception as exc:  # noqa: BLE001 - job data matplotlib cannot draw: the answer stands without it
                log.warning("msmon bot: the status chart of run %s at step %s could not be drawn (%s: %s); the "
                            "status answer went out without it", event.run_id, event.step, type(exc).__name__, exc)
                return
            jobs.note(self.svc.state, _answer_url(origin, ""), f"chart of run {event.run_id} at step {event.step:,}",
                      chart=png)

        task = asyncio.ensure_future(draw())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    # -- HTTP ----------------------------------------------------------------------------------------

    async def _verified(self, request: web.Request) -> bytes:
        """The raw body of a request Slack signed, inside the timestamp window, seen for the first time."""
        body = await request.read()
        if self.verifier is None:
            raise web.HTTPUnauthorized(reason="this bot has no Slack signing secret configured "
                                              "(slack.signing_secret_env); it refuses every Slack request")
        ts = request.headers.get("X-Slack-Request-Timestamp", "")
        sig = request.headers.get("X-Slack-Signature", "")
        if not ts or not sig:
            raise web.HTTPUnauthorized(reason="unsigned request: X-Slack-Request-Timestamp and X-Slack-Signature "
                                              "are required")
        if not (ts.isascii() and ts.isdigit() and len(ts) <= 12):
            log.warning("msmon bot: refused a Slack request from %s: its timestamp is not a number", request.remote)
            raise web.HTTPUnauthorized(reason="X-Slack-Request-Timestamp must be unix seconds (digits only)")
        if not (sig.isascii() and sig.startswith("v0=") and len(sig) <= 128):
            log.warning("msmon bot: refused a Slack request from %s: malformed signature", request.remote)
            raise web.HTTPUnauthorized(reason="X-Slack-Signature must be v0=<hex digest>")
        try:
            body.decode("utf-8")  # what Slack sends (slack-sdk's verifier decodes it; anything else is not Slack's)
        except UnicodeDecodeError:
            log.warning("msmon bot: refused a Slack request from %s: its body is not UTF-8", request.remote)
            raise web.HTTPBadRequest(reason="the body is not UTF-8: not a request Slack sends") from None
        if not self.verifier.is_valid(body, ts, sig):
            stale = abs(self.verifier.clock.now() - int(ts)) > WINDOW
            log.warning("msmon bot: refused a Slack request from %s: %s", request.remote,
                        "stale timestamp" if stale else "bad signature")
            raise web.HTTPUnauthorized(reason="stale request (timestamp outside 5 minutes)" if stale
                                       else "invalid signature")
        if not self.replays.first(sig, int(ts)):
            log.warning("msmon bot: refused a replayed Slack request to %s from %s (its signature was already taken "
                        "at timestamp %s); nothing was done twice", request.path, request.remote, ts)
            raise web.HTTPUnauthorized(reason="replayed request: this signed request was already taken once")
        return body

    async def http_command(self, request: web.Request) -> web.Response:
        body = await self._verified(request)
        form = dict(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))
        if "user_id" not in form:
            raise web.HTTPBadRequest(reason="not a slash command: no user_id field")
        return web.json_response(await self.command(form))

    async def http_interaction(self, request: web.Request) -> web.Response:
        body = await self._verified(request)
        form = dict(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))
        try:
            payload = json.loads(form.get("payload", ""))
        except (ValueError, RecursionError):
            raise web.HTTPBadRequest(reason="not an interaction: the payload field is not JSON") from None
        try:
            answer = await self.interaction(payload)
        except BadRequest as exc:
            raise web.HTTPBadRequest(reason=str(exc)) from None
        return web.json_response(answer) if answer else web.Response(status=200)


def _answer_url(origin: Origin, url: str) -> Origin:
    """The same origin answered through response_url `url` ("": in its channel, or the alert's thread)."""
    return msgspec.structs.replace(origin, reply_to=msgspec.structs.replace(origin.reply_to, url=url))


def _message(answer: Answer) -> dict[str, Any]:
    """A slash command's immediate answer as Slack takes it."""
    shown = escape_slack(answer.text)  # the answer quotes job data (rules, devices, messages): data, not markup
    out: dict[str, Any] = {"response_type": "ephemeral" if answer.private else "in_channel", "text": shown}
    if answer.confirm:
        out["blocks"] = [
            {"type": "section", "text": {"type": "mrkdwn", "text": shown}},
            {"type": "actions", "block_id": "msmon_confirm", "elements": [
                {"type": "button", "action_id": "msmon_confirm", "style": "danger", "value": answer.confirm,
                 "text": {"type": "plain_text", "text": "Yes, " + answer.confirm.removesuffix(" confirm")}}]},
        ]
    return out


def add_slack_routes(app: web.Application, cfg: BotConfig, svc: CommandService,
                     clock: Callable[[], float] = time.time) -> SlackInbound:
    secret = os.environ.get(cfg.slack.signing_secret_env)
    if not secret:  # a warning where Slack is used (a route to it), a DEBUG line where it is not
        uses_slack = any(r.receiver == "slack" for r in cfg.routes) and not cfg.slack.socket_mode
        log.log(logging.WARNING if uses_slack else logging.DEBUG, "msmon bot: no Slack signing secret in %s: "
                "/slack/commands and /slack/interactions refuse every request", cfg.slack.signing_secret_env)
    verifier = SignatureVerifier(secret, clock=_AppClock(clock)) if secret else None
    replays = ReplayGuard(clock, persist=svc.store.commands.first_signed)
    inbound = SlackInbound(svc, verifier, cfg.console.charts, replays)
    app.router.add_post("/slack/commands", inbound.http_command)
    app.router.add_post("/slack/interactions", inbound.http_interaction)
    return inbound
