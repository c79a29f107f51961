"""Slack's way in: the `/msmon` slash command and the buttons on alert messages.

Every HTTP request is verified with slack-sdk's SignatureVerifier on the raw body, timestamp window
included, before anything is parsed; a bot without a signing secret refuses them all. Slack wants an
answer within 3 s: the command service answers from memory and SQLite in milliseconds, and anything
slower (a status chart, the job's result) goes out later through the durable outbox, by
`response_url` or in the alert's thread. Socket Mode (bot/socket_mode.py) feeds the same `command`
and `interaction` methods.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl

from aiohttp import web
from slack_sdk.signature import Clock, SignatureVerifier

from .commands.service import Answer, CommandService, Origin
from .config import BotConfig

log = logging.getLogger("msmon.bot")


class _AppClock(Clock):
    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock

    def now(self) -> float:
        return self.clock()


class SlackInbound:
    def __init__(self, svc: CommandService, verifier: SignatureVerifier | None, charts: bool = True) -> None:
        self.svc, self.verifier, self.charts = svc, verifier, charts
        self.tasks: set[asyncio.Task[None]] = set()

    # -- what Slack sends, verified (HTTP) or trusted (Socket Mode) ----------------------------------

    async def command(self, form: dict[str, str]) -> dict[str, Any]:
        """A slash command; returns the immediate answer."""
        origin = Origin(source="slack", user=form.get("user_id", ""),
                        user_name=form.get("user_name", ""), receiver="slack", channel=form.get("channel_id"),
                        response_url=form.get("response_url"))
        answer = self.svc.submit(form.get("text", ""), origin)
        self._chart_later(answer, origin)
        return _message(answer)

    async def interaction(self, payload: dict[str, Any]) -> dict[str, Any] | None:
        """A button click on an alert (or on a confirmation); answers go in the alert's thread."""
        if payload.get("type") != "block_actions" or not payload.get("actions"):
            return None
        action = payload["actions"][0]
        user = payload.get("user") or {}
        message = payload.get("message") or {}
        channel = (payload.get("channel") or {}).get("id") or (payload.get("container") or {}).get("channel_id")
        thread = message.get("thread_ts") or message.get("ts")
        origin = Origin(source="slack-button", user=user.get("id", ""),
                        user_name=user.get("username") or user.get("name", ""), receiver="slack", channel=channel,
                        thread_ts=thread)
        answer = self.svc.submit(str(action.get("value", "")), origin)
        if answer.private and payload.get("response_url"):
            self.svc.note(dataclasses.replace(origin, response_url=payload["response_url"]), answer.text,
                          private=True)
        else:
            self.svc.note(origin, f"{origin.who}: {answer.text}")
        self._chart_later(answer, origin)
        return None

    def _chart_later(self, answer: Answer, origin: Origin) -> None:
        if answer.chart is None or not self.charts or not origin.channel:
            return
        from .chart import render_chart_off_loop

        event = answer.chart

        async def draw() -> None:
            png = await render_chart_off_loop(event)
            self.svc.note(dataclasses.replace(origin, response_url=None),
                          f"chart of run {event.run_id} at step {event.step:,}", chart=png)

        task = asyncio.ensure_future(draw())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    # -- HTTP ----------------------------------------------------------------------------------------

    async def _verified(self, request: web.Request) -> bytes:
        body = await request.read()
        if self.verifier is None:
            raise web.HTTPUnauthorized(reason="this bot has no Slack signing secret configured "
                                              "(slack.signing_secret_env); it refuses every Slack request")
        ts = request.headers.get("X-Slack-Request-Timestamp", "")
        sig = request.headers.get("X-Slack-Signature", "")
        if not ts or not sig:
            raise web.HTTPUnauthorized(reason="unsigned request: X-Slack-Request-Timestamp and X-Slack-Signature "
                                              "are required")
        if not self.verifier.is_valid(body, ts, sig):
            stale = not ts.isdigit() or abs(self.verifier.clock.now() - int(ts)) > 300
            log.warning("msmon bot: refused a Slack request from %s: %s", request.remote,
                        "stale timestamp" if stale else "bad signature")
            raise web.HTTPUnauthorized(reason="stale request (timestamp outside 5 minutes)" if stale
                                       else "invalid signature")
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
        except ValueError:
            raise web.HTTPBadRequest(reason="not an interaction: the payload field is not JSON") from None
        if not isinstance(payload, dict):
            raise web.HTTPBadRequest(reason="not an interaction: the payload is not an object")
        answer = await self.interaction(payload)
        return web.json_response(answer) if answer else web.Response(status=200)


def _message(answer: Answer) -> dict[str, Any]:
    """A slash command's immediate answer as Slack takes it."""
    out: dict[str, Any] = {"response_type": "ephemeral" if answer.private else "in_channel", "text": answer.text}
    if answer.confirm:
        out["blocks"] = [
            {"type": "section", "text": {"type": "mrkdwn", "text": answer.text}},
            {"type": "actions", "block_id": "msmon_confirm", "elements": [
                {"type": "button", "action_id": "msmon_confirm", "style": "danger", "value": answer.confirm,
                 "text": {"type": "plain_text", "text": "Yes, " + answer.confirm.removesuffix(" confirm")}}]},
        ]
    return out


def add_slack_routes(app: web.Application, cfg: BotConfig, svc: CommandService,
                     clock: Callable[[], float] = time.time) -> SlackInbound:
    secret = os.environ.get(cfg.slack.signing_secret_env)
    if not secret:
        log.info("msmon bot: no Slack signing secret in %s: /slack/commands and /slack/interactions refuse every "
                 "request", cfg.slack.signing_secret_env)
    verifier = SignatureVerifier(secret, clock=_AppClock(clock)) if secret else None
    inbound = SlackInbound(svc, verifier, cfg.console.charts)
    app.router.add_post("/slack/commands", inbound.http_command)
    app.router.add_post("/slack/interactions", inbound.http_interaction)
    return inbound
