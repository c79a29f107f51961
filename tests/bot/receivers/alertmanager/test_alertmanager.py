"""msmon and a real Alertmanager (Debian's prometheus-alertmanager on loopback): an msmon ERROR pushed
into its /api/v2/alerts shows in its API and reaches the webhook it routes to; msmon's own
Alertmanager-format webhook; an Alertmanager alert for a run's host lands in that run's Slack thread
(the local Slack API server) and its status; the inbound route's authentication and refusals."""

from __future__ import annotations

import base64
import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from msmon.contract.wire import Status
from tests.fakes.bot_server import BotServer, send, wait_for
from tests.fakes.prom import Recorder, alertmanager, bot_config, get_json, job_post
from tests.fakes.records import event
from tests.fakes.slack_api import SlackAPIServer

AM_TOKEN = "am-inbound-token"


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MSMON_TEST_TOKEN", "job-token")
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-test")
    monkeypatch.setenv("MSMON_ALERTMANAGER_TOKEN", AM_TOKEN)
    monkeypatch.setenv("MSMON_OP_TOKEN", "op-token")


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    with Recorder() as r:
        yield r


def am_post(am_url: str, alerts: list[dict[str, Any]]) -> None:
    req = urllib.request.Request(am_url + "/api/v2/alerts", data=json.dumps(alerts).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    status, answer = send(req)
    assert status == 200, answer


def test_an_error_pushed_to_alertmanager_shows_in_its_api_and_reaches_its_webhook(tmp_path, recorder, bot_server):
    with alertmanager(tmp_path / "am", recorder.url + "/hook") as am:
        bot = bot_server(bot_config(tmp_path, [{"receiver": "alertmanager_api"}], alertmanager={"api_url": am.url}))
        job_post(bot, [event(device="3")])
        mine: list[Any] = []

        def in_api() -> bool:
            mine[:] = [a for a in get_json(am.url + "/api/v2/alerts") if a["labels"].get("run") == "run-42"]
            return bool(mine)

        assert wait_for(in_api, 20), "the ERROR never showed in Alertmanager's /api/v2/alerts"
        assert mine[0]["labels"] == {"alertname": "grad_norm", "run": "run-42", "rule": "grad_norm",
                                     "severity": "error", "device": "3", "project": "llm"}
        assert mine[0]["annotations"]["hint"] == "Save a checkpoint now."
        assert mine[0]["status"]["state"] == "active"
        assert wait_for(lambda: recorder.posts, 20), "Alertmanager never called the webhook it routes to"
        hook = recorder.bodies()[0]
        assert hook["status"] == "firing" and hook["commonLabels"]["run"] == "run-42"
        assert hook["alerts"][0]["annotations"]["message"] == "grad norm 12.0 is over the threshold 10"


def test_the_alertmanager_receiver_posts_alertmanagers_webhook_body_firing_then_resolved(tmp_path, recorder,
                                                                                         bot_server):
    bot = bot_server(bot_config(tmp_path, [{"receiver": "alertmanager"}],
                                alertmanager={"webhook_url": recorder.url + "/am",
                                              "chart_url": "https://grafana.example/d/msmon?var-run={run_id}"}))
    job_post(bot, [event()])
    assert wait_for(lambda: recorder.posts, 20)
    job_post(bot, [event(status=Status.RESOLVED, step=120)])
    assert wait_for(lambda: len(recorder.posts) >= 2, 20)
    bot.stop()
    fired, resolved = recorder.bodies()[0], recorder.bodies()[-1]
    assert set(fired) >= {"version", "groupKey", "status", "receiver", "groupLabels", "commonLabels",
                          "commonAnnotations", "externalURL", "alerts", "truncatedAlerts"}
    assert fired["version"] == "4" and fired["status"] == "firing"
    alert = fired["alerts"][0]
    assert alert["labels"]["severity"] == "error" and alert["endsAt"] == "0001-01-01T00:00:00Z"
    assert alert["annotations"]["chart_url"] == "https://grafana.example/d/msmon?var-run=run-42"
    assert alert["startsAt"].endswith("Z") and alert["fingerprint"]
    assert resolved["status"] == "resolved" and resolved["alerts"][0]["endsAt"] != "0001-01-01T00:00:00Z"
    assert resolved["groupKey"] == fired["groupKey"]


def test_an_alertmanager_alert_for_a_runs_host_lands_in_its_slack_thread_and_status(tmp_path, bot_server):
    with SlackAPIServer() as slack:
        bot = bot_server(bot_config(tmp_path, [{"receiver": "slack", "channel": "C1"}],
                                    slack={"base_url": slack.base_url},
                                    commands={"operators": [{"env": "MSMON_OP_TOKEN", "user": "cli:ops"}]}))
        job_post(bot, [event()], labels={"hosts": "node6,node7"})
        assert wait_for(lambda: slack.messages("C1"), 20), "the run's alert never reached Slack"
        root = slack.messages("C1")[0]["ts"]
        with alertmanager(tmp_path / "am", bot.url + "/v1/alertmanager", bearer=AM_TOKEN) as am:
            am_post(am.url, [{"labels": {"alertname": "NodeDown", "instance": "node7:9100",
                                         "severity": "critical"},
                              "annotations": {"summary": "node7 is unreachable"}},
                             {"labels": {"alertname": "DiskFull", "instance": "node9:9100"}}])

            def in_thread() -> list[Any]:
                return [m for m in slack.messages("C1") if m.get("thread_ts") == root and
                        "NodeDown" in m.get("text", "")]

            assert wait_for(in_thread, 30), "the cluster alert never reached the run's thread"
        assert "node7 is unreachable" in in_thread()[0]["text"]
        assert not [m for m in slack.messages("C1") if "DiskFull" in m.get("text", "")]  # another host
        status, run = bot.request("GET", "/v1/runs/run-42")
        assert status == 200
        assert {"rule": "cluster:NodeDown", "device": "node7", "severity": "ERROR"}.items() <= \
            next(a for a in run["firing"] if a["rule"] == "cluster:NodeDown").items()
        status, answer = bot.request("POST", "/v1/commands", json.dumps({"text": "status run-42"}).encode(),
                                     token="op-token")
        assert status == 200, answer
        assert "FIRING ERROR cluster:NodeDown on device node7 since step 100" in answer["text"]


def _inbound(bot: BotServer, body: bytes, auth: str | None) -> tuple[int, Any]:
    req = urllib.request.Request(bot.url + "/v1/alertmanager", data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    if auth:
        req.add_header("Authorization", auth)
    return send(req)


def test_the_inbound_route_wants_its_credentials_and_an_alertmanager_body(tmp_path, monkeypatch, bot_server):
    body = json.dumps({"version": "4", "status": "firing", "alerts": [
        {"status": "firing", "labels": {"alertname": "GPUXid", "job": "run-42"}}]}).encode()
    bot = bot_server(bot_config(tmp_path, []))
    job_post(bot, [])
    assert _inbound(bot, body, None)[0] == 401
    assert _inbound(bot, body, "Bearer job-token")[0] == 401  # a job's token is not Alertmanager's
    assert _inbound(bot, b'{"alerts": 3}', f"Bearer {AM_TOKEN}")[0] == 422
    assert _inbound(bot, b"{nope", f"Bearer {AM_TOKEN}")[0] == 400
    status, answer = _inbound(bot, body, f"Bearer {AM_TOKEN}")
    assert (status, answer) == (200, {"alerts": 1, "matched": 1})  # by its job label: the run id
    bot.stop()
    monkeypatch.setenv("MSMON_ALERTMANAGER_PASSWORD", "s3cret")
    bot = bot_server(bot_config(tmp_path, [], alertmanager={"inbound": {"basic_user": "am"}}))
    basic = "Basic " + base64.b64encode(b"am:s3cret").decode()
    assert _inbound(bot, body, basic)[0] == 200
    assert _inbound(bot, body, "Basic " + base64.b64encode(b"am:wrong").decode())[0] == 401
