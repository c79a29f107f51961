"""Matrix with a real homeserver: matrix-synapse on loopback (tests/fakes/synapse.py), the real bot
and a real MindSpore CPU training. An ERROR arrives in the room with its chart in the alert's thread;
an allowed user's `!msmon pause` pauses the job and the result is posted in the command's thread; a
user not on the allow-list is refused there. The receiver's escaping and its mapping of a
homeserver's errors to DeliveryError are checked on their own."""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from tests.fakes.synapse import Synapse, User, synapse_problem

pytest.importorskip("nio")

# one Synapse (the module fixture, about 20 s to start) for all of them: the module stays on one xdist worker
# (make unit: --dist loadscope; the group says so too, for when pytest-xdist names groups again under pytest 9)
pytestmark = pytest.mark.xdist_group("synapse")
if synapse_problem():
    pytest.skip(str(synapse_problem()), allow_module_level=True)

from aiohttp import web  # noqa: E402

from bot.chat.matrix.receiver import MatrixReceiver, content, note_content  # noqa: E402
from bot.receivers import DeliveryError, Message, Note, ReplyTo  # noqa: E402
from msmon.contract.wire import Event, Severity, Status  # noqa: E402
from tests.fakes.bot_server import BotServer, wait_for  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def homeserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Synapse, dict[str, User], str]]:
    """Synapse with three users (the bot, alice who may change jobs, mallory who may not) in one room."""
    with Synapse(tmp_path_factory.mktemp("synapse")) as hs:
        users = {name: hs.register(name) for name in ("msmon", "alice", "mallory")}
        room = users["alice"].create_room(invite=[users["msmon"].user_id])
        users["mallory"].join(room)
        yield hs, users, room


def _relates(e: dict[str, Any]) -> dict[str, Any]:
    rel: dict[str, Any] = e["content"].get("m.relates_to") or {}
    return rel


def in_thread(user: User, room: str, root: str, sender: str) -> list[dict[str, Any]]:
    return [e for e in user.messages(room) if e["sender"] == sender and _relates(e).get("rel_type") == "m.thread"
            and _relates(e).get("event_id") == root]


def job_config(bot: BotServer, tmp_path: Any) -> dict[str, Any]:
    """The job of test_chatops_e2e with an absolute grad-norm ERROR threshold every step crosses."""
    return {"monitor_config": {
        "monitor_on": True, "step_interval": 1, "log_interval": 0,
        "alert": {"baseline_steps": 20, "grad_norm_threshold": 1e-9, "alert_interval": 10_000,
                  # out_of_scale off: 1e-9 is meant, not a level of another model's scale
                  "rules": {"grad_norm": {"out_of_scale": None}, "grad_norm_spike": {"enable": False},
                            "loss_spike": {"enable": False},
                            "grad_norm_creep": {"enable": False}, "convergence": {"enable": False}}},
        "bot": {"url": bot.url, "token_env": "MSMON_TEST_TOKEN", "project": "llm", "heartbeat_interval": 0.2,
                "spool_dir": str(tmp_path / "spool")}}}


@pytest.mark.mindspore
def test_alert_with_chart_and_commands_in_a_real_homeserver(homeserver, tmp_path, monkeypatch, bot_server):
    ms = pytest.importorskip("mindspore")
    from notifier.mindspore import MonitorCallback
    from tests.e2e.test_chatops import Pace, command_done
    from tests.fakes.ms_helpers import dataset, model, regression_data

    hs, users, room = homeserver
    alice, mallory, me = users["alice"], users["mallory"], users["msmon"].user_id
    monkeypatch.setenv("MSMON_TEST_TOKEN", "job-token")
    monkeypatch.setenv("MATRIX_ACCESS_TOKEN", users["msmon"].token)
    before = alice.say(room, "!msmon help")  # typed before the bot started: never answered
    bot = bot_server({"bot": {
        "port": 0, "state_path": str(tmp_path / "bot.sqlite"),
        "tokens": [{"project": "llm", "env": "MSMON_TEST_TOKEN"}],
        "routes": [{"receiver": "matrix", "channel": room}],
        "matrix": {"homeserver": hs.url, "user_id": me, "rooms": [room]},
        "pipeline": {"group_wait": 0.2, "heartbeat_timeout": 30},
        "rate_limit": {"per_channel": 50, "per_run": 50, "burst": 20},
        "console": {"charts_dir": str(tmp_path / "charts")},
        # long_poll 2: bot.stop() waits out the job's last command poll
        "commands": {"allow": [{"project": "llm", "users": [alice.user_id]}], "long_poll": 2}}})
    m, _, _ = model(lr=0.02)
    x, y = regression_data()
    cb = MonitorCallback(job_config(bot, tmp_path), run_id="run-mx", checkpoint_dir=str(tmp_path / "ckpt"))
    pace = Pace()
    trainer = threading.Thread(target=lambda: m.train(1, dataset(x, y, 256, 100_000), callbacks=[pace, cb],
                                                      dataset_sink_mode=False))
    trainer.start()
    try:
        # 1. the ERROR in the room (HTML and plain bodies), its chart as an m.image in the alert's thread
        def alert() -> dict[str, Any] | None:
            return next((e for e in alice.messages(room) if e["sender"] == me
                         and e["content"].get("body", "").startswith("ERROR grad_norm")), None)

        assert wait_for(lambda: alert() is not None, timeout=60), alice.messages(room)
        ev = alert()
        assert ev is not None
        c = ev["content"]
        assert c["format"] == "org.matrix.custom.html" and "<strong>ERROR grad_norm" in c["formatted_body"]
        assert "run run-mx" in c["body"] and "vs threshold 1e-09" in c["body"] and "now: loss" in c["body"]
        assert wait_for(lambda: any(e["content"].get("msgtype") == "m.image"
                                    for e in in_thread(alice, room, ev["event_id"], me)), timeout=30)
        image = next(e for e in in_thread(alice, room, ev["event_id"], me) if e["content"]["msgtype"] == "m.image")
        assert image["content"]["info"]["mimetype"] == "image/png"
        assert alice.download(image["content"]["url"]).startswith(PNG)

        # 2. alice may pause: the job stops stepping, the queued answer and the result in her message's thread
        asked = alice.say(room, "!msmon pause run-mx")
        assert wait_for(lambda: bot.store.commands.get("c1") is not None, timeout=20)  # the sync loop took it
        cmd = command_done(bot, "c1", timeout=30)
        assert cmd["source"] == "matrix" and "paused at step" in cmd["results"]["0"]["detail"]
        assert wait_for(lambda: bot.store.run("run-mx")["paused"], timeout=5)
        paused_at = cmd["results"]["0"]["step"]
        assert wait_for(lambda: any("c1" in e["content"]["body"] and "device 0 OK" in e["content"]["body"]
                                    for e in in_thread(alice, room, asked, me)), timeout=20), alice.messages(room)
        bodies = [e["content"]["body"] for e in in_thread(alice, room, asked, me)]
        assert any("queued as c1" in b for b in bodies), bodies
        assert max(s for s, _ in pace.steps) == paused_at

        # 3. mallory is refused, in her message's thread; the attempt is recorded as denied
        refused = mallory.say(room, "!msmon resume run-mx")
        assert wait_for(lambda: any("may not `resume`" in e["content"]["body"]
                                    for e in in_thread(alice, room, refused, me)), timeout=20), alice.messages(room)
        assert bot.store.run("run-mx")["paused"] and bot.store.commands.get("c2")["status"] == "denied"
        assert in_thread(alice, room, before, me) == []
    finally:
        cb.control.request("resume")
        cb.control.request("stop")
        trainer.join(30)
    assert ms is not None


def _message(run_id: str, message: str, hint: str) -> Message:
    ev = Event(run_id=run_id, device="0", step=7, time=0.0, rule="grad_norm", severity=Severity.ERROR,
               status=Status.FIRING, message=message, value=3.0, threshold=1.0, hint=hint)
    return Message(key="k", run_id=run_id, project="p", rule="grad_norm", severity=Severity.ERROR,
                   status=Status.FIRING, events=[ev])


def test_job_data_is_escaped_in_both_bodies_and_mentions_nobody():
    c = content(_message('<a href="x">run</a>', "<img src=x onerror=alert(1)> @room", "@room <b>now</b>"))
    assert "<img" not in c["formatted_body"] and "<a href" not in c["formatted_body"]
    assert "&lt;img src=x onerror=alert(1)&gt;" in c["formatted_body"]
    assert "@room" not in c["body"] and "@\u2060room" in c["body"]
    assert c["m.mentions"] == {}
    n = note_content(Note(text="c1 `pause <x>` done", mentions=["@alice:example.org", "oncall"]))
    assert n["m.mentions"] == {"user_ids": ["@alice:example.org"]} and "&lt;x&gt;" in n["formatted_body"]
    assert 'href="https://matrix.to/#/@alice:example.org"' in n["formatted_body"]


def test_a_64_kb_message_still_fits_one_matrix_event():
    huge = '"<&>' * 16_384  # 64 KB of characters that HTML-escape to the longest entities
    c = content(_message("run-1", huge, huge))
    assert len(json.dumps(c).encode()) < 65_536 and "[cut]" in c["body"]
    assert len(json.dumps(note_content(Note(text=huge))).encode()) < 65_536


def _serve(status: int, answer: dict[str, Any]) -> web.Application:
    async def handler(request: web.Request) -> web.Response:
        return web.json_response(answer, status=status)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    return app


@pytest.mark.parametrize(("status", "answer", "retry"), [
    (429, {"errcode": "M_LIMIT_EXCEEDED", "error": "Too many requests", "retry_after_ms": 2500}, 2.5),
    (502, {"errcode": "M_UNKNOWN", "error": "bad gateway"}, None),
    (403, {"errcode": "M_FORBIDDEN", "error": "not in room"}, None),
])
def test_homeserver_errors_become_delivery_errors(status, answer, retry):
    async def go() -> DeliveryError:
        runner = web.AppRunner(_serve(status, answer))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        rx = MatrixReceiver(f"http://127.0.0.1:{port}", "@msmon:localhost", "token", timeout=5)
        try:
            with pytest.raises(DeliveryError) as info:
                await rx.post("!room:localhost", _message("run-1", "m", "h"))
            with pytest.raises(DeliveryError):
                await rx.note(Note(text="x", reply_to=ReplyTo(channel="!room:localhost", thread="$e")))
            return info.value
        finally:
            await rx.client.close()
            await runner.cleanup()

    err = asyncio.run(go())
    assert err.retry_after == retry and f"HTTP {status}" in str(err) and answer["errcode"] in str(err)


def test_a_homeserver_that_is_not_there_is_a_delivery_error():
    async def go() -> None:
        rx = MatrixReceiver("http://127.0.0.1:9", "@msmon:localhost", "token", timeout=2)
        try:
            with pytest.raises(DeliveryError, match="Matrix room_send failed"):
                await rx.post("!room:localhost", _message("run-1", "m", "h"))
        finally:
            await rx.client.close()

    asyncio.run(go())


@pytest.mark.parametrize(("matrix", "routes", "key", "says"), [
    ({"homeserver": "matrix.example.org", "user_id": "@msmon:example.org"}, [], "bot.matrix.homeserver", "http://"),
    ({"homeserver": "https://matrix.example.org", "user_id": "msmon"}, [], "bot.matrix.user_id", "@name:server"),
    ({"homeserver": "https://matrix.example.org", "user_id": "@m:example.org", "rooms": ["#ops:example.org"]}, [],
     "bot.matrix.rooms[0]", "not a room ID"),
    ({}, [{"receiver": "matrix", "channel": "!r:example.org"}], "bot.matrix", "homeserver is not set"),
    ({"homeserver": "https://matrix.example.org", "user_id": "@m:example.org"}, [{"receiver": "matrix"}],
     "bot.routes[0].channel", "needs a channel"),
])
def test_matrix_settings_are_checked_with_key_and_line(tmp_path, matrix, routes, key, says):
    import yaml

    from bot.config import load_bot_config
    from msmon.config.errors import ConfigError

    path = tmp_path / "bot.yaml"
    path.write_text(yaml.safe_dump({"bot": {"routes": routes, **({"matrix": matrix} if matrix else {})}}))
    with pytest.raises(ConfigError) as info:
        load_bot_config(path)
    shown = str(info.value)
    assert key in shown and says in shown and re.search(r"\(bot\.yaml:\d+\)", shown), shown


def test_edits_and_threads_on_a_real_homeserver(homeserver):
    """update() edits the alert (m.replace with m.new_content), reply() and a note go in its thread."""
    hs, users, room = homeserver
    bot = users["msmon"]
    msg = _message("run-edit", "grad norm 3 over 1", "scale the LR down")

    async def go() -> str:
        rx = MatrixReceiver(hs.url, bot.user_id, bot.token, timeout=10)
        try:
            ref = await rx.post(room, msg)
            await rx.reply(room, ref, msg)
            msg.status = Status.RESOLVED
            await rx.update(room, ref, msg)
            await rx.note(Note(text="c9 `status run-edit`: fine", reply_to=ReplyTo(channel=room, thread=ref)))
            return ref
        finally:
            await rx.client.close()

    ref = asyncio.run(go())
    events = users["alice"].messages(room)
    (edit,) = [e for e in events if _relates(e).get("rel_type") == "m.replace" and _relates(e)["event_id"] == ref]
    assert edit["content"]["m.new_content"]["body"].startswith("RESOLVED grad_norm: run run-edit")
    assert edit["content"]["body"].startswith("* RESOLVED")
    threaded = [e["content"]["body"] for e in in_thread(users["alice"], room, ref, bot.user_id)]
    assert any(b.startswith("ERROR grad_norm: run run-edit") for b in threaded)
    assert "c9 `status run-edit`: fine" in threaded


def test_which_messages_are_commands_and_where_answers_go():
    from bot.chat.matrix.inbound import command_text, thread_of

    assert command_text("  !msmon pause run-42 ", "!msmon") == "pause run-42"
    assert command_text("!msmon", "!msmon") == ""
    assert command_text("!msmonpause run-42", "!msmon") is None and command_text("hello", "!msmon") is None
    assert command_text("* !msmon pause run-42", "!msmon") is None  # an edit's fallback body
    threaded = {"content": {"m.relates_to": {"rel_type": "m.thread", "event_id": "$root"}}}
    assert thread_of("$cmd", threaded) == "$root" and thread_of("$cmd", {"content": {}}) == "$cmd"
    assert thread_of("$cmd", {"content": {"m.relates_to": {"rel_type": "m.replace", "event_id": "$x"}}}) == "$cmd"


def test_the_bot_starts_while_the_homeserver_is_down(tmp_path, monkeypatch, bot_server):
    """Alerts and the HTTP API do not wait for Matrix: the sync loop retries in the background."""
    monkeypatch.setenv("MATRIX_ACCESS_TOKEN", "t")
    bot = bot_server({"bot": {"port": 0, "state_path": str(tmp_path / "bot.sqlite"), "matrix": {
        "homeserver": "http://127.0.0.1:9", "user_id": "@msmon:localhost", "rooms": ["!r:localhost"]}}})
    code, _ = bot.request("GET", "/healthz", token=None)
    assert code == 200


def test_a_command_typed_while_the_homeserver_was_down_at_the_bots_start_is_answered(homeserver, tmp_path,
                                                                                     monkeypatch, bot_server):
    """The bot starts, the homeserver unreachable from it (its room not joined yet); alice types a command;
    the homeserver comes back: the bot joins, and its first sync's timeline (read back to its start) has
    the command, which is answered. A message typed before the bot started is not."""
    import socket
    import time

    from tests.fakes.peers import TcpProxy

    hs, users, _ = homeserver
    late = hs.register("latebot")
    room = users["alice"].create_room(invite=[late.user_id])
    before = users["alice"].say(room, "!msmon help")
    time.sleep(0.05)
    with socket.socket() as s:  # a port nothing listens on: the proxy closes what it accepts at once
        s.bind(("127.0.0.1", 0))
        nowhere = s.getsockname()[1]
    proxy = TcpProxy("127.0.0.1", nowhere)  # the homeserver as the bot sees it: down until re-aimed
    monkeypatch.setenv("MATRIX_ACCESS_TOKEN", late.token)
    bot = bot_server({"bot": {
        "port": 0, "state_path": str(tmp_path / "bot.sqlite"), "console": {"charts": False},
        "routes": [{"receiver": "matrix", "channel": room}],
        "matrix": {"homeserver": f"http://127.0.0.1:{proxy.port}", "user_id": late.user_id, "rooms": [room],
                   "timeout": 5}}})
    try:
        time.sleep(0.5)  # its first join and sync have failed
        asked = users["alice"].say(room, "!msmon help")
        proxy.target = ("127.0.0.1", hs.port)  # the homeserver is back
        assert wait_for(lambda: in_thread(users["alice"], room, asked, late.user_id), timeout=40), \
            users["alice"].messages(room)
        time.sleep(1.0)
        assert in_thread(users["alice"], room, before, late.user_id) == []
    finally:
        bot.stop()
        proxy.close()
