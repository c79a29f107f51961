"""Slack: Block Kit messages through slack-sdk's AsyncWebClient (with its 5xx and connection retry
handlers), a chart uploaded with files_upload_v2 in the alert's thread, updates on resolution.

A 429 is not slept on here: it is a DeliveryError carrying Retry-After, so the outbox paces that
channel alone while the others flow. Any answer (Slack's JSON, a proxy's HTML or plain-text page, a
dropped connection) becomes a DeliveryError that names the method, the HTTP status and the reason.
Job data is escaped for mrkdwn (render.escape_slack): it can neither mention nor link.
"""

from __future__ import annotations

import logging
from typing import Any

from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.builtin_async_handlers import (
    AsyncConnectionErrorRetryHandler,
    AsyncServerErrorRetryHandler,
)
from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.webhook.async_client import AsyncWebhookClient

from bot.receivers import DeliveryError, Message, Note, retry_after
from bot.receivers.offloop import off_loop
from bot.receivers.render import (
    ICON,
    chart_line,
    devices_text,
    escape_slack,
    escape_slack_code,
    escape_slack_plain,
    metric_lines,
    ranks_text,
    resolved_text,
    slack_mention,
    text,
    title,
)
from msmon.common.safenames import slug
from msmon.contract.wire import Status

log = logging.getLogger("msmon.bot")


def blocks(msg: Message) -> list[dict[str, Any]]:
    ev = msg.lead
    resolved = msg.status is Status.RESOLVED
    icon = ":white_check_mark:" if resolved else ICON.get(msg.severity.value, "")
    esc, code = escape_slack, escape_slack_code
    out: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": title(msg, escape_slack_plain)[:150]}},
    ]
    if resolved:
        out.append({"type": "section", "text": {"type": "mrkdwn",
                                                "text": f"{icon} {resolved_text(msg, esc)}"}})
        return out
    out.append({"type": "section", "text": {"type": "mrkdwn", "text": f"{icon} *{esc(ev.message)}*"[:3000]}})
    out.append({"type": "section", "fields": [
        {"type": "mrkdwn", "text": f"*Run*\n`{code(msg.run_id)}` ({esc(msg.project)})"[:2000]},
        {"type": "mrkdwn", "text": f"*Rule*\n`{code(msg.rule)}` ({esc(ev.phase)} phase)"[:2000]},
        {"type": "mrkdwn", "text": f"*Step*\n{ev.step}"},
        {"type": "mrkdwn", "text": f"*Value / threshold*\n{ev.value:.4g} / {ev.threshold:.4g}"},
        {"type": "mrkdwn", "text": f"*Devices*\n{_where(msg)}"[:2000]},
        {"type": "mrkdwn", "text": f"*Severity*\n{msg.severity.value}"},
    ]})
    metrics = metric_lines(ev)
    problem = chart_line(msg)
    if metrics or problem:
        notes = " · ".join(metrics + ([esc(problem)] if problem else []))
        out.append({"type": "context", "elements": [{"type": "mrkdwn", "text": notes}]})
    if ev.hint:
        out.append({"type": "section", "text": {"type": "mrkdwn", "text": f"*What to do:* {esc(ev.hint)}"[:3000]}})
    if msg.link:  # msmon's own URL (render.console_url: the run id percent-encoded, no `|` or `>` in it)
        out.append({"type": "context", "elements": [{"type": "mrkdwn", "text": f"<{msg.link}|Open in msmon>"}]})
    out.append(buttons(msg))
    return out


def _where(msg: Message) -> str:
    """The devices, and for a run with several ranks how many of them: "12/64 ranks (first: rank 17 ...)"."""
    ranks = ranks_text(msg, escape_slack)
    return f"{ranks}: {devices_text(msg, escape_slack)}" if ranks else devices_text(msg, escape_slack)


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
    chart_in_post = False  # the chart is an upload in the message's thread: the text never waits for it

    def __init__(self, token: str, base_url: str | None = None, max_retries: int = 5, charts: bool = True,
                 timeout: float = 10.0) -> None:
        kwargs: dict[str, Any] = {"token": token, "timeout": timeout}  # slack-sdk's own default: 30 s
        if base_url:
            kwargs["base_url"] = base_url
        self.client = AsyncWebClient(**kwargs)
        # No rate-limit handler: sleeping on one channel's Retry-After here would hold every channel.
        self.client.retry_handlers = [
            AsyncServerErrorRetryHandler(max_retry_count=max_retries),
            AsyncConnectionErrorRetryHandler(max_retry_count=max_retries),
        ]
        self.charts = charts
        self._channel_ids: dict[str, str] = {}  # channel as routed -> the ID Slack answered (uploads need it)

    async def _call(self, what: str, coro: Any) -> Any:
        """Slack's answer to `coro` (a call of the client), run on the receivers' HTTP loop (bot/receivers/offloop.py:
        the bot's loop, busy with the ingest, takes one step when the answer is in)."""
        try:
            return await off_loop(coro)
        except SlackApiError as exc:
            raise api_error(what, exc) from None
        except Exception as exc:  # noqa: BLE001 - aiohttp errors, timeouts and friends: all a failed delivery
            raise DeliveryError(f"Slack {what} failed: {type(exc).__name__}: {exc}") from None

    async def post(self, channel: str, msg: Message) -> str:
        resp = await self._call("chat.postMessage", self.client.chat_postMessage(
            channel=channel, text=text(msg, escape_slack), blocks=blocks(msg), unfurl_links=False))
        answered = resp.get("channel")
        if isinstance(answered, str) and answered:
            self._channel_ids[channel] = answered
        return str(resp["ts"])

    async def attach(self, channel: str, ref: str, msg: Message) -> None:
        if msg.chart is None:
            return
        await self._call("files_upload_v2", self.client.files_upload_v2(
            channel=self._channel_ids.get(channel, channel), content=msg.chart,
            filename=slug(f"{msg.run_id}-{msg.rule}-step{msg.lead.step}", max_len=120) + ".png",
            title=escape_slack_plain(f"{msg.rule} at step {msg.lead.step}")[:250], thread_ts=ref))

    async def update(self, channel: str, ref: str, msg: Message) -> None:
        await self._call("chat.update", self.client.chat_update(channel=channel, ts=ref, text=text(msg, escape_slack),
                                                                 blocks=blocks(msg)))

    async def note(self, note: Note) -> None:
        """To the reply address bot/chat/slack/inbound.py made: its response_url (`url`) when there is one,
        else the channel (in the alert's thread for a button); a chart goes to the channel. No channel,
        no URL: nowhere to post, nothing posted."""
        # A note is msmon's text with job data in it (a run id, a rank's result detail): escaped whole,
        # which keeps msmon's own *bold* and `code` (notes carry no <...> markup of their own).
        body = escape_slack(note.text)
        if note.mentions:  # an escalation step: the targets from bot.yaml, as mentions that notify them
            body = " ".join(slack_mention(m) for m in note.mentions) + "\n" + body
        to = note.reply_to
        thread = to.thread or None
        if to.url:
            client = AsyncWebhookClient(to.url, retry_handlers=self.client.retry_handlers)
            try:
                resp = await off_loop(client.send(text=body, replace_original=False,
                                                  response_type="ephemeral" if note.private else "in_channel"))
            except Exception as exc:  # noqa: BLE001 - aiohttp errors and friends
                raise DeliveryError(f"Slack response_url failed: {type(exc).__name__}: {exc}") from None
            if resp.status_code != 200:
                retry = resp.headers.get("Retry-After") if resp.headers else None
                raise DeliveryError(f"Slack response_url answered HTTP {resp.status_code}: {_reason(resp.body)}",
                                    retry_after(retry))
        elif to.channel:
            await self._call("chat.postMessage", self.client.chat_postMessage(
                channel=to.channel, thread_ts=thread, text=body, unfurl_links=False))
        if note.chart is not None and to.channel:
            try:
                await self._call("files_upload_v2", self.client.files_upload_v2(
                    channel=to.channel, content=note.chart,
                    filename=slug(f"status-{note.command_id or 'run'}") + ".png", title="status", thread_ts=thread))
            except DeliveryError as exc:
                log.warning("msmon bot: status chart upload failed: %s", exc)

    async def reply(self, channel: str, ref: str, msg: Message) -> None:
        await self._call("chat.postMessage", self.client.chat_postMessage(
            channel=channel, thread_ts=ref, text=text(msg, escape_slack), blocks=blocks(msg), unfurl_links=False))


def _reason(body: Any) -> str:
    """A short, one-line reason from an answer's body: Slack's `error`, or the start of a text/HTML page."""
    if isinstance(body, dict):
        return str(body.get("error") or body.get("warning") or body or "no JSON in the answer (an error page?)")[:200]
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    return " ".join(str(body).split())[:200] or "(empty body)"


def api_error(what: str, exc: SlackApiError) -> DeliveryError:
    """The DeliveryError for any SlackApiError, whatever its response holds."""
    resp = exc.response
    status = getattr(resp, "status_code", None)
    data = getattr(resp, "data", None)
    headers = getattr(resp, "headers", None) or {}
    retry = next((v for k, v in headers.items() if str(k).lower() == "retry-after"), None) \
        if hasattr(headers, "items") else None
    return DeliveryError(f"Slack {what} failed: HTTP {status}: {_reason(data if data is not None else exc)}",
                         retry_after(retry))
