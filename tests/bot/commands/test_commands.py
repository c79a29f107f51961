"""Chat commands through the real bot on loopback: signed Slack requests, `msmon cmd`'s API, the
jobs' long poll and their answers, permissions and the audit log. The job side here is plain HTTP
with the real wire schema; tests/e2e/test_chatops.py runs the same path with real MindSpore training."""

from __future__ import annotations

import json
import threading
import time

import pytest
from slack_sdk.signature import Clock, SignatureVerifier

from msmon.contract.wire import (
    ActionResult,
    Envelope,
    Event,
    Heartbeat,
    Poll,
    PollAnswer,
    Sample,
    Severity,
    Status,
    decode,
    encode,
)
from tests.fakes.bot_server import wait_for
from tests.fakes.slack_signing import SECRET, click, signed_post, slash

pytest.importorskip("aiohttp")

# Slack's published example (api.slack.com/authentication/verifying-requests-from-slack)
EXAMPLE_TS = 1531420618
EXAMPLE_BODY = (b"token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&"
                b"channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&"
                b"response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZ"
                b"RskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c")
EXAMPLE_SIG = "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503"


def config(tmp_path, slack, **commands):
    return {"bot": {
        "port": 0, "state_path": str(tmp_path / "bot.sqlite"),
        "tokens": [{"project": "llm", "env": "MSMON_TEST_TOKEN"}],
        "routes": [{"receiver": "slack", "channel": "C0ALERTS"}],
        "slack": {"base_url": slack.base_url, "max_retries": 2},
        "rate_limit": {"per_channel": 50, "per_run": 50, "burst": 20},
        "console": {"charts_dir": str(tmp_path / "charts")},
        "commands": {"allow": [{"project": "llm", "users": ["U0ALICE", "cli:carol"], "groups": ["oncall"]}],
                     "groups": {"oncall": ["U0BOB"]}, "operators": [{"user": "cli:carol", "env": "MSMON_OPERATOR"}],
                     **commands}}}


@pytest.fixture
def env(monkeypatch):
    monkeypatch.setenv("MSMON_TEST_TOKEN", "job-token")
    monkeypatch.setenv("MSMON_OPERATOR", "operator-token")
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-test-token")
    monkeypatch.setenv("SLACK_SIGNING_SECRET", SECRET)


@pytest.fixture
def bot(tmp_path, slack, env, bot_server):
    b = bot_server(config(tmp_path, slack))
    yield b


def report(bot, run="run-42", step=100, devices=("0",), **kw) -> None:
    """What a job's transport sends: a few samples per device (so the bot knows the run and its pace)."""
    now = time.time()
    for d in devices:
        samples = [Sample(run_id=run, device=d, step=step - 10 * k, time=now - k, loss=2.0 + 0.01 * k,
                          learning_rate=1e-4, grad_norm=1.0, tokens_per_s=1000.0) for k in range(20, -1, -1)]
        body = encode(Envelope(run_id=run, device=d, sent_at=now, project="llm", samples=samples, **kw))
        assert bot.request("POST", "/v1/ingest", body)[0] == 202


def poll(bot, run="run-42", device="0", after=0, wait=0.0) -> PollAnswer:
    code, body = bot.request("POST", "/v1/commands/poll", encode(Poll(run_id=run, device=device, after=after,
                                                                       wait=wait)))
    assert code == 200, body
    return decode(encode(body), PollAnswer) if isinstance(body, dict) else body


def answer(bot, cmd, device="0", ok=True, detail="done", step=None, path=None) -> None:
    res = ActionResult(run_id=cmd.run_id, device=device, step=step or cmd.apply_step, time=time.time(),
                       action=cmd.action, ok=ok, detail=detail, source=f"command {cmd.id}", path=path,
                       command_id=cmd.id)
    body = encode(Envelope(run_id=cmd.run_id, device=device, sent_at=time.time(), project="llm", actions=[res]))
    assert bot.request("POST", "/v1/ingest", body)[0] == 202


# -- Slack's signature ------------------------------------------------------------------------------


class FixedClock(Clock):
    def __init__(self, t: float) -> None:
        self.t = t

    def now(self) -> float:
        return self.t


def test_slacks_published_example_is_valid_at_its_time_and_stale_now():
    assert SignatureVerifier(SECRET, clock=FixedClock(EXAMPLE_TS + 10)).is_valid(EXAMPLE_BODY, str(EXAMPLE_TS),
                                                                                  EXAMPLE_SIG)
    assert not SignatureVerifier(SECRET).is_valid(EXAMPLE_BODY, str(EXAMPLE_TS), EXAMPLE_SIG)


def test_the_bot_accepts_the_published_example_with_its_clock_at_that_time(tmp_path, slack, env, bot_server):
    b = bot_server(config(tmp_path, slack), clock=lambda: EXAMPLE_TS + 10.0)
    code, body = signed_post(b.url + "/slack/commands", EXAMPLE_BODY, ts=EXAMPLE_TS, signature=EXAMPLE_SIG)
    assert code == 200 and "status &lt;run&gt;" in body["text"]  # empty text: help (escaped: Slack shows <run>)


def test_unsigned_wrongly_signed_and_stale_requests_get_401(bot):
    body = EXAMPLE_BODY
    assert signed_post(bot.url + "/slack/commands", body, secret=None) == (
        401, {"error": "unsigned request: X-Slack-Request-Timestamp and X-Slack-Signature are required"})
    assert signed_post(bot.url + "/slack/commands", body, secret="not-the-secret")[0] == 401
    assert signed_post(bot.url + "/slack/commands", body, ts=EXAMPLE_TS, signature=EXAMPLE_SIG) == (
        401, {"error": "stale request (timestamp outside 5 minutes)"})
    assert signed_post(bot.url + "/slack/commands", body, ts=int(time.time()) - 301)[0] == 401
    assert signed_post(bot.url + "/slack/interactions", b"payload=%7B%7D", secret="wrong")[0] == 401
    assert bot.store.commands.recent() == []  # nothing unverified got as far as the command log


def test_a_bot_without_a_signing_secret_refuses_slack(tmp_path, slack, env, monkeypatch, bot_server):
    monkeypatch.delenv("SLACK_SIGNING_SECRET")
    b = bot_server(config(tmp_path, slack))
    code, body = slash(b.url, "help")
    assert code == 401 and "no Slack signing secret" in body["error"]


# -- the commands ---------------------------------------------------------------------------------------


def test_status_answers_at_once_and_the_chart_follows(bot, slack):
    plan = Heartbeat(run_id="run-42", device="0", time=time.time(), step=100, total_steps=1000, target_loss=1.5)
    report(bot, heartbeats=[plan])
    code, body = slash(bot.url, "status run-42", response_url=slack.response_url("s1"))
    assert code == 200 and body["response_type"] == "in_channel"
    assert "run-42* (llm): step 100, running" in body["text"]
    assert "loss 2 (median of the last 21: 2.1)" in body["text"]
    assert "no alert firing" in body["text"]
    assert "ETA to step 1,000: 1m30s at 10 steps/s" in body["text"]  # 900 steps at 10 steps/s
    assert slack.wait_for(lambda s: len(s.uploads()) == 1, timeout=20)
    up = slack.uploads()[0]
    assert up["channel"] == "C0CHAT" and up["content"].startswith(b"\x89PNG")


def test_status_counts_the_steps_loss_scaling_skipped_and_its_chart_marks_them(bot, slack):
    """fp16 dynamic loss scaling: a skipped step (overflow) is counted in `status`, with the scale now and the job's
    running count, and marked on its chart; a run without loss scaling gets no such line."""
    import io

    import numpy as np
    from matplotlib.image import imread

    from bot.charts.draw import SKIPPED_COLOUR

    now = time.time()
    skipped = {40, 110, 170}  # the sampled steps that overflowed: the scale halves at each, grows back after
    scale, samples = 4096.0, []
    for k, step in enumerate(range(0, 210, 10)):
        scale = scale / 2 if step in skipped else scale
        samples.append(Sample(run_id="run-fp16", device="0", step=step, time=now - 21 + k, loss=2.0 - 0.01 * k,
                              learning_rate=1e-4, grad_norm=None if step in skipped else 1.0 + 0.01 * k,
                              tokens_per_s=1000.0, overflow=step in skipped, loss_scale=scale,
                              skipped_steps=38 + sum(1 for s in skipped if s <= step)))
    body = encode(Envelope(run_id="run-fp16", device="0", sent_at=now, project="llm", samples=samples))
    assert bot.request("POST", "/v1/ingest", body)[0] == 202
    report(bot)  # run-42: no loss scaling
    code, body = slash(bot.url, "status run-fp16", response_url=slack.response_url("s1"))
    assert code == 200
    assert "loss scale 512, 3 steps skipped (overflow) in the last 21 samples; 41 in the run" in body["text"]
    assert slack.wait_for(lambda s: len(s.uploads()) == 1, timeout=20)
    png = imread(io.BytesIO(slack.uploads()[0]["content"]), format="png")[..., :3]
    purple = np.array([int(SKIPPED_COLOUR[i:i + 2], 16) / 255 for i in (1, 3, 5)])
    assert (np.abs(png - purple).max(axis=-1) < 0.02).sum() > 20  # the skip markers' pixels
    code, body = slash(bot.url, "status run-42")
    assert "loss scale" not in body["text"] and "skipped" not in body["text"]


def test_mistyped_and_unknown_run_commands_get_helpful_private_answers(bot):
    report(bot)
    code, body = slash(bot.url, "pasue run-42")
    assert body["response_type"] == "ephemeral" and "did you mean `pause`? Usage: pause &lt;run&gt;" in body["text"]
    code, body = slash(bot.url, "pause run-24")
    assert body["response_type"] == "ephemeral"
    assert body["text"].startswith("No run `run-24` has reported to this bot. Did you mean `run-42`?")
    assert [c["status"] for c in bot.store.commands.recent()] == ["rejected", "invalid"]
    slash(bot.url, "help")
    assert bot.store.commands.recent(1)[0]["verb"] == "help"  # read-only commands are in the log too


def test_an_unauthorised_stop_is_refused_privately_and_audited(bot, slack):
    report(bot)
    code, body = slash(bot.url, "stop run-42 confirm", user="U0MALLORY")
    assert body["response_type"] == "ephemeral"
    assert body["text"].startswith("@u0mallory may not `stop` runs of project llm: ask U0ALICE, cli:carol, "
                                   "group oncall.")
    (audit,) = bot.store.commands.recent()
    assert (audit["user"], audit["source"], audit["verb"], audit["status"]) == ("U0MALLORY", "slack", "stop",
                                                                               "denied")
    assert poll(bot).commands == []  # nothing reached the job
    code, body = slash(bot.url, "status run-42", user="U0MALLORY")  # read-only: for everyone
    assert "step 100" in body["text"]


def test_stop_asks_for_confirmation_with_a_button(bot):
    report(bot)
    _, body = slash(bot.url, "stop run-42")
    assert body["response_type"] == "ephemeral" and "Stop run run-42?" in body["text"]
    button = body["blocks"][1]["elements"][0]
    assert button["value"] == "stop run-42 confirm" and button["style"] == "danger"
    assert poll(bot).commands == []
    code, _ = click(bot.url, button["value"], user="U0BOB")  # a member of the allowed group confirms
    assert code == 200
    (cmd,) = poll(bot).commands
    assert cmd.action == "stop" and cmd.issued_by == "u0bob"


def test_a_command_travels_to_every_rank_at_one_step_and_the_result_comes_back(bot, slack):
    report(bot, devices=("0", "1"))
    got: list = []
    waiter = threading.Thread(target=lambda: got.append(poll(bot, device="1", wait=10.0)))
    waiter.start()  # a rank already waiting in its long poll
    time.sleep(0.3)
    code, body = slash(bot.url, "save-checkpoint run-42", response_url=slack.response_url("c1"))
    assert code == 200 and "queued as c1: every rank applies it at step" in body["text"]
    waiter.join(10)
    (cmd1,) = got[0].commands
    (cmd0,) = poll(bot, device="0").commands
    assert cmd0 == cmd1 and cmd0.action == "save_checkpoint" and cmd0.apply_step > 100
    assert poll(bot, device="0", after=got[0].cursor).commands == []  # the cursor moved past it
    assert [c.id for c in poll(bot, device="0").commands] == ["c1"]  # at-least-once: again until answered
    answer(bot, cmd0, device="0", detail="checkpoint of step 103 written to /ckpt/a.ckpt", path="/ckpt/a.ckpt")
    assert poll(bot, device="0").commands == []
    assert bot.store.commands.get("c1")["status"] == "pending"  # rank 1 has not answered yet
    answer(bot, cmd0, device="1", detail="checkpoint of step 103 written to /ckpt/b.ckpt")
    assert wait_for(lambda: bot.store.commands.get("c1")["status"] == "done")
    assert slack.wait_for(lambda s: len(s.responses("c1")) == 1, timeout=10)
    text = slack.responses("c1")[0]["text"]
    assert "c1 `save-checkpoint run-42` (from @u0alice)" in text and "/ckpt/b.ckpt" in text


def delivered_notes(bot) -> list[str]:
    rows = bot.store.db.execute("SELECT payload FROM outbox WHERE kind='note' AND delivered_at IS NOT NULL")
    return [r["payload"] for r in rows]


def test_msmon_cmd_api_needs_an_operator_token_and_reports_to_the_console(bot):
    report(bot)
    assert bot.request("POST", "/v1/commands", b'{"text": "pause run-42"}')[0] == 403  # a job's token
    assert bot.request("POST", "/v1/commands", b'{"text": "pause run-42"}', token="nope")[0] == 401
    code, body = bot.request("POST", "/v1/commands", b'{"text": "pause run-42"}', token="operator-token")
    assert code == 200 and body["command"]["status"] == "pending"
    assert bot.request("POST", "/v1/ingest", b"{}", token="operator-token")[0] == 403
    (cmd,) = poll(bot).commands
    assert cmd.issued_by == "cli:carol"
    answer(bot, cmd, detail="paused at step 103; waiting for resume")
    code, view = bot.request("GET", f"/v1/commands/{cmd.id}", token="operator-token")
    assert view["status"] == "done" and view["results"]["0"]["detail"].startswith("paused at step 103")
    assert wait_for(lambda: any("c1 `pause run-42` (from cli:carol): device 0 OK at step 1" in n
                                for n in delivered_notes(bot)))


def test_msmon_cmd_status_answers_with_the_path_of_its_chart(bot, tmp_path):
    report(bot)
    code, body = bot.request("POST", "/v1/commands", b'{"text": "status run-42"}', token="operator-token")
    assert code == 200 and "run-42* (llm): step 100, running" in body["text"]
    path = body["chart"]
    assert path.startswith(str(tmp_path / "charts")) and path.endswith(".png")
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    code, body = bot.request("POST", "/v1/commands", b'{"text": "runs"}', token="operator-token")
    assert code == 200 and "chart" not in body  # only a status has one


def test_a_command_no_job_takes_expires_and_the_user_is_told(tmp_path, slack, env, bot_server):
    b = bot_server(config(tmp_path, slack, expire_after=1.0))
    report(b)
    slash(b.url, "scale-lr run-42 0.5", response_url=slack.response_url("x"))
    assert slack.wait_for(lambda s: len(s.responses("x")) == 1, timeout=15)
    assert "expired: no job picked it up within 1s" in slack.responses("x")[0]["text"]
    assert b.store.commands.get("c1")["status"] == "expired"
    assert poll(b).commands == []


def test_the_pause_button_on_an_alert_queues_the_command_and_answers_in_its_thread(bot, slack):
    report(bot)
    code, _ = click(bot.url, "pause run-42", message_ts="1700000000.000100")
    assert code == 200
    (cmd,) = poll(bot).commands
    assert cmd.action == "pause"
    assert slack.wait_for(lambda s: any("queued as c1" in m.get("text", "") for m in s.messages()), timeout=10)
    queued = [m for m in slack.messages() if "queued as c1" in m.get("text", "")][0]
    assert queued["thread_ts"] == "1700000000.000100" and queued["channel"] == "C0ALERTS"
    answer(bot, cmd, detail="paused at step 101; waiting for resume")
    assert slack.wait_for(lambda s: any("device 0 OK" in m.get("text", "") for m in s.messages()), timeout=10)
    done = [m for m in slack.messages() if "device 0 OK" in m.get("text", "")][0]
    assert done["thread_ts"] == "1700000000.000100"
    code, _ = click(bot.url, "pause run-42", user="U0MALLORY", response_url=slack.response_url("m"))
    assert slack.wait_for(lambda s: len(s.responses("m")) == 1, timeout=10)
    assert slack.responses("m")[0]["response_type"] == "ephemeral"
    assert "may not `pause`" in slack.responses("m")[0]["text"]


def test_ack_and_silence(bot, slack):
    from tests.fakes.records import envelope, event

    report(bot)
    assert bot.request("POST", "/v1/ingest", envelope([event()]))[0] == 202
    assert slack.wait_for(lambda s: len(s.messages()) >= 1, timeout=10)
    alert = slack.messages()[0]
    assert alert["blocks"][-1]["elements"][0]["value"] == "ack run-42/grad_norm"  # the buttons carry commands
    _, body = slash(bot.url, "ack run-42/loss_spike")
    assert body["response_type"] == "ephemeral" and "Firing now: grad_norm" in body["text"]
    _, body = slash(bot.url, "ack run-42/grad_norm", user="U0MALLORY")  # not destructive: anyone
    assert "@u0mallory acknowledged grad_norm on all devices of run run-42" in body["text"]
    (a,) = bot.store.alerts("run-42", "firing")
    assert a["acked_by"] == "@u0mallory"
    _, body = slash(bot.url, "status run-42")
    assert "FIRING ERROR grad_norm on device 0 since step 100, acknowledged by @u0mallory" in body["text"]
    _, body = slash(bot.url, "silence run-42 loss_spike 2h")
    assert "Silenced loss_spike alerts of run run-42 for 2h" in body["text"]
    (s,) = bot.store.silences()
    assert s.rule == "loss_spike" and s.run_id == "run-42" and 7190 < s.expires_at - time.time() <= 7200


def test_status_names_the_step_of_the_alert_posted_when_the_first_warning_was_held_back(bot, slack):
    """The episode's first WARNING (step 640) is inhibited by a firing ERROR; the one posted comes at 650,
    after the ERROR resolved: status says both, so the person finds the message in the channel."""
    from tests.fakes.records import envelope, event

    def ingest(*events: Event) -> None:
        assert bot.request("POST", "/v1/ingest", envelope(list(events)))[0] == 202

    def status() -> str:
        code, body = bot.request("POST", "/v1/commands", b'{"text": "status run-42"}', token="operator-token")
        assert code == 200, body
        return str(body["text"])

    report(bot, step=600)
    ingest(event(step=600))
    assert slack.wait_for(lambda s: len(s.messages()) == 1, timeout=10)
    ingest(event(rule="loss_spike", sev=Severity.WARNING, step=640, value=4.0))  # inhibited
    assert "FIRING WARNING loss_spike on device 0 since step 640 (not posted: held back by an inhibit" in status()
    ingest(event(status=Status.RESOLVED, step=645))
    assert slack.wait_for(lambda s: len(s.messages()) == 2, timeout=10)  # the ERROR's resolution
    ingest(event(rule="loss_spike", sev=Severity.WARNING, step=650, value=4.0))
    assert slack.wait_for(lambda s: len(s.messages()) == 3, timeout=10)
    assert "step 650" in slack.messages()[2]["text"]
    text = status()
    assert "FIRING WARNING loss_spike on device 0 since step 640, posted at step 650" in text, text
    ingest(event(rule="loss_spike", sev=Severity.WARNING, step=660, value=4.0))  # a repeat, suppressed
    assert "since step 640, posted at step 650" in status()


def test_commands_can_be_switched_off(tmp_path, slack, env, bot_server):
    b = bot_server(config(tmp_path, slack, enable=False))
    report(b)
    _, body = slash(b.url, "pause run-42")
    assert body["response_type"] == "ephemeral" and "Commands are switched off" in body["text"]
    assert poll(b).commands == []


def test_malformed_slack_and_poll_requests_get_4xx(bot):
    from tests.fakes.slack_signing import signed_post

    report(bot)
    assert signed_post(bot.url + "/slack/interactions", b"payload=not-json") == (
        400, {"error": "not an interaction: the payload field is not JSON"})
    assert signed_post(bot.url + "/slack/commands", b"text=status+run-42")[0] == 400  # no user_id
    assert bot.request("POST", "/v1/commands/poll", b'{"run_id": "run-42"}')[0] == 422  # no device
    assert bot.request("POST", "/v1/commands/poll", b"{")[0] == 400
    assert bot.request("POST", "/v1/commands", b'{"text": 5}', token="operator-token")[0] == 422
    assert bot.request("GET", "/v1/commands/c999", token="operator-token")[0] == 404


def test_commands_over_socket_mode_reach_the_same_service(tmp_path, slack, env, monkeypatch, bot_server):
    """slack.socket_mode: the real app connects to the local Slack server's websocket; a slash command
    pushed there is answered by the same command service, and queues the same job command."""
    monkeypatch.setenv("SLACK_APP_TOKEN", "xapp-1-A0MSMON01-1-abc")
    cfg = config(tmp_path, slack)
    cfg["bot"]["slack"]["socket_mode"] = True
    b = bot_server(cfg)
    assert slack.wait_for(lambda s: s.socket_connections() == 1, timeout=15)
    report(b)
    eid = slack.push("slash_commands", {"command": "/msmon", "text": "pause run-42", "user_id": "U0ALICE",
                                        "user_name": "alice", "channel_id": "C0CHAT",
                                        "response_url": slack.response_url("sm")})
    assert slack.wait_for(lambda s: s.socket_ack(eid) is not None, timeout=10)
    assert "queued as c1" in slack.socket_ack(eid)["payload"]["text"]
    (cmd,) = poll(b).commands
    assert cmd.action == "pause" and b.store.commands.get("c1")["source"] == "slack"



def test_a_job_cannot_answer_another_runs_command(bot):
    report(bot)
    report(bot, run="run-7")
    slash(bot.url, "pause run-42")
    (cmd,) = poll(bot).commands
    forged = ActionResult(run_id="run-7", device="0", step=1, time=time.time(), action="pause", ok=True,
                          detail="paused", command_id=cmd.id)
    body = encode(Envelope(run_id="run-7", device="0", sent_at=time.time(), project="llm", actions=[forged]))
    assert bot.request("POST", "/v1/ingest", body)[0] == 202
    assert bot.store.commands.get(cmd.id)["status"] == "pending"  # run-7's job cannot close run-42's command
    mixed = encode(Envelope(run_id="run-7", device="0", sent_at=time.time(), project="llm",
                            actions=[ActionResult(run_id="run-42", device="0", step=1, time=time.time(),
                                                  action="pause", ok=True, detail="x", command_id=cmd.id)]))
    code, body = bot.request("POST", "/v1/ingest", mixed)
    assert code == 422 and "envelope's run_id" in body["error"]


def test_a_status_answer_shows_job_data_as_text_never_as_mentions_or_links(bot):
    """The slash command's immediate answer quotes job data (rule, device): escaped as Slack asks."""
    now = time.time()
    ev = Event(run_id="run-42", device="<@U0BOSS>", step=100, time=now, rule="<!channel>", severity=Severity.ERROR,
               status=Status.FIRING, value=9.0, threshold=1.0, message="<http://evil.example|click> @here")
    report(bot, events=[ev])
    code, body = slash(bot.url, "status run-42")
    assert code == 200
    assert "&lt;!channel&gt;" in body["text"] and "&lt;@U0BOSS&gt;" in body["text"]
    assert "<!" not in body["text"] and "<@" not in body["text"] and "<http" not in body["text"]


# -- rows stored before reply_to (an upgrade) ---------------------------------------------------------


def _old_note(text, thread_ts=None, response_url=None, private=False) -> str:
    """A note as the outbox stored it before ReplyTo: Slack's fields in the note, the channel in the row."""
    return json.dumps({"text": text, "thread_ts": thread_ts, "response_url": response_url, "command_id": None,
                       "chart": None, "private": private})


def test_rows_stored_before_reply_to_are_still_delivered_where_they_belong(tmp_path, slack, env, capsys, bot_server):
    """A bot upgraded with a command still open (its origin: Slack's channel and thread_ts beside the rest)
    and notes still in its outbox (the channel in the row, thread_ts / response_url in the note, and
    "commands" where there was no channel): each answer goes where it would have gone before."""
    from bot.store.sqlite import Store

    cfg = config(tmp_path, slack)
    now = time.time()
    store = Store(cfg["bot"]["state_path"])
    with store.tx():
        store.commands.add(
            created_at=now, user="U0ALICE", source="slack-button", project="llm", run_id="run-42", text="pause run-42",
            verb="pause", action="pause", params={}, apply_step=1, status="pending", detail="", expires_at=now + 600,
            origin={"source": "slack-button", "user": "U0ALICE", "user_name": "alice", "receiver": "slack",
                    "channel": "C0ALERTS", "thread_ts": "1700000000.000100", "response_url": None})
        store.db.executemany(
            "INSERT INTO outbox(created_at, receiver, channel, kind, key, run_id, payload, next_at)"
            " VALUES(?,?,?,'note',?,'run-42',?,?)", [(now, receiver, channel, f"note|old|{i}", payload, now) for i, (
                receiver, channel, payload) in enumerate([
                    ("slack", "C0ALERTS", _old_note("old note in the thread", thread_ts="1700000000.000200")),
                    ("slack", "C0CHAT", _old_note("old note by url", response_url=slack.response_url("old"),
                                                  private=True)),
                    ("slack", "commands", _old_note("old note with nowhere to go")),
                    ("console", "commands", _old_note("old note for the console"))])])
    store.close()
    b = bot_server(cfg)
    assert slack.wait_for(lambda s: len(s.responses("old")) == 1 and any(
        m["text"] == "old note in the thread" for m in s.messages()), timeout=10)
    (threaded,) = [m for m in slack.messages() if m["text"] == "old note in the thread"]
    assert (threaded["channel"], threaded["thread_ts"]) == ("C0ALERTS", "1700000000.000200")
    assert slack.responses("old")[0]["response_type"] == "ephemeral"
    assert wait_for(lambda: all(r["delivered_at"] is not None for r in b.store.db.execute(
        "SELECT delivered_at FROM outbox WHERE kind='note'")))
    assert "[msmon] old note for the console" in capsys.readouterr().out
    assert not any("nowhere" in m["text"] for m in slack.messages())  # as before: nothing posted
    report(b)
    (cmd,) = poll(b).commands
    assert (cmd.id, cmd.issued_by) == ("c1", "alice")
    answer(b, cmd, detail="paused at step 101; waiting for resume")
    assert slack.wait_for(lambda s: any("device 0 OK" in m["text"] for m in s.messages()), timeout=10)
    (done,) = [m for m in slack.messages() if "device 0 OK" in m["text"]]
    assert (done["channel"], done["thread_ts"]) == ("C0ALERTS", "1700000000.000100")
    assert "c1 `pause run-42` (from @alice)" in done["text"]


def test_an_origin_is_stored_and_read_back_whole():
    from bot.commands.origin import Origin
    from bot.receivers import ReplyTo

    slack_origin = Origin(source="slack", user="U0ALICE", user_name="alice", receiver="slack",
                          reply_to=ReplyTo(channel="C0CHAT", url="https://hooks.slack.com/commands/x"))
    cli_origin = Origin(source="cli", user="cli:carol")
    for origin in (slack_origin, cli_origin):
        assert Origin.from_stored(json.loads(json.dumps(origin.to_stored()))) == origin
    assert cli_origin.to_stored()["reply_to"] == {}  # the console needs no address
