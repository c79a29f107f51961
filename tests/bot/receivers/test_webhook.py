"""The plain webhook receiver from the real bot to a loopback server: one JSON document per alert in
docs/webhook.md's schema, signed with HMAC-SHA256 over timestamp and body; a changed body, a stale
timestamp or another key fails the check a consumer makes; a consumer's 503 is retried."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from bot.receivers.webhook import SIGNATURE_HEADER, TIMESTAMP_HEADER, sign, verify
from msmon.contract.wire import Status
from tests.fakes.bot_server import wait_for
from tests.fakes.prom import Recorder, bot_config, job_post
from tests.fakes.records import event

SECRET = "webhook-signing-key"


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MSMON_TEST_TOKEN", "job-token")
    monkeypatch.setenv("MSMON_WEBHOOK_SECRET", SECRET)


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    with Recorder() as r:
        yield r


def test_each_alert_is_one_signed_json_document(tmp_path, recorder, bot_server):
    bot = bot_server(bot_config(tmp_path, [{"receiver": "webhook"}], webhook={"url": recorder.url + "/in"}))
    job_post(bot, [event(device="1"), event(device="2")])
    assert wait_for(lambda: recorder.posts, 20)
    job_post(bot, [event(device="1", status=Status.RESOLVED, step=130)])
    assert wait_for(lambda: len(recorder.posts) >= 2, 20)
    bot.stop()
    path, headers, body = recorder.posts[0]
    assert path == "/in" and headers["Content-Type"] == "application/json"
    stamp = int(headers[TIMESTAMP_HEADER])
    assert verify(SECRET.encode(), headers, body, stamp + 10) is None
    doc = json.loads(body)
    assert doc["schema"] == "msmon.webhook/1" and doc["action"] == "post"
    assert {k: doc[k] for k in ("run_id", "project", "rule", "severity", "status")} == \
        {"run_id": "run-42", "project": "llm", "rule": "grad_norm", "severity": "ERROR", "status": "firing"}
    assert doc["devices"] == ["1", "2"] and doc["events"][0]["hint"] == "Save a checkpoint now."
    assert json.loads(recorder.posts[-1][2])["action"] == "reply"  # the resolution, under the alert


def test_the_signature_check_refuses_a_changed_body_a_stale_timestamp_and_another_key():
    body, stamp = b'{"run_id":"run-42"}', "1700000000"
    headers = {TIMESTAMP_HEADER: stamp, SIGNATURE_HEADER: sign(SECRET.encode(), stamp, body)}
    assert verify(SECRET.encode(), headers, body, 1700000000.0) is None
    assert "does not match" in str(verify(SECRET.encode(), headers, body + b" ", 1700000000.0))
    assert "does not match" in str(verify(b"other", headers, body, 1700000000.0))
    assert "replay window" in str(verify(SECRET.encode(), headers, body, 1700000000.0 + 301))
    assert "missing" in str(verify(SECRET.encode(), {}, body, 1700000000.0))


def test_a_consumer_that_answers_503_gets_the_alert_again(tmp_path, recorder, bot_server):
    refusals = [503]
    original = recorder.server.RequestHandlerClass.do_POST

    def flaky(handler: Any) -> None:
        if refusals:
            refusals.pop()
            handler.rfile.read(int(handler.headers.get("Content-Length", "0")))
            handler.send_response(503)
            handler.send_header("Content-Length", "0")
            handler.end_headers()
            return
        original(handler)

    recorder.server.RequestHandlerClass.do_POST = flaky
    bot = bot_server(bot_config(tmp_path, [{"receiver": "webhook"}], webhook={"url": recorder.url},
                                delivery={"backoff_base": 0.05}))
    job_post(bot, [event()])
    assert wait_for(lambda: recorder.posts, 20), "the alert was not sent again after the 503"
    bot.stop()
    assert not refusals
