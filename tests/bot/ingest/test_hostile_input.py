"""Hostile input at the bot's edge: every request in the table gets a 4xx with a reason, never a 5xx,
a traceback or a hang. The real bot on loopback; requests sent with http.client so headers can carry
raw bytes."""

from __future__ import annotations

import http.client
import json
import logging
import time
from typing import Any
from urllib.parse import urlencode

import msgspec
import pytest
from slack_sdk.signature import SignatureVerifier

from msmon.contract.wire import Envelope, Sample, encode
from tests.fakes.bot_server import BotServer
from tests.fakes.slack_signing import SECRET

pytest.importorskip("aiohttp")

BIG = 2**63
DEEP = b'{"a":' * 1000 + b"1" + b"}" * 1000  # 1,000 levels in about 6 KB


@pytest.fixture(scope="module")
def bot(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hostile")
    env = {"MSMON_HOSTILE_JOB": "job-token", "MSMON_HOSTILE_OP": "operator-token", "MSMON_HOSTILE_SIGN": SECRET}
    mp = pytest.MonkeyPatch()  # module-scoped: the function-scoped monkeypatch fixture cannot be used here
    for k, v in env.items():
        mp.setenv(k, v)
    b = BotServer({"bot": {
        "port": 0, "state_path": str(tmp / "bot.sqlite"), "tokens": [{"project": "llm", "env": "MSMON_HOSTILE_JOB"}],
        "slack": {"signing_secret_env": "MSMON_HOSTILE_SIGN"}, "console": {"charts": False},
        "commands": {"allow": [{"project": "llm", "users": ["U0ALICE", "cli:carol"]}],
                     "operators": [{"user": "cli:carol", "env": "MSMON_HOSTILE_OP"}]}}})
    now = time.time()
    body = encode(Envelope(run_id="run-42", device="0", sent_at=now, project="llm",
                           samples=[Sample(run_id="run-42", device="0", step=100, time=now, loss=2.0)]))
    assert raw(b, "POST", "/v1/ingest", body)[0] == 202
    yield b
    b.stop()
    mp.undo()


def raw(bot: BotServer, method: str, path: str, body: bytes = b"", headers: dict[str, bytes | str] | None = None,
        token: bytes | str | None = "job-token") -> tuple[int, Any]:
    """(status, JSON or text) of one request, header values sent as given (bytes included)."""
    conn = http.client.HTTPConnection("127.0.0.1", bot.port, timeout=10)
    try:
        conn.putrequest(method, path, skip_accept_encoding=True)
        hdrs: dict[str, bytes | str] = {"Content-Type": "application/json", **(headers or {})}
        if token is not None:
            hdrs.setdefault("Authorization", token if isinstance(token, bytes) else f"Bearer {token}")
        hdrs["Content-Length"] = str(len(body))
        for k, v in hdrs.items():
            conn.putheader(k, v)
        conn.endheaders(body)
        resp = conn.getresponse()
        data = resp.read()
        try:
            return resp.status, json.loads(data)
        except ValueError:
            return resp.status, data.decode("utf-8", "replace")
    finally:
        conn.close()


_seq = iter(range(10**9))


def signed(bot: BotServer, path: str, form: dict[str, str], ts: str | None = None) -> tuple[int, Any]:
    """A form post signed with the bot's secret (each body unique: no replay)."""
    body = urlencode({**form, "trigger_id": f"t{next(_seq)}"}).encode()
    ts = ts or str(int(time.time()))
    sig = SignatureVerifier(SECRET).generate_signature(timestamp=ts, body=body)
    return raw(bot, "POST", path, body, {"Content-Type": "application/x-www-form-urlencoded",
                                         "X-Slack-Request-Timestamp": ts, "X-Slack-Signature": sig}, token=None)


def signed_raw(bot: BotServer, path: str, body: bytes) -> tuple[int, Any]:
    """`body` (any bytes) signed with the bot's secret as Slack signs: v0=HMAC-SHA256(v0:ts:body)."""
    import hashlib
    import hmac

    ts = str(int(time.time()))
    sig = "v0=" + hmac.new(SECRET.encode(), b"v0:" + ts.encode() + b":" + body, hashlib.sha256).hexdigest()
    return raw(bot, "POST", path, body, {"Content-Type": "application/x-www-form-urlencoded",
                                         "X-Slack-Request-Timestamp": ts, "X-Slack-Signature": sig}, token=None)


def click(bot: BotServer, payload: Any) -> tuple[int, Any]:
    return signed(bot, "/slack/interactions", {"payload": json.dumps(payload)})


def env(**kw: Any) -> bytes:
    return json.dumps({"run_id": "run-42", "device": "0", "sent_at": 1.0, "project": "llm", **kw}).encode()


def sample(**kw: Any) -> dict[str, Any]:
    return {"run_id": "run-42", "device": "0", "step": 101, "time": 1.0, **kw}


def action(**kw: Any) -> dict[str, Any]:
    return {"run_id": "run-42", "device": "0", "step": 101, "time": 1.0, "action": "pause", "ok": True,
            "detail": "", **kw}


def hb(**kw: Any) -> bytes:
    return json.dumps({"run_id": "run-42", "device": "0", "time": 1.0, **kw}).encode()


CLICK = {"type": "block_actions", "user": {"id": "U0ALICE", "username": "alice"}, "channel": {"id": "C0"},
         "message": {"ts": "1.0"}, "actions": [{"action_id": "a", "value": "status run-42"}]}

# (name, request) -> the request's (status, body); every one must be a 4xx with an `error` reason.
CASES: dict[str, Any] = {
    "raw bytes in Authorization": lambda b: raw(b, "GET", "/v1/runs", token=b"Bearer \xff\xfe\x80job"),
    "raw bytes, no Bearer": lambda b: raw(b, "GET", "/v1/runs", token=b"\xc3\x28"),
    "non-numeric Slack timestamp": lambda b: signed(b, "/slack/commands", {"user_id": "U0ALICE", "text": "help"},
                                                    ts="12ab"),
    "non-ASCII Slack signature": lambda b: raw(
        b, "POST", "/slack/commands", b"user_id=U0ALICE&text=help",
        {"Content-Type": "application/x-www-form-urlencoded", "X-Slack-Request-Timestamp": str(int(time.time())),
         "X-Slack-Signature": b"v0=\xc3\xa9" + b"0" * 62}, token=None),
    "Slack timestamp with a sign": lambda b: signed(b, "/slack/commands", {"user_id": "U0ALICE"}, ts="-1"),
    "Slack timestamp of 40 digits": lambda b: signed(b, "/slack/commands", {"user_id": "U0ALICE"}, ts="9" * 40),
    "JSON nested 1000 deep (ingest)": lambda b: raw(b, "POST", "/v1/ingest", b"[" * 1000 + b"]" * 1000),
    "signed Slack slash command that is not UTF-8": lambda b: signed_raw(
        b, "/slack/commands", b"user_id=U0ALICE&text=status+run-42\xff\xfe\xc3\x28"),
    "JSON nested 1000 deep in params": lambda b: raw(
        b, "POST", "/v1/ingest", env(actions=[action()]).replace(b'"detail": ""', b'"detail": "", "params": ' + DEEP)),
    "JSON nested 1000 deep with a NaN": lambda b: raw(
        b, "POST", "/v1/ingest",
        env(samples=[sample(loss="NaN")]).replace(b'"sent_at"', b'"labels": {"x": ' + DEEP + b'}, "sent_at"')),
    "JSON nested 40 deep in params": lambda b: raw(
        b, "POST", "/v1/ingest",
        env(actions=[action()]).replace(b'"detail": ""', b'"detail": "", "params": ' + b'{"a":' * 40 + b"1" +
                                        b"}" * 40)),
    "sample step 2^63": lambda b: raw(b, "POST", "/v1/ingest", env(samples=[sample(step=BIG)])),
    "sample step 2^64": lambda b: raw(b, "POST", "/v1/ingest", env(samples=[sample(step=2**64)])),
    "sample step -2^63-1": lambda b: raw(b, "POST", "/v1/ingest", env(samples=[sample(step=-BIG - 1)])),
    "heartbeat step 2^63": lambda b: raw(b, "POST", "/v1/heartbeat", hb(step=BIG)),
    "heartbeat pid 2^63": lambda b: raw(b, "POST", "/v1/heartbeat", hb(pid=BIG)),
    "heartbeat total_steps 2^63": lambda b: raw(b, "POST", "/v1/heartbeat", hb(total_steps=BIG)),
    "envelope heartbeat step 2^63": lambda b: raw(b, "POST", "/v1/ingest", env(heartbeats=[json.loads(hb(step=BIG))])),
    "poll after 2^63": lambda b: raw(b, "POST", "/v1/commands/poll",
                                     json.dumps({"run_id": "run-42", "device": "0", "after": BIG, "wait": 0}).encode()),
    "poll after -1": lambda b: raw(b, "POST", "/v1/commands/poll",
                                   json.dumps({"run_id": "run-42", "device": "0", "after": -1, "wait": 0}).encode()),
    "poll wait NaN": lambda b: raw(b, "POST", "/v1/commands/poll",
                                   b'{"run_id": "run-42", "device": "0", "wait": "NaN"}'),
    "run id of 10,000 characters": lambda b: raw(b, "POST", "/v1/ingest", env(run_id="r" * 10_000)),
    "device of 10,000 characters": lambda b: raw(b, "POST", "/v1/heartbeat", hb(device="d" * 10_000)),
    "status with a 10,000-character run id": lambda b: raw(
        b, "POST", "/v1/commands", json.dumps({"text": "status " + "r" * 10_000}).encode(), token="operator-token"),
    "slash status with a 10,000-character run id": lambda b: _slash_4xx(
        signed(b, "/slack/commands", {"user_id": "U0ALICE", "text": "status " + "r" * 10_000})),
    "interaction: actions not a list": lambda b: click(b, {**CLICK, "actions": {"value": "status run-42"}}),
    "interaction: actions a string": lambda b: click(b, {**CLICK, "actions": "status run-42"}),
    "interaction: an action not an object": lambda b: click(b, {**CLICK, "actions": [5]}),
    "interaction: value not a string": lambda b: click(b, {**CLICK, "actions": [{"value": ["pause", "run-42"]}]}),
    "interaction: no value": lambda b: click(b, {**CLICK, "actions": [{"action_id": "a"}]}),
    "interaction: user a string": lambda b: click(b, {**CLICK, "user": "U0ALICE"}),
    "interaction: no user": lambda b: click(b, {k: v for k, v in CLICK.items() if k != "user"}),
    "interaction: user id a number": lambda b: click(b, {**CLICK, "user": {"id": 7}}),
    "interaction: channel a list": lambda b: click(b, {**CLICK, "channel": ["C0"]}),
    "interaction: message a string": lambda b: click(b, {**CLICK, "message": "1.0"}),
    "interaction: response_url a number": lambda b: click(b, {**CLICK, "response_url": 5}),
    "interaction: payload a list": lambda b: click(b, [CLICK]),
    "interaction: type missing": lambda b: click(b, {k: v for k, v in CLICK.items() if k != "type"}),
    "ingest as text/plain": lambda b: raw(b, "POST", "/v1/ingest", env(), {"Content-Type": "text/plain"}),
    "ingest, invalid UTF-8": lambda b: raw(b, "POST", "/v1/ingest", b'{"run_id": "\xff\xfe"}'),
    "GET on a POST route": lambda b: raw(b, "GET", "/v1/ingest"),
}


def _slash_4xx(answer: tuple[int, Any]) -> tuple[int, Any]:
    """A slash command always answers 200 (Slack shows only those); a refusal is its private text."""
    code, body = answer
    if code == 200 and isinstance(body, dict) and body.get("response_type") == "ephemeral":
        return 422, {"error": body["text"]}
    return code, body


@pytest.mark.parametrize("name", list(CASES))
def test_hostile_input_gets_a_4xx_with_a_reason(bot, name):
    t0 = time.monotonic()
    code, body = CASES[name](bot)
    assert 400 <= code < 500, (name, code, body)
    assert isinstance(body, dict) and (body.get("error") or body.get("text")), (name, body)  # Answer: text
    assert time.monotonic() - t0 < 2.0, name  # no hang (difflib over 10,000 characters took seconds)


def test_the_bot_still_serves_after_the_table(bot):
    for name in CASES:
        CASES[name](bot)
    code, body = raw(bot, "GET", "/v1/runs/run-42")
    assert code == 200 and body["last_step"] == 100, body
    _, metrics = raw(bot, "GET", "/metrics")
    assert 'status="500"' not in metrics


def test_an_odd_interaction_over_socket_mode_is_answered_without_a_traceback(tmp_path, monkeypatch, caplog, bot_server):
    from tests.fakes.slack_api import SlackAPIServer

    monkeypatch.setenv("MSMON_HOSTILE_APP", "xapp-1-A0MSMON01-1-abc")
    with SlackAPIServer() as slack:
        b = bot_server({"bot": {"port": 0, "state_path": str(tmp_path / "bot.sqlite"), "console": {"charts": False},
                                "slack": {"base_url": slack.base_url, "socket_mode": True,
                                          "app_token_env": "MSMON_HOSTILE_APP"}}})
        assert slack.wait_for(lambda s: s.socket_connections() == 1, timeout=15)
        eid = slack.push("interactive", {**CLICK, "actions": "pause run-42"})
        assert slack.wait_for(lambda s: s.socket_ack(eid) is not None, timeout=10)
        text = slack.socket_ack(eid)["payload"]["text"]
        assert "could not read that request" in text and "actions" in text, text
        b.stop()  # before the Slack API goes: its socket closing is no error of the bot
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR and r.name.startswith("msmon")]


def test_a_405_names_the_allowed_methods(bot):
    conn = http.client.HTTPConnection("127.0.0.1", bot.port, timeout=10)
    conn.request("GET", "/v1/ingest", headers={"Authorization": "Bearer job-token"})
    resp = conn.getresponse()
    resp.read()
    assert resp.status == 405 and resp.getheader("Allow") == "POST"
    conn.close()


def test_the_spec_states_the_wires_limits():
    """docs/openapi.yaml and msmon/contract/wire.py give the same numbers."""
    import yaml

    from msmon.contract import wire
    from tests.conftest import ROOT

    schemas = yaml.safe_load((ROOT / "docs" / "openapi.yaml").read_text())["components"]["schemas"]
    assert schemas["RunId"]["maxLength"] == schemas["Id"]["maxLength"] == wire.MAX_ID
    assert schemas["Text"]["maxLength"] == wire.MAX_TEXT
    assert schemas["Step"]["maximum"] == -schemas["Step"]["minimum"] == schemas["Count"]["maximum"] == wire.MAX_COUNT
    assert schemas["Envelope"]["properties"]["samples"]["maxItems"] == wire.MAX_ITEMS
    for name, struct in (("Envelope", wire.Envelope), ("Heartbeat", wire.Heartbeat), ("Poll", wire.Poll)):
        info = {f.name: f.type for f in msgspec.inspect.type_info(struct).fields}
        for field, spec in schemas[name]["properties"].items():
            t = info[field]
            if isinstance(t, msgspec.inspect.UnionType):  # an optional field: its limits are on the non-None type
                t = next(x for x in t.types if not isinstance(x, msgspec.inspect.NoneType))
            for key, attr in (("maxLength", "max_length"), ("maximum", "le"), ("minimum", "ge"),
                              ("maxItems", "max_length")):
                if key in spec:
                    assert getattr(t, attr) == spec[key], (name, field, key)
