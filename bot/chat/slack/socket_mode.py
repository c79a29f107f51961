"""Socket Mode: Slack slash commands and button clicks over a websocket the bot opens itself.

For clusters with no public URL: instead of Slack POSTing to the bot (bot/chat/slack/inbound.py's HTTP
endpoints), the bot asks Slack for a websocket URL (apps.connections.open, with the app-level `xapp-`
token) and Slack sends the same requests down it as envelopes, which must be acknowledged within 3 s
or Slack sends them again. The websocket protocol (hello, pings, reconnecting on Slack's "disconnect"
notice or a dead connection) is slack-sdk's SocketModeClient; this module only routes envelopes to the
`Inbound` handlers the HTTP endpoints use and acks every one of them, whatever the handler does.

Requests arriving here are already authenticated by the websocket itself, so there is no signature to
verify. The app token is never logged, nor are the payloads' response URLs or verification tokens.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections import OrderedDict
from typing import Any, Protocol

import aiohttp
from slack_sdk.errors import SlackApiError
from slack_sdk.socket_mode.aiohttp import SocketModeClient
from slack_sdk.socket_mode.async_client import AsyncBaseSocketModeClient
from slack_sdk.socket_mode.request import SocketModeRequest
from slack_sdk.socket_mode.response import SocketModeResponse
from slack_sdk.web.async_client import AsyncWebClient

log = logging.getLogger("msmon.bot")
# slack-sdk's own connection log (sessions opened, reconnects); a child of msmon's, so it is configured with it.
sdk_log = logging.getLogger("msmon.bot.socket_mode")

APP_TOKEN_PREFIX = "xapp-"
ERROR_ANSWER: dict[str, Any] = {
    "response_type": "ephemeral",
    "text": ":warning: msmon could not handle that request (internal error); the bot's log has the details.",
}
WORKING_ANSWER: dict[str, Any] = {
    "response_type": "ephemeral",
    "text": ":hourglass_flowing_sand: msmon is working on it; the answer follows here.",
}
SEEN_ENVELOPES = 10_000  # envelope ids remembered (with their answers) to take a redelivery once


class Inbound(Protocol):
    """What Slack's requests are handed to; the HTTP endpoints (bot/chat/slack/inbound.py) implement it too."""

    async def command(self, form: dict[str, str]) -> dict[str, Any]:
        """A slash command's fields (command, text, user_id, user_name, channel_id, response_url, trigger_id,
        team_id...) as Slack sends them; returns the immediate answer body ({"response_type": "ephemeral",
        "text": ...})."""
        ...

    async def interaction(self, payload: dict[str, Any]) -> dict[str, Any] | None:
        """A block_actions payload (the parsed JSON Slack sends as the `payload` form field); returns an
        immediate answer or None. Raises ValueError for a payload that is not the shape Slack sends."""
        ...


class SocketModeError(RuntimeError):
    """start() could not open Socket Mode: the token is not an app-level one, Slack refused it, or Slack
    could not be reached. The message says which, and never contains the token."""


def _token_kind(token: str) -> str:
    """What kind of token this looks like, for error messages, without any of its secret part."""
    m = re.match(r"(xox[a-z]-|xapp-)", token)
    return f"one starting with {m.group(1)!r}" if m else ("an empty one" if not token else "an unrecognised one")


def _form(payload: dict[str, Any]) -> dict[str, str]:
    """A slash command's Socket Mode payload as the form fields the HTTP endpoint gets: all strings.

    Slack sends them as strings already ("is_enterprise_install": "false"); anything else is written
    the way a form would carry it, so both transports hand Inbound.command the same thing.
    """
    out: dict[str, str] = {}
    for k, v in payload.items():
        if v is None:
            continue
        out[k] = v if isinstance(v, str) else ("true" if v else "false") if isinstance(v, bool) else json.dumps(v)
    return out


def _describe(req: SocketModeRequest) -> str:
    """Who asked for what, for the log: no text, response URL, trigger id or verification token."""
    p = req.payload
    if req.type == "slash_commands":
        what = f"{p.get('command', '?')} from user {p.get('user_id', '?')} in channel {p.get('channel_id', '?')}"
    elif req.type == "interactive":
        actions = [a.get("action_id", "?") for a in p.get("actions") or [] if isinstance(a, dict)]
        user = p.get("user")
        user_id = user.get("id", "?") if isinstance(user, dict) else "?"
        what = f"{p.get('type', '?')} {','.join(actions) or '-'} from user {user_id}"
    else:
        what = "-"
    return f"{req.type} {what} (envelope {req.envelope_id})"


class SocketModeBridge:
    """Receives Slack's slash commands and interactions over Socket Mode and hands them to an `Inbound`.

    Every envelope is acked exactly once: with the handler's answer (where the envelope accepts a response
    payload), with ERROR_ANSWER when the handler raises, or, when the handler takes longer than
    `ack_timeout` (Slack wants the ack within 3 s and otherwise redelivers, which would run a command
    twice), with WORKING_ANSWER; the handler is then left to finish and a slash command's answer is
    POSTed to its response_url, as Slack's delayed responses are. Envelope types other than
    slash_commands and interactive (events_api, ...) are acked without a payload and otherwise ignored.

    Use from one event loop: `await bridge.start()` ... `await bridge.stop()`.
    """

    def __init__(self, app_token: str, inbound: Inbound, base_url: str | None = None, *,
                 ack_timeout: float = 2.5, connect_timeout: float = 30.0) -> None:
        """app_token: the app-level token (xapp-...), checked by start(); inbound: the handlers;
        base_url: Slack Web API base for apps.connections.open (None: slack.com; tests use a local server);
        ack_timeout: seconds a handler has before its envelope is acked with WORKING_ANSWER;
        connect_timeout: seconds start() gives the websocket to open (slack-sdk would retry forever)."""
        self._app_token = app_token
        self._inbound = inbound
        self._base_url = base_url
        self._ack_timeout = ack_timeout
        self._connect_timeout = connect_timeout
        self._client: SocketModeClient | None = None
        self._http: aiohttp.ClientSession | None = None  # for late answers to response URLs
        self._late: set[asyncio.Future[None]] = set()  # waits on handlers still running after their ack
        # envelope id -> its answer once its handler is done: Slack redelivers an envelope whose ack it
        # missed, with the same id; the redelivery gets the same answer and runs nothing again. Bounded.
        self._seen: OrderedDict[str, tuple[bool, dict[str, Any] | None]] = OrderedDict()  # id -> (done, answer)

    def __repr__(self) -> str:  # the default would be harmless, but make sure no token ever shows
        return f"SocketModeBridge(started={self._client is not None}, base_url={self._base_url!r})"

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the Socket Mode connection; returns once it is established.

        Raises SocketModeError (token kind, Slack's error, or the network error; never the token) when the
        token is not an app-level one, apps.connections.open fails, or the websocket does not open within
        connect_timeout (a proxy that blocks websockets), so a misconfigured bot fails at start instead of
        retrying forever. Once connected, slack-sdk reconnects by itself (Slack's disconnect notices, dead
        connections).
        """
        if self._client is not None:
            raise RuntimeError("SocketModeBridge already started")
        if not self._app_token.startswith(APP_TOKEN_PREFIX):
            raise SocketModeError(
                f"Socket Mode needs the app-level token (xapp-..., from the app's Basic Information page, with the "
                f"connections:write scope); got {_token_kind(self._app_token)}")
        web_client = AsyncWebClient(base_url=self._base_url) if self._base_url else AsyncWebClient()
        client = SocketModeClient(app_token=self._app_token, web_client=web_client, logger=sdk_log)
        client.socket_mode_request_listeners.append(self._on_request)
        try:
            # Asked here rather than inside connect(), which logs and retries every failure forever.
            client.wss_uri = await client.issue_new_wss_url()
        except SlackApiError as exc:
            await client.close()  # type: ignore[no-untyped-call]
            error = exc.response.get("error") if exc.response is not None else None
            raise SocketModeError(f"Slack refused apps.connections.open: {error or 'no error given'} "
                                  "(is the app token valid, and Socket Mode enabled for the app?)") from None
        except (OSError, asyncio.TimeoutError, aiohttp.ClientError) as exc:
            await client.close()  # type: ignore[no-untyped-call]
            raise SocketModeError(f"could not reach Slack for apps.connections.open: {type(exc).__name__}: {exc}"
                                  ) from None
        try:
            await asyncio.wait_for(client.connect(), self._connect_timeout)  # type: ignore[no-untyped-call]
        except asyncio.TimeoutError:
            await client.close()  # type: ignore[no-untyped-call]
            raise SocketModeError(f"the Socket Mode websocket did not open within {self._connect_timeout:g} s "
                                  "(does a proxy or firewall block websockets to Slack?)") from None
        self._client = client
        self._http = aiohttp.ClientSession()
        log.info("msmon bot: Slack Socket Mode connected")

    async def stop(self) -> None:
        """Disconnect and close; handlers still running late are cancelled. A no-op when not started."""
        client, self._client = self._client, None
        if client is None:
            return
        for task in list(self._late):
            task.cancel()
        await asyncio.gather(*self._late, return_exceptions=True)
        await client.close()  # type: ignore[no-untyped-call]
        if self._http is not None:
            await self._http.close()
            self._http = None
        log.info("msmon bot: Slack Socket Mode disconnected")

    async def connected(self) -> bool:
        """Whether the websocket is up now (for health checks)."""
        return self._client is not None and await self._client.is_connected()

    # -- envelopes -------------------------------------------------------------------------------

    async def _handle(self, req: SocketModeRequest) -> dict[str, Any] | None:
        if req.type == "slash_commands":
            return await self._inbound.command(_form(req.payload))
        if req.type == "interactive":
            return await self._inbound.interaction(req.payload)
        return None

    async def _on_request(self, client: AsyncBaseSocketModeClient, req: SocketModeRequest) -> None:
        """slack-sdk calls this for every envelope (each in its own task); it acks, whatever happens."""
        if req.envelope_id in self._seen:
            done_before, answer = self._seen[req.envelope_id]
            log.info("msmon bot: Socket Mode %s redelivered; acked again, not run again", _describe(req))
            await self._ack(client, req, answer if done_before else dict(WORKING_ANSWER))
            return
        self._seen[req.envelope_id] = (False, None)
        while len(self._seen) > SEEN_ENVELOPES:
            self._seen.popitem(last=False)
        task = asyncio.ensure_future(self._handle(req))
        done, _ = await asyncio.wait({task}, timeout=self._ack_timeout)
        if done:
            try:
                answer = task.result()
            except ValueError as exc:  # not the shape Slack sends: say so, no traceback
                log.warning("msmon bot: Socket Mode %s refused: %s", _describe(req), exc)
                answer = {"response_type": "ephemeral", "text": f":warning: msmon could not read that request: {exc}"}
            except Exception:  # noqa: BLE001 - a handler's bug must not leave the envelope unacked
                log.exception("msmon bot: Socket Mode %s failed; answered with an error", _describe(req))
                answer = dict(ERROR_ANSWER)
            if req.envelope_id in self._seen:
                self._seen[req.envelope_id] = (True, answer)
        else:
            log.warning("msmon bot: Socket Mode %s took over %.1f s; acked as in progress", _describe(req),
                        self._ack_timeout)
            late = asyncio.ensure_future(self._finish_late(req, task))
            self._late.add(late)  # referenced until done; stop() cancels it, and so the handler it awaits
            late.add_done_callback(self._late.discard)
            answer = dict(WORKING_ANSWER)
        await self._ack(client, req, answer)

    async def _ack(self, client: AsyncBaseSocketModeClient, req: SocketModeRequest,
                   answer: dict[str, Any] | None) -> None:
        try:
            payload = answer if req.accepts_response_payload else None
            message = json.dumps(SocketModeResponse(envelope_id=req.envelope_id, payload=payload).to_dict())
        except Exception:  # noqa: BLE001 - an answer that is not a JSON object: still ack, with the error text
            log.exception("msmon bot: Socket Mode %s answered something that is not a JSON object", _describe(req))
            error = dict(ERROR_ANSWER) if req.accepts_response_payload else None
            message = json.dumps(SocketModeResponse(envelope_id=req.envelope_id, payload=error).to_dict())
        try:
            await client.send_message(message)
        except Exception as exc:  # noqa: BLE001 - connection gone: Slack redelivers on the next one
            log.warning("msmon bot: could not ack Socket Mode %s (%s: %s); Slack will send it again",
                        _describe(req), type(exc).__name__, exc)

    async def _finish_late(self, req: SocketModeRequest, task: asyncio.Future[dict[str, Any] | None]) -> None:
        """Wait for a handler whose envelope was already acked; post a slash command's answer to its
        response_url (an interaction's late answer has nowhere to go: its buttons already answered)."""
        try:
            answer = await task
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001
            log.exception("msmon bot: Socket Mode %s failed after its ack", _describe(req))
            answer = dict(ERROR_ANSWER)
        url = req.payload.get("response_url")
        if req.type != "slash_commands" or not answer or not isinstance(url, str) or self._http is None:
            return
        try:
            async with self._http.post(url, json=answer, timeout=aiohttp.ClientTimeout(total=10)) as resp:
                if resp.status >= 300:
                    log.warning("msmon bot: the late answer to Socket Mode %s was refused: HTTP %d", _describe(req),
                                resp.status)
        except (OSError, asyncio.TimeoutError, aiohttp.ClientError, TypeError, ValueError) as exc:
            log.warning("msmon bot: could not post the late answer to Socket Mode %s: %s: %s", _describe(req),
                        type(exc).__name__, exc)


__all__ = ["ERROR_ANSWER", "WORKING_ANSWER", "Inbound", "SocketModeBridge", "SocketModeError"]
