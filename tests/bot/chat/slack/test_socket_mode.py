"""Socket Mode: bot.socket_mode.SocketModeBridge (slack-sdk's real SocketModeClient) against the loopback
Slack server's apps.connections.open and websocket, with a recording Inbound.

The bridge runs on an event loop in its own thread (as in the bot), so the test thread can drive the server
with its blocking push()/wait_for().
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import aiohttp
import pytest
from aiohttp import web
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from bot.chat.slack.socket_mode import ERROR_ANSWER, WORKING_ANSWER, SocketModeBridge, SocketModeError
from tests.fakes.slack_api import APP_ID, CONNECTIONS_OPEN, SlackAPIServer

T = TypeVar("T")

APP_TOKEN = "xapp-1-A0MSMON01-1234567890-0123456789abcdef"
WAIT = 10  # generous: a loaded CI machine; nothing here asserts on speed


def slash_command(server: SlackAPIServer, text: str = "status run-42") -> dict[str, Any]:
    """The fields Slack sends for `/msmon <text>`, as in a Socket Mode slash_commands envelope."""
    return {
        "token": "verification-token-not-used-in-socket-mode",
        "team_id": "T0MSMON01",
        "team_domain": "msmon-test",
        "channel_id": "C0TRAIN01",
        "channel_name": "training-alerts",
        "user_id": "U0ALICE01",
        "user_name": "alice",
        "command": "/msmon",
        "text": text,
        "api_app_id": APP_ID,
        "is_enterprise_install": "false",
        "response_url": server.response_url("r1"),
        "trigger_id": "1234567890.123456.abcdef",
    }


def block_actions(action_id: str = "ack", value: str = "run-42:loss_spike") -> dict[str, Any]:
    """A block_actions payload for a button click on an alert message."""
    return {
        "type": "block_actions",
        "user": {"id": "U0ALICE01", "username": "alice", "name": "alice", "team_id": "T0MSMON01"},
        "api_app_id": APP_ID,
        "team": {"id": "T0MSMON01", "domain": "msmon-test"},
        "channel": {"id": "C0TRAIN01", "name": "training-alerts"},
        "container": {"type": "message", "message_ts": "1700000000.000100", "channel_id": "C0TRAIN01"},
        "trigger_id": "1234567890.123456.abcdef",
        "response_url": "http://127.0.0.1:9/unused",
        "actions": [{"type": "button", "action_id": action_id, "block_id": "alert", "value": value,
                     "action_ts": "1700000001.000200", "text": {"type": "plain_text", "text": "Ack"}}],
    }


class RecordingInbound:
    """A real Inbound: records what it is handed (thread-safe) and answers like msmon's endpoints.

    fail: raise instead of answering; gate: wait for this event first (a slow handler);
    interaction_answer: what interaction() returns (None: nothing to say).
    """

    def __init__(self, *, fail: bool = False, gate: threading.Event | None = None,
                 interaction_answer: dict[str, Any] | None = None) -> None:
        self.fail = fail
        self.gate = gate
        self.interaction_answer = interaction_answer
        self._lock = threading.Lock()
        self.commands: list[dict[str, str]] = []
        self.interactions: list[dict[str, Any]] = []

    async def _maybe_wait(self) -> None:
        if self.gate is not None:
            await asyncio.to_thread(self.gate.wait, WAIT)

    async def command(self, form: dict[str, str]) -> dict[str, Any]:
        with self._lock:
            self.commands.append(dict(form))
        await self._maybe_wait()
        if self.fail:
            raise RuntimeError("inbound exploded on purpose")
        return {"response_type": "ephemeral", "text": f"run {form['text'].split()[-1]}: training, step 1200"}

    async def interaction(self, payload: dict[str, Any]) -> dict[str, Any] | None:
        with self._lock:
            self.interactions.append(payload)
        await self._maybe_wait()
        if self.fail:
            raise RuntimeError("inbound exploded on purpose")
        return self.interaction_answer


class LoopThread:
    """An event loop in a daemon thread, where the bridge lives; run() a coroutine there and get its result."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="socket-mode-test", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = WAIT) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(WAIT)
        self.loop.close()


@pytest.fixture
def server() -> Iterator[SlackAPIServer]:
    with SlackAPIServer() as s:
        yield s


@pytest.fixture
def loop() -> Iterator[LoopThread]:
    lt = LoopThread()
    yield lt
    lt.close()


class Bridges:
    """Starts bridges on the test loop and stops every one of them at teardown (before the server stops)."""

    def __init__(self, server: SlackAPIServer, loop: LoopThread) -> None:
        self.server, self.loop = server, loop
        self.started: list[SocketModeBridge] = []

    def start(self, inbound: RecordingInbound, token: str = APP_TOKEN, **kwargs: Any) -> SocketModeBridge:
        async def make_and_start() -> SocketModeBridge:
            bridge = SocketModeBridge(token, inbound, base_url=self.server.base_url, **kwargs)
            await bridge.start()
            return bridge

        bridge = self.loop.run(make_and_start())
        self.started.append(bridge)
        return bridge

    def stop_all(self) -> None:
        for bridge in self.started:
            self.loop.run(bridge.stop())


@pytest.fixture
def bridges(server: SlackAPIServer, loop: LoopThread) -> Iterator[Bridges]:
    b = Bridges(server, loop)
    yield b
    b.stop_all()


def acked(server: SlackAPIServer, envelope_id: str) -> dict[str, Any]:
    assert server.wait_for(lambda s: s.socket_ack(envelope_id) is not None, timeout=WAIT), "envelope never acked"
    ack = server.socket_ack(envelope_id)
    assert ack is not None
    return ack


# -- the bridge ----------------------------------------------------------------------------------


def test_slash_command_goes_to_inbound_and_its_answer_rides_the_ack(server, bridges):
    inbound = RecordingInbound()
    bridges.start(inbound)
    [opened] = server.calls_to(CONNECTIONS_OPEN)
    assert opened.ok and opened.token == APP_TOKEN

    fields = slash_command(server)
    env = server.push("slash_commands", fields)
    ack = acked(server, env)

    assert inbound.commands == [fields]  # every field, as Slack sent it
    assert inbound.interactions == []
    assert ack == {"envelope_id": env,
                   "payload": {"response_type": "ephemeral", "text": "run run-42: training, step 1200"}}
    assert len(server.socket_acks()) == 1  # acked once


def test_non_string_fields_reach_inbound_as_form_strings(server, bridges):
    inbound = RecordingInbound()
    bridges.start(inbound)
    fields = dict(slash_command(server), is_enterprise_install=False, extra=None)
    acked(server, server.push("slash_commands", fields))
    [form] = inbound.commands
    assert form["is_enterprise_install"] == "false" and "extra" not in form
    assert all(isinstance(v, str) for v in form.values())


def test_block_actions_are_handled_and_acked(server, bridges):
    inbound = RecordingInbound(interaction_answer={"text": "acknowledged by alice"})
    bridges.start(inbound)
    payload = block_actions()
    env = server.push("interactive", payload)
    assert acked(server, env) == {"envelope_id": env, "payload": {"text": "acknowledged by alice"}}
    assert inbound.interactions == [payload]
    assert inbound.commands == []


def test_an_interaction_with_nothing_to_say_is_acked_without_payload(server, bridges):
    inbound = RecordingInbound(interaction_answer=None)
    bridges.start(inbound)
    env = server.push("interactive", block_actions("pause"))
    assert acked(server, env) == {"envelope_id": env}
    assert [i["actions"][0]["action_id"] for i in inbound.interactions] == ["pause"]


def test_no_payload_where_the_envelope_accepts_none(server, bridges):
    inbound = RecordingInbound(interaction_answer={"text": "acknowledged"})
    bridges.start(inbound)
    env = server.push("interactive", block_actions(), accepts_response_payload=False)
    assert acked(server, env) == {"envelope_id": env}
    assert len(inbound.interactions) == 1  # still handled


def test_other_envelope_types_are_acked_and_ignored(server, bridges):
    inbound = RecordingInbound()
    bridges.start(inbound)
    env = server.push("events_api", {"type": "event_callback", "event": {"type": "app_mention", "text": "hi"}},
                      accepts_response_payload=False)
    assert acked(server, env) == {"envelope_id": env}
    assert inbound.commands == [] and inbound.interactions == []


def test_a_failing_inbound_still_acks_with_an_error_text(server, bridges, caplog):
    inbound = RecordingInbound(fail=True)
    bridges.start(inbound)
    with caplog.at_level(logging.DEBUG):  # even the debug log must not carry the token
        cmd = server.push("slash_commands", slash_command(server))
        click = server.push("interactive", block_actions())
        cmd_ack, click_ack = acked(server, cmd), acked(server, click)

    for env, ack in ((cmd, cmd_ack), (click, click_ack)):
        assert ack["envelope_id"] == env
        assert ack["payload"]["response_type"] == "ephemeral" and "could not handle" in ack["payload"]["text"]
        assert ack["payload"] == ERROR_ANSWER
    assert len(inbound.commands) == 1 and len(inbound.interactions) == 1
    failures = [r for r in caplog.records if r.name == "msmon.bot" and r.exc_info]
    assert len(failures) == 2
    assert "inbound exploded on purpose" in caplog.text and "/msmon from user U0ALICE01" in caplog.text
    assert APP_TOKEN not in caplog.text and APP_TOKEN[len("xapp-"):] not in caplog.text
    assert server.response_url("r1") not in caplog.text


def test_a_slow_handler_is_acked_in_time_and_its_answer_posted_to_the_response_url(server, bridges):
    gate = threading.Event()
    inbound = RecordingInbound(gate=gate)
    bridges.start(inbound, ack_timeout=0.2)
    env = server.push("slash_commands", slash_command(server, "status run-7"))
    assert acked(server, env) == {"envelope_id": env, "payload": WORKING_ANSWER}
    assert server.responses() == []  # nothing yet: the handler is still waiting
    gate.set()
    assert server.wait_for(lambda s: len(s.responses()) == 1, timeout=WAIT)
    [late] = server.responses("r1")
    assert late["text"] == "run run-7: training, step 1200" and late["response_type"] == "ephemeral"
    assert len(server.socket_acks()) == 1  # acked once, not again when the answer came


def test_envelopes_are_handled_concurrently(server, bridges):
    gate = threading.Event()
    slow = RecordingInbound(gate=gate)
    bridges.start(slow, ack_timeout=WAIT)
    first = server.push("slash_commands", slash_command(server, "status run-1"))
    second = server.push("slash_commands", slash_command(server, "status run-2"))
    assert server.wait_for(lambda s: len(slow.commands) == 2, timeout=WAIT)  # both in flight at once
    assert server.socket_acks() == []
    gate.set()
    assert acked(server, first)["payload"]["text"] == "run run-1: training, step 1200"
    assert acked(server, second)["payload"]["text"] == "run run-2: training, step 1200"


def test_reconnects_when_slack_asks_and_keeps_serving(server, bridges):
    inbound = RecordingInbound()
    bridges.start(inbound)
    assert server.wait_for(lambda s: s.socket_connections() == 1, timeout=WAIT)
    server.socket_disconnect("refresh_requested")
    assert server.wait_for(lambda s: s.socket_connections_accepted() == 2 and s.socket_connections() == 1,
                           timeout=WAIT), "the client did not reconnect"
    assert len(server.calls_to(CONNECTIONS_OPEN)) == 2  # a fresh URL for the new connection
    env = server.push("slash_commands", slash_command(server))
    assert acked(server, env)["payload"]["response_type"] == "ephemeral"
    assert len(inbound.commands) == 1


def test_stop_disconnects(server, bridges, loop):
    bridge = bridges.start(RecordingInbound())
    assert loop.run(bridge.connected())
    assert server.wait_for(lambda s: s.socket_connections() == 1, timeout=WAIT)
    loop.run(bridge.stop())
    assert server.wait_for(lambda s: s.socket_connections() == 0, timeout=WAIT)
    assert not loop.run(bridge.connected())
    loop.run(bridge.stop())  # twice is fine
    assert APP_TOKEN not in repr(bridge)


@pytest.mark.parametrize("token", ["xoxb-1234-5678-secretpart", "", "not-a-token-at-all"])
def test_a_token_that_is_not_an_app_token_is_refused_at_start(server, loop, token):
    bridge = SocketModeBridge(token, RecordingInbound(), base_url=server.base_url)
    with pytest.raises(SocketModeError, match="app-level token \\(xapp-") as ei:
        loop.run(bridge.start())
    if token:
        assert token not in str(ei.value) and "secretpart" not in str(ei.value)
    assert server.calls_to(CONNECTIONS_OPEN) == []  # refused before asking Slack
    loop.run(bridge.stop())  # not started: a no-op


def test_slack_refusing_the_connection_fails_start_clearly(server, loop):
    server.fail(CONNECTIONS_OPEN, status=500)
    bridge = SocketModeBridge(APP_TOKEN, RecordingInbound(), base_url=server.base_url)
    with pytest.raises(SocketModeError, match="apps.connections.open: internal_error") as ei:
        loop.run(bridge.start())
    assert APP_TOKEN not in str(ei.value)
    assert server.socket_connections() == 0


def test_unreachable_slack_fails_start_clearly(loop):
    with SlackAPIServer() as s:
        base_url = s.base_url  # a port nobody listens on once stopped
    bridge = SocketModeBridge(APP_TOKEN, RecordingInbound(), base_url=base_url)
    with pytest.raises(SocketModeError, match="could not reach Slack"):
        loop.run(bridge.start())


def test_a_websocket_that_never_opens_fails_start_clearly(loop):
    """apps.connections.open answers, but its URL leads nowhere (as behind a proxy that blocks websockets)."""
    with SlackAPIServer() as gone:
        dead_url = gone.url.replace("http://", "ws://") + "/socket-mode/x"

    async def connections_open(request: web.Request) -> web.Response:
        return web.json_response({"ok": True, "url": dead_url})

    async def serve() -> web.AppRunner:
        app = web.Application()
        app.router.add_post("/api/apps.connections.open", connections_open)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        return runner

    runner = loop.run(serve())
    try:
        port = runner.addresses[0][1]
        bridge = SocketModeBridge(APP_TOKEN, RecordingInbound(), base_url=f"http://127.0.0.1:{port}/api/",
                                  connect_timeout=0.5)
        with pytest.raises(SocketModeError, match="websocket did not open within 0.5 s"):
            loop.run(bridge.start())
        loop.run(bridge.stop())  # start failed: nothing to stop
    finally:
        loop.run(runner.cleanup())


# -- the server's Socket Mode side, driven by a raw websocket client --------------------------------


def test_server_socket_mode_protocol(server):
    async def go() -> None:
        with pytest.raises(SlackApiError) as ei:  # a bot token cannot open Socket Mode, as on Slack
            await AsyncWebClient(base_url=server.base_url).apps_connections_open(app_token="xoxb-bot")
        assert ei.value.response["error"] == "not_allowed_token_type"
        opened = await AsyncWebClient(base_url=server.base_url).apps_connections_open(app_token=APP_TOKEN)
        url = opened["url"]
        assert url.startswith(f"ws://127.0.0.1:{server.port}/socket-mode/")
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{server.url}/socket-mode/not-issued") as resp:
                assert resp.status == 404
            async with http.ws_connect(url) as ws:
                hello = await ws.receive_json(timeout=WAIT)
                assert hello["type"] == "hello" and hello["num_connections"] == 1
                assert hello["connection_info"]["app_id"] == APP_ID
                env = await asyncio.to_thread(server.push, "interactive", {"type": "block_actions"})
                msg = await ws.receive_json(timeout=WAIT)
                assert msg == {"envelope_id": env, "type": "interactive", "payload": {"type": "block_actions"},
                               "accepts_response_payload": True}
                woke = asyncio.create_task(asyncio.to_thread(
                    server.wait_for, lambda s: s.socket_ack(env) is not None, WAIT))
                await ws.send_str(json.dumps({"envelope_id": env, "payload": {"text": "ok"}}))
                assert await woke  # wait_for wakes on acks
                await ws.send_str("not json")  # ignored, like Slack does
                await asyncio.to_thread(server.socket_disconnect)
                assert (await ws.receive_json(timeout=WAIT))["type"] == "disconnect"
        assert server.socket_acks() == [{"envelope_id": env, "payload": {"text": "ok"}}]
        assert await asyncio.to_thread(server.wait_for, lambda s: s.socket_connections() == 0, WAIT)
        server.reset()
        assert server.socket_acks() == []

    asyncio.run(go())


def test_push_without_a_client_is_an_error(server):
    with pytest.raises(RuntimeError, match="no Socket Mode client connected"):
        server.push("slash_commands", {}, timeout=0.2)
