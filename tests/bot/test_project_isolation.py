"""Projects are walls, and a signed Slack request counts once. The real bot on loopback with two
projects' job tokens, signed Slack posts, a restart on the same SQLite file, and Socket Mode through
the local Slack server's websocket."""

from __future__ import annotations

import json
import logging
import time
import urllib.request
from urllib.parse import urlencode

import pytest

from msmon.contract.wire import ActionResult, Envelope, Heartbeat, Poll, PollAnswer, Sample, decode, encode
from tests.fakes.bot_server import send
from tests.fakes.records import event
from tests.fakes.slack_signing import SECRET, signed_post

pytest.importorskip("aiohttp")

A, B = "job-token", "vision-token"  # project llm's jobs, project vision's jobs


def config(tmp_path, slack, socket_mode=False):
    return {"bot": {
        "port": 0, "state_path": str(tmp_path / "bot.sqlite"),
        "tokens": [{"project": "llm", "env": "MSMON_TEST_TOKEN"}, {"project": "vision", "env": "MSMON_VISION"}],
        "slack": {"base_url": slack.base_url, "max_retries": 1, "socket_mode": socket_mode},
        "console": {"charts": False},
        "commands": {"allow": [{"project": "*", "users": ["U0ALICE", "cli:carol"]}],
                     "operators": [{"user": "cli:carol", "env": "MSMON_OPERATOR"}]}}}


@pytest.fixture
def env(monkeypatch):
    monkeypatch.setenv("MSMON_TEST_TOKEN", A)
    monkeypatch.setenv("MSMON_VISION", B)
    monkeypatch.setenv("MSMON_OPERATOR", "operator-token")
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-test-token")
    monkeypatch.setenv("SLACK_SIGNING_SECRET", SECRET)


@pytest.fixture
def bot(tmp_path, slack, env, bot_server):
    b = bot_server(config(tmp_path, slack))
    yield b


def report(bot, run="run-a", project="llm", token=A, step=100):
    now = time.time()
    samples = [Sample(run_id=run, device="0", step=step - 10 * k, time=now - k, loss=2.0) for k in range(10, -1, -1)]
    return bot.request("POST", "/v1/ingest", encode(Envelope(run_id=run, device="0", sent_at=now, project=project,
                                                              samples=samples)), token=token)


def poll(bot, run="run-a", token=A):
    return bot.request("POST", "/v1/commands/poll", encode(Poll(run_id=run, device="0", wait=0.0)), token=token)


def command(bot, text):
    return bot.request("POST", "/v1/commands", json.dumps({"text": text}).encode(), token="operator-token")


def refused_counts(bot) -> dict[str, float]:
    req = urllib.request.Request(bot.url + "/metrics", headers={"Authorization": "Bearer operator-token"})
    _, text = send(req)
    out = {}
    for line in text.splitlines():
        if line.startswith("msmon_cross_project_refused_total{"):
            labels, value = line.rsplit(" ", 1)
            out[labels.split('route="')[1].split('"')[0]] = float(value)
    return out


def test_another_projects_token_cannot_touch_a_run(bot, caplog):
    """Project vision's token names project llm's run-a every way a job can: each lands in vision's own run of
    that id (run-a@vision) or is refused; llm's run, its command and its step never move."""
    assert report(bot)[0] == 202
    assert command(bot, "save-checkpoint run-a")[0] == 200
    (cmd,) = decode(encode(poll(bot)[1]), PollAnswer).commands
    now = time.time()
    forged = ActionResult(run_id="run-a", device="0", step=cmd.apply_step, time=now, action=cmd.action, ok=True,
                          detail="forged", command_id=cmd.id)
    own_run = {
        "ingest": lambda: report(bot, project="vision", token=B, step=2_000_000),
        "heartbeat": lambda: bot.request("POST", "/v1/heartbeat", encode(
            Heartbeat(run_id="run-a", device="0", time=now, step=2_310_720)), token=B),
        "envelope heartbeat": lambda: bot.request("POST", "/v1/ingest", encode(Envelope(
            run_id="run-a", device="0", sent_at=now, project="vision",
            heartbeats=[Heartbeat(run_id="run-a", device="0", time=now, step=2_310_720)])), token=B),
        "forged result": lambda: bot.request("POST", "/v1/ingest", encode(Envelope(
            run_id="run-a", device="0", sent_at=now, project="vision", actions=[forged])), token=B),
    }
    refused = {  # a token naming a project that is not its own
        "ingest claiming llm": lambda: report(bot, project="llm", token=B, step=2_000_000),
        "heartbeat claiming llm": lambda: bot.request("POST", "/v1/heartbeat", encode(
            Heartbeat(run_id="run-a", device="0", time=now, step=2_310_720, project="llm")), token=B),
        "poll claiming llm": lambda: bot.request("POST", "/v1/commands/poll", encode(
            Poll(run_id="run-a", device="0", wait=0.0, project="llm")), token=B),
    }
    caplog.set_level(logging.WARNING, "msmon")
    assert [name for name, go in own_run.items() if go()[0] != 202] == []
    assert decode(encode(poll(bot, token=B)[1]), PollAnswer).commands == []  # vision's run has no command
    assert [name for name, go in refused.items() if go()[0] != 403] == []
    run = bot.request("GET", "/v1/runs/run-a", token=A)[1]
    assert run["project"] == "llm" and run["last_step"] == 100  # not re-homed, not moved
    theirs = bot.request("GET", "/v1/runs/run-a", token=B)[1]  # vision's own run of that id
    assert theirs["run_id"] == "run-a@vision" and theirs["project"] == "vision" and theirs["last_step"] == 2_310_720
    _, stored = bot.request("GET", f"/v1/commands/{cmd.id}", token="operator-token")
    assert stored["status"] == "pending" and stored["results"] == {}
    assert command(bot, "pause run-a")[1]["command"]["apply_step"] < 1000  # scheduled from A's real step
    refusals = [r.getMessage() for r in caplog.records if "REFUSED" in r.getMessage()]
    assert len(refusals) == len(refused)
    assert all("project 'vision'" in m and "run-a" in m and "llm" in m for m in refusals), refusals
    assert not any(B in m or A in m for m in refusals)  # no secret in the log
    assert sum(refused_counts(bot).values()) == len(refused)
    assert {"/v1/ingest", "/v1/heartbeat", "/v1/commands/poll"} <= set(refused_counts(bot))


def test_a_run_id_cannot_be_squatted_by_another_project(bot):
    """A heartbeat of project vision names run-v first: project llm's job of that id still reports, is
    polled for its commands and shown as its own; vision's keeps its own run."""
    now = time.time()
    code, _ = bot.request("POST", "/v1/heartbeat", encode(Heartbeat(run_id="run-v", device="0", time=now, step=5)),
                          token=B)
    assert code == 202
    assert report(bot, run="run-v", project="llm", token=A)[0] == 202
    assert report(bot, run="run-v", project="vision", token=B)[0] == 202
    assert bot.request("GET", "/v1/runs/run-v", token=B)[1]["project"] == "vision"
    mine = bot.request("GET", "/v1/runs/run-v", token=A)[1]
    assert (mine["project"], mine["run_id"], mine["last_step"]) == ("llm", "run-v@llm", 100)
    assert command(bot, "pause run-v@llm")[0] == 200
    (cmd,) = decode(encode(poll(bot, run="run-v", token=A)[1]), PollAnswer).commands
    assert (cmd.run_id, cmd.action) == ("run-v", "pause")  # the job's own name for its run: it takes it
    assert decode(encode(poll(bot, run="run-v", token=B)[1]), PollAnswer).commands == []


@pytest.mark.parametrize("route", ["/v1/ingest", "/v1/heartbeat", "/v1/commands/poll"])
def test_a_job_cannot_name_its_run_like_another_projects_alias(bot, route):
    """Project llm's token made `sq` and then `sq@vision`: project vision's own `sq` (kept as `sq@vision`, since llm
    has `sq`) was 403 on every envelope, ERRORs included. A job's run id with "@" is refused, naming the field."""
    assert report(bot, run="sq", project="llm", token=A)[0] == 202
    now = time.time()
    bodies = {"/v1/ingest": Envelope(run_id="sq@vision", device="0", sent_at=now, project="llm"),
              "/v1/heartbeat": Heartbeat(run_id="sq@vision", device="0", time=now, step=1, project="llm"),
              "/v1/commands/poll": Poll(run_id="sq@vision", device="0", wait=0.0, project="llm")}
    code, answer = bot.request("POST", route, encode(bodies[route]), token=A)
    assert code == 422 and "run_id 'sq@vision'" in str(answer) and "'@'" in str(answer), (code, answer)
    assert bot.request("GET", "/v1/runs/sq@vision", token=A)[0] == 404  # nothing was made
    # vision's own `sq` reports, ERROR and all, as its own (the bot's alias for it)
    err = Envelope(run_id="sq", device="0", sent_at=now, project="vision", events=[event(run="sq")])
    for _ in range(3):
        assert bot.request("POST", "/v1/ingest", encode(err), token=B)[0] == 202
    mine = bot.request("GET", "/v1/runs/sq@vision", token=B)[1]
    assert (mine["project"], mine["run_id"]) == ("vision", "sq@vision") and mine["firing"]


def test_read_routes_never_show_another_projects_runs(bot):
    assert report(bot)[0] == 202
    assert report(bot, run="run-v", project="vision", token=B)[0] == 202
    assert [r["run_id"] for r in bot.request("GET", "/v1/runs", token=B)[1]["runs"]] == ["run-v"]
    code, body = bot.request("GET", "/v1/runs/run-a", token=B)
    assert code == 404 and body["known_runs"] == ["run-v"]  # run-a is not even among the known runs
    assert {r["run_id"] for r in bot.request("GET", "/v1/runs", token="operator-token")[1]["runs"]} == {
        "run-a", "run-v"}  # an operator sees every project


# -- a signed request counts once ----------------------------------------------------------------


def _form(text, trigger="13345224609.738474920.8088930838d88f008e0"):
    return urlencode({"token": "x", "team_id": "T0", "channel_id": "C0CHAT", "user_id": "U0ALICE",
                      "user_name": "alice", "command": "/msmon", "text": text, "response_url": "",
                      "trigger_id": trigger}).encode()


def test_a_replayed_slash_command_is_refused(bot):
    assert report(bot)[0] == 202
    body, ts = _form("scale-lr run-a 0.5"), int(time.time())
    answers = [signed_post(bot.url + "/slack/commands", body, ts=ts) for _ in range(3)]
    assert answers[0][0] == 200 and "queued as c1" in answers[0][1]["text"]
    assert [a[0] for a in answers[1:]] == [401, 401]
    assert "replay" in answers[1][1]["error"]
    assert len(decode(encode(poll(bot)[1]), PollAnswer).commands) == 1  # LR x 0.5, not x 0.125
    # the same text in a new request (new timestamp or trigger) is a new command
    assert signed_post(bot.url + "/slack/commands", _form("status run-a", "2.3.4"), ts=ts)[0] == 200


def test_a_replayed_button_click_is_refused(bot):
    assert report(bot)[0] == 202
    payload = {"type": "block_actions", "user": {"id": "U0ALICE", "username": "alice"}, "channel": {"id": "C0"},
               "message": {"ts": "1.000100"}, "actions": [{"action_id": "a", "value": "pause run-a"}]}
    body, ts = urlencode({"payload": json.dumps(payload)}).encode(), int(time.time())
    codes = [signed_post(bot.url + "/slack/interactions", body, ts=ts)[0] for _ in range(3)]
    assert codes == [200, 401, 401]
    assert len(decode(encode(poll(bot)[1]), PollAnswer).commands) == 1


def test_a_replay_is_refused_after_a_restart_inside_the_window(tmp_path, slack, env, bot_server):
    b = bot_server(config(tmp_path, slack))
    body, ts = _form("help"), int(time.time())
    assert signed_post(b.url + "/slack/commands", body, ts=ts)[0] == 200
    b.stop()
    b = bot_server(config(tmp_path, slack))
    assert signed_post(b.url + "/slack/commands", body, ts=ts)[0] == 401


def test_the_replay_memory_is_bounded_and_forgets_outside_the_window():
    from bot.chat.replay import ReplayGuard

    t = [1000.0]
    guard = ReplayGuard(clock=lambda: t[0], window=300.0, capacity=100)
    assert guard.first("v0=a", 1000) and not guard.first("v0=a", 1000)
    for i in range(500):
        assert guard.first(f"v0={i}", 1000)
    assert len(guard) <= 100
    t[0] = 1000.0 + 301  # the first one is outside the window now: the verifier refuses it as stale anyway
    assert guard.first("v0=new", 1301) and len(guard) == 1


def test_a_redelivered_socket_mode_envelope_is_handled_once(tmp_path, slack, env, monkeypatch, bot_server):
    monkeypatch.setenv("SLACK_APP_TOKEN", "xapp-1-A0MSMON01-1-abc")
    b = bot_server(config(tmp_path, slack, socket_mode=True))
    assert slack.wait_for(lambda s: s.socket_connections() == 1, timeout=15)
    assert report(b)[0] == 202
    payload = {"command": "/msmon", "text": "scale-lr run-a 0.5", "user_id": "U0ALICE", "user_name": "alice",
               "channel_id": "C0CHAT"}
    eid = slack.push("slash_commands", payload)
    assert slack.wait_for(lambda s: s.socket_ack(eid) is not None, timeout=10)
    for _ in range(2):  # Slack redelivers an envelope whose ack it missed, with the same envelope_id
        slack._send_socket({"envelope_id": eid, "type": "slash_commands", "payload": payload,
                            "accepts_response_payload": True, "retry_attempt": 1}, 10)
    assert slack.wait_for(lambda s: len([a for a in s.socket_acks() if a["envelope_id"] == eid]) == 3,
                          timeout=10)
    time.sleep(0.2)
    assert len(decode(encode(poll(b)[1]), PollAnswer).commands) == 1
