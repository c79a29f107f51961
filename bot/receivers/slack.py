"""Slack: Block Kit messages through slack-sdk's AsyncWebClient, with its 429 and 5xx retry
handlers, a chart uploaded with files_upload_v2 in the alert's thread, updates on resolution."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.builtin_async_handlers import (
    AsyncConnectionErrorRetryHandler,
    AsyncRateLimitErrorRetryHandler,
    AsyncServerErrorRetryHandler,
)
from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.webhook.async_client import AsyncWebhookClient

from notifier.wire import Severity, Status

from . import DeliveryError, Message, Note
from .render import ICON, devices_text, metric_lines, text, title

log = logging.getLogger("msmon.bot")


def blocks(msg: Message) -> list[dict[str, Any]]:
    ev = msg.lead
    resolved = msg.status is Status.RESOLVED
    icon = ":white_check_mark:" if resolved else ICON.get(msg.severity.value, "")
    out: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": f"{title(msg)}"[:150]}},
    ]
    if resolved:
        out.append({"type": "section", "text": {"type": "mrkdwn",
                                                "text": f"{icon} back to normal on devices {devices_text(msg)}"}})
        return out
    out.append({"type": "section", "text": {"type": "mrkdwn", "text": f"{icon} *{ev.message}*"}})
    out.append({"type": "section", "fields": [
        {"type": "mrkdwn", "text": f"*Run*\n`{msg.run_id}` ({msg.project})"},
        {"type": "mrkdwn", "text": f"*Rule*\n`{msg.rule}` ({ev.phase} phase)"},
        {"type": "mrkdwn", "text": f"*Step*\n{ev.step}"},
        {"type": "mrkdwn", "text": f"*Value / threshold*\n{ev.value:.4g} / {ev.threshold:.4g}"},
        {"type": "mrkdwn", "text": f"*Devices*\n{devices_text(msg)}"},
        {"type": "mrkdwn", "text": f"*Severity*\n{msg.severity.value}"},
    ]})
    metrics = metric_lines(ev)
    if metrics:
        out.append({"type": "context", "elements": [{"type": "mrkdwn", "text": " · ".join(metrics)}]})
    if ev.hint:
        out.append({"type": "section", "text": {"type": "mrkdwn", "text": f"*What to do:* {ev.hint}"}})
    out.append(buttons(msg))
    return out


BUTTONS = (  # label, command template, style: what a tired engineer may want to do from the alert itself
    ("Acknowledge", "ack {run}/{rule}", "primary"),
    ("Silence 1h", "silence {run} {rule} 1h", None),
    ("Pause", "pause {run}", "danger"),
    ("Save checkpoint", "save-checkpoint {run}", None),
    ("Loosen threshold ×1.5", "loosen-threshold {run} {rule} x1.5", None),
)


def buttons(msg: Message) -> dict[str, Any]:
    """The alert's action buttons; each carries the command text it runs (the interactivity endpoint
    feeds it to the same parser as `/msmon`)."""
    elements = []
    for i, (label, template, style) in enumerate(BUTTONS):
        b: dict[str, Any] = {"type": "button", "action_id": f"msmon_{i}", "text": {"type": "plain_text", "text": label},
                             "value": template.format(run=msg.run_id, rule=msg.rule)}
        if style:
            b["style"] = style
        elements.append(b)
    return {"type": "actions", "block_id": "msmon_actions", "elements": elements}


class SlackReceiver:
    name = "slack"

    def __init__(self, token: str, base_url: str | None = None, max_retries: int = 5, charts: bool = True) -> None:
        kwargs: dict[str, Any] = {"token": token}
        if base_url:
            kwargs["base_url"] = base_url
        self.client = AsyncWebClient(**kwargs)
        self.client.retry_handlers = [
            AsyncRateLimitErrorRetryHandler(max_retry_count=max_retries),
            AsyncServerErrorRetryHandler(max_retry_count=max_retries),
            AsyncConnectionErrorRetryHandler(max_retry_count=max_retries),
        ]
        self.charts = charts

    async def _call(self, what: str, coro: Any) -> Any:
        try:
            return await coro
        except SlackApiError as exc:
            resp = exc.response
            retry = resp.headers.get("Retry-After") if resp is not None and resp.headers else None
            raise DeliveryError(f"Slack {what} failed: {resp.get('error') if resp else exc}",
                                float(retry) if retry else None) from None
        except (OSError, asyncio.TimeoutError, Exception) as exc:  # noqa: BLE001 - aiohttp errors and friends
            raise DeliveryError(f"Slack {what} failed: {type(exc).__name__}: {exc}") from None

    async def post(self, channel: str, msg: Message) -> str:
        resp = await self._call("chat.postMessage", self.client.chat_postMessage(
            channel=channel, text=text(msg), blocks=blocks(msg), unfurl_links=False))
        ts = str(resp["ts"])
        if self.charts and msg.severity is Severity.ERROR and msg.status is Status.FIRING:
            await self._chart(resp.get("channel") or channel, ts, msg)
        return ts

    async def _chart(self, channel: str, ts: str, msg: Message) -> None:
        from ..chart import render_chart_off_loop

        try:
            png = await render_chart_off_loop(msg.lead)
            await self._call("files_upload_v2", self.client.files_upload_v2(
                channel=channel, content=png, filename=f"{msg.run_id}-{msg.rule}-step{msg.lead.step}.png",
                title=f"{msg.rule} at step {msg.lead.step}", thread_ts=ts))
        except DeliveryError as exc:  # the alert itself is out; a missing chart is not worth a re-post
            log.warning("msmon bot: chart upload for run %s failed: %s", msg.run_id, exc)

    async def update(self, channel: str, ref: str, msg: Message) -> None:
        await self._call("chat.update", self.client.chat_update(channel=channel, ts=ref, text=text(msg),
                                                                 blocks=blocks(msg)))

    async def note(self, channel: str, note: Note) -> None:
        if note.response_url:
            client = AsyncWebhookClient(note.response_url, retry_handlers=self.client.retry_handlers)
            try:
                resp = await client.send(text=note.text, replace_original=False,
                                         response_type="ephemeral" if note.private else "in_channel")
            except Exception as exc:  # noqa: BLE001 - aiohttp errors and friends
                raise DeliveryError(f"Slack response_url failed: {type(exc).__name__}: {exc}") from None
            if resp.status_code != 200:
                retry = resp.headers.get("Retry-After") if resp.headers else None
                raise DeliveryError(f"Slack response_url answered HTTP {resp.status_code}: {resp.body[:200]}",
                                    float(retry[0] if isinstance(retry, list) else retry) if retry else None)
        elif channel and channel != "commands":
            await self._call("chat.postMessage", self.client.chat_postMessage(
                channel=channel, thread_ts=note.thread_ts, text=note.text, unfurl_links=False))
        if note.chart is not None and channel and channel != "commands":
            try:
                await self._call("files_upload_v2", self.client.files_upload_v2(
                    channel=channel, content=note.chart, filename=f"status-{note.command_id or 'run'}.png",
                    title="status", thread_ts=note.thread_ts))
            except DeliveryError as exc:
                log.warning("msmon bot: status chart upload failed: %s", exc)

    async def reply(self, channel: str, ref: str, msg: Message) -> None:
        await self._call("chat.postMessage", self.client.chat_postMessage(
            channel=channel, thread_ts=ref, text=text(msg), blocks=blocks(msg)))
