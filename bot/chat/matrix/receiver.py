"""Matrix: alerts as room messages through matrix-nio's AsyncClient, with an HTML body
(org.matrix.custom.html) and a plain-text `body`, the chart uploaded to the media repository and
posted as an m.image in the alert's thread, updates as edits (m.replace), reminders, resolutions and
command results in threads (m.thread).

The route's `channel` is the room ID (!abc:example.org); a note goes to its ReplyTo's `channel` (the
room) and `thread` (the thread's root event), made by bot/chat/matrix/inbound.py. Job data goes through
render.escape_html in the HTML body and render.escape_matrix_text in the plain body; every message
carries an empty `m.mentions`, so nothing a job sends can notify the room or a user.

nio retries nothing here (no 429 sleep, no timeout retry): an error from the homeserver (429 or
M_LIMIT_EXCEEDED with its retry_after_ms, a 5xx, any other errcode) or a dropped connection becomes a
DeliveryError, with Retry-After where the homeserver gave one, and the outbox retries that room alone.
"""

from __future__ import annotations

import io
import logging
import math
import time
from collections.abc import Awaitable
from typing import Any, TypeVar

from nio import AsyncClient, AsyncClientConfig, ErrorResponse, RoomSendResponse, UploadResponse  # type: ignore[import-untyped]

from bot.receivers import DeliveryError, Message, Note
from bot.receivers.render import Escape, escape_html, escape_matrix_text, text
from msmon.common.retry import retry_after as parse_retry_after
from msmon.common.safenames import slug

log = logging.getLogger("msmon.bot")

HTML = "org.matrix.custom.html"
_R = TypeVar("_R")


def client(homeserver: str, user_id: str, token: str, timeout: float) -> AsyncClient:
    """An AsyncClient logged in with an access token, that leaves every retry to the caller."""
    c = AsyncClient(homeserver, user_id, config=AsyncClientConfig(
        max_limit_exceeded=0, max_timeouts=0, request_timeout=timeout))
    c.access_token = token
    c.user_id = user_id
    return c


def html_lines(lines: list[str]) -> str:
    """Lines of escaped text as an HTML body: the first in bold, one per line."""
    head, *rest = lines
    return "<br>".join([f"<strong>{head}</strong>", *rest])


MAX_PIECE = 2000  # characters of one piece of job data (a message, a hint): an event must stay under 65,536 bytes


def cut(esc: Escape) -> Escape:
    """`esc` of a value cut to MAX_PIECE characters (a job's message may be 64 KB; a Matrix event may not)."""
    return lambda v: esc(v if len(v) <= MAX_PIECE else v[:MAX_PIECE] + " [cut]")


def content(msg: Message) -> dict[str, Any]:
    """An alert's m.text content: the same text as the other receivers, job data escaped for each body."""
    return text_content(text(msg, cut(escape_matrix_text)), html_lines(text(msg, cut(escape_html)).split("\n")))


def text_content(body: str, html: str, mentions: list[str] | None = None) -> dict[str, Any]:
    """An m.text with both bodies; `m.mentions` names only the users meant to be notified (none by default)."""
    return {"msgtype": "m.text", "body": body, "format": HTML, "formatted_body": html,
            "m.mentions": {"user_ids": mentions} if mentions else {}}


def in_thread(c: dict[str, Any], root: str) -> dict[str, Any]:
    """`c` posted in the thread of `root`, with the reply fallback for clients without threads."""
    return {**c, "m.relates_to": {"rel_type": "m.thread", "event_id": root, "is_falling_back": True,
                                  "m.in_reply_to": {"event_id": root}}}


def edit(c: dict[str, Any], ref: str) -> dict[str, Any]:
    """An edit of event `ref` to `c` (m.replace; the `* ` fallback for clients without edits)."""
    return {**c, "body": "* " + c["body"], "formatted_body": "* " + c["formatted_body"], "m.new_content": c,
            "m.relates_to": {"rel_type": "m.replace", "event_id": ref}}


def is_user_id(target: str) -> bool:
    """A Matrix user ID (@name:server), which an escalation step may mention."""
    return target.startswith("@") and ":" in target and not any(c.isspace() for c in target)


def note_content(note: Note) -> dict[str, Any]:
    """A note's text (msmon's words with job data in it, escaped whole), its mentions as pills."""
    body, html = cut(escape_matrix_text)(note.text), cut(escape_html)(note.text).replace("\n", "<br>")
    users = [m for m in note.mentions if is_user_id(m)]
    if note.mentions:
        pills = [f'<a href="https://matrix.to/#/{escape_html(m)}">{escape_html(m)}</a>' if m in users
                 else escape_html(m) for m in note.mentions]
        body = " ".join(escape_matrix_text(m) if m not in users else m for m in note.mentions) + "\n" + body
        html = " ".join(pills) + "<br>" + html
    return text_content(body, html, users)


def error(what: str, resp: ErrorResponse) -> DeliveryError:
    """The DeliveryError for a homeserver's error answer: HTTP status, errcode, message, Retry-After."""
    transport = getattr(resp, "transport_response", None)
    status = getattr(transport, "status", None)
    retry = resp.retry_after_ms / 1000 if resp.retry_after_ms else None
    if retry is None and transport is not None:
        retry = parse_retry_after(transport.headers.get("Retry-After"), time.time(), math.inf) or None
    if retry is None and (status == 429 or resp.status_code == "M_LIMIT_EXCEEDED"):
        retry = 5.0  # rate limited without saying for how long: nio's own default wait
    reason = " ".join(f"{resp.status_code or ''} {resp.message or ''}".split())[:200] or "no reason given"
    return DeliveryError(f"Matrix {what} failed: HTTP {status}: {reason}", retry)


class MatrixReceiver:
    name = "matrix"

    def __init__(self, homeserver: str, user_id: str, token: str, timeout: float = 20.0,
                 charts: bool = True) -> None:
        self.client = client(homeserver, user_id, token, timeout)
        self.charts = charts

    async def _call(self, what: str, call: Awaitable[_R]) -> _R:
        try:
            resp = await call
        except Exception as exc:  # noqa: BLE001 - aiohttp errors, timeouts, no token: all a failed delivery
            raise DeliveryError(f"Matrix {what} failed: {type(exc).__name__}: {exc}") from None
        if isinstance(resp, tuple):  # upload answers (response, decryption info)
            resp = resp[0]
        if isinstance(resp, ErrorResponse):
            raise error(what, resp)
        return resp

    async def _send(self, room: str, c: dict[str, Any]) -> str:
        resp = await self._call("room_send", self.client.room_send(room, "m.room.message", c))
        if not isinstance(resp, RoomSendResponse):
            raise DeliveryError(f"Matrix room_send to {room} answered {type(resp).__name__}, not an event id")
        return str(resp.event_id)

    async def _image(self, room: str, thread: str | None, png: bytes, name: str) -> None:
        """Upload `png` and post it as an m.image (in the thread of `thread` if given)."""
        up = await self._call("upload", self.client.upload(io.BytesIO(png), content_type="image/png",
                                                           filename=name, filesize=len(png)))
        if not isinstance(up, UploadResponse):
            raise DeliveryError(f"Matrix upload answered {type(up).__name__}, not a content URI")
        c: dict[str, Any] = {"msgtype": "m.image", "body": name, "url": up.content_uri,
                             "info": {"mimetype": "image/png", "size": len(png)}, "m.mentions": {}}
        await self._send(room, in_thread(c, thread) if thread else c)

    async def post(self, channel: str, msg: Message) -> str:
        return await self._send(channel, content(msg))

    async def attach(self, channel: str, ref: str, msg: Message) -> None:
        if msg.chart is None:
            return
        name = slug(f"{msg.run_id}-{msg.rule}-step{msg.lead.step}", max_len=120) + ".png"
        await self._image(channel, ref, msg.chart, name)

    async def update(self, channel: str, ref: str, msg: Message) -> None:
        await self._send(channel, edit(content(msg), ref))

    async def reply(self, channel: str, ref: str, msg: Message) -> None:
        await self._send(channel, in_thread(content(msg), ref))

    async def note(self, note: Note) -> None:
        """To the room and thread bot/chat/matrix/inbound.py recorded; no room: nowhere to post, nothing posted.
        A status chart failing to upload leaves the text standing (logged)."""
        to = note.reply_to
        if not to.channel:
            log.warning("msmon bot: a Matrix note (command %s) has no room to go to; not posted", note.command_id)
            return
        thread = to.thread or None
        c = note_content(note)
        await self._send(to.channel, in_thread(c, thread) if thread else c)
        if note.chart is not None:
            try:
                await self._image(to.channel, thread, note.chart, slug(f"status-{note.command_id or 'run'}") + ".png")
            except DeliveryError as exc:
                log.warning("msmon bot: status chart upload to Matrix failed: %s", exc)
