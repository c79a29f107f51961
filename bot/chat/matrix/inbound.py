"""Matrix's way in: `!msmon <command>` messages in the configured rooms, read by a /sync long-poll loop
(matrix-nio) that the bot starts with its background tasks.

This is where a Matrix message becomes an `Origin` for the command service: the sender's user ID
(what `commands.allow` names, @alice:example.org) and the `ReplyTo` the Matrix receiver answers
through: the room, and the thread (the command's own thread root, or the command message itself,
which the answer starts a thread under). Only messages sent after the bot started are read: the first
sync's timeline is read back to the bot's start (by the homeserver's origin_server_ts), so a command
typed while the homeserver was unreachable from the bot is taken when it answers again, and nothing
typed before the start is; never the bot's own, never edits or notices. A room that could not be joined
because the homeserver was down is joined on the next try. The homeserver's sync is the
authentication: the sender is the user the homeserver says sent the event.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from nio import AsyncClient, ErrorResponse, RoomMessageText, SyncResponse  # type: ignore[import-untyped]

from bot.chat.matrix.receiver import client
from bot.commands import jobs
from bot.commands.origin import Origin
from bot.commands.service import CommandService
from bot.config import MatrixConfig
from bot.receivers import ReplyTo

log = logging.getLogger("msmon.bot")

LONG_POLL_MS = 30_000  # how long one /sync waits on the homeserver for new events
BACKOFF = (1.0, 60.0)  # seconds between failed syncs: first, longest (doubling)


def sync_filter(rooms: list[str]) -> dict[str, Any]:
    """Only the configured rooms' messages: no presence, account data, ephemeral events or state."""
    return {"presence": {"not_types": ["*"]}, "account_data": {"not_types": ["*"]},
            "room": {"rooms": rooms, "timeline": {"types": ["m.room.message"]}, "state": {"not_types": ["*"]},
                     "ephemeral": {"not_types": ["*"]}, "account_data": {"not_types": ["*"]}}}


def command_text(body: str, prefix: str) -> str | None:
    """The command in a message (`!msmon pause run-42` -> `pause run-42`), None for any other message."""
    words = body.strip()
    if words == prefix:
        return ""
    if words.startswith(prefix) and words[len(prefix)].isspace():
        return words[len(prefix):].strip()
    return None


def thread_of(event_id: str, source: dict[str, Any]) -> str:
    """The thread an answer goes in: the root of the thread the message is in, else the message itself."""
    relates = (source.get("content") or {}).get("m.relates_to") or {}
    if isinstance(relates, dict) and relates.get("rel_type") == "m.thread" and isinstance(relates.get("event_id"), str):
        return str(relates["event_id"])
    return event_id


class MatrixInbound:
    """The sync loop, started and stopped with the bot's background tasks."""

    def __init__(self, cfg: MatrixConfig, token: str, svc: CommandService, nio: AsyncClient | None = None) -> None:
        self.cfg, self.svc = cfg, svc
        # A long-poll needs a request timeout beyond the poll itself.
        self.client = nio or client(cfg.homeserver, cfg.user_id, token, cfg.timeout + LONG_POLL_MS / 1000)
        self.since: str | None = None
        self.task: asyncio.Task[None] | None = None
        self.started_ms = int(svc.clock() * 1000)  # the first sync reads messages from here on
        self.unjoined = list(cfg.rooms)  # rooms still to join (the homeserver was down)

    async def start(self) -> None:
        """Start the loop in the background; nothing here waits on the homeserver, so a slow or absent one
        never holds up the bot's start (the loop joins the rooms and retries)."""
        self.task = asyncio.create_task(self._loop())

    async def _join(self) -> None:
        """Join the rooms not joined yet; one the homeserver refuses is logged (its commands are not read),
        one it could not be asked about (down) is tried again before the next sync."""
        for room in list(self.unjoined):
            try:
                joined = await self.client.join(room)
            except Exception:  # noqa: BLE001 - no homeserver now: tried again with the next sync
                continue
            if isinstance(joined, ErrorResponse) and _unreachable(joined):
                continue
            self.unjoined.remove(room)
            if isinstance(joined, ErrorResponse):
                log.error("msmon bot: Matrix: could not join room %s as %s (%s); commands typed there are not read "
                          "until the bot is invited and restarted", room, self.cfg.user_id, joined)

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        await self.client.close()

    async def _sync(self, timeout_ms: int) -> list[tuple[str, RoomMessageText]]:
        """One /sync from `since`: the new text messages of the configured rooms (none on the first)."""
        resp = await self.client.sync(timeout=timeout_ms, since=self.since, sync_filter=sync_filter(self.cfg.rooms))
        if not isinstance(resp, SyncResponse):
            raise RuntimeError(str(resp))
        first, self.since = self.since is None, resp.next_batch
        return [(room, ev) for room, info in resp.rooms.join.items() if room in self.cfg.rooms
                for ev in info.timeline.events if isinstance(ev, RoomMessageText)
                and (not first or ev.server_timestamp >= self.started_ms)]

    async def _loop(self) -> None:
        """Join, then sync until cancelled: the first sync's messages are read back to the bot's start."""
        wait = BACKOFF[0]
        while True:
            try:
                if self.unjoined:
                    await self._join()
                messages = await self._sync(LONG_POLL_MS if self.since is not None else 0)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - a homeserver down or refusing: retried, commands wait
                log.warning("msmon bot: Matrix sync from %s failed (%s: %s); retrying in %.0f s; commands typed "
                            "meanwhile are read then", self.cfg.homeserver, type(exc).__name__, exc, wait)
                await asyncio.sleep(wait)
                wait = min(wait * 2, BACKOFF[1])
                continue
            wait = BACKOFF[0]
            for room, ev in messages:
                self.handle(room, ev)

    def handle(self, room: str, ev: RoomMessageText) -> None:
        """One message: a command from someone else is submitted; the answer goes in its thread."""
        if ev.sender == self.cfg.user_id:
            return
        command = command_text(ev.body, self.cfg.prefix)
        if command is None:
            return
        origin = Origin(source="matrix", user=ev.sender, receiver="matrix",
                        reply_to=ReplyTo(channel=room, thread=thread_of(ev.event_id, ev.source)))
        answer = self.svc.submit(command, origin)
        jobs.note(self.svc.state, origin, f"{origin.who}: {answer.text}")


def _unreachable(resp: ErrorResponse) -> bool:
    """A join that failed because the homeserver was not there (a proxy's 5xx: no Matrix errcode) or is
    limiting the rate, not because it refused (M_FORBIDDEN...): tried again."""
    errcode = str(getattr(resp, "status_code", None) or "")
    return not errcode.startswith("M_") or errcode == "M_LIMIT_EXCEEDED"
