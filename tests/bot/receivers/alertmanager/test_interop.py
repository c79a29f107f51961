"""The pure parts of the Alertmanager interop: which runs an Alertmanager alert concerns, its
credentials, and msmon's alerts in Alertmanager's webhook body and postable-alert shape."""

from __future__ import annotations

import base64
import copy

import pytest

from bot.config import AlertmanagerInbound, load_bot_config
from bot.receivers import Message
from bot.receivers.alertmanager.inbound import AmAlert, authorized, matching_runs
from bot.receivers.alertmanager.receiver import ZERO_TIME, api_alerts, webhook_body
from msmon.config.errors import ConfigError
from msmon.contract.wire import Severity, Status
from tests.fakes.records import event

CFG = AlertmanagerInbound()
RUNS = [{"run_id": "run-1", "labels": {"hosts": "node1, node2"}}, {"run_id": "run-2", "labels": {"job": "pretrain"}},
        {"run_id": "run-3", "labels": {}}]


def alert(**labels: str) -> AmAlert:
    return AmAlert(status="firing", labels=labels)


def test_an_alert_matches_runs_by_host_with_the_port_dropped_or_by_job():
    assert matching_runs(alert(instance="node2:9100"), RUNS, CFG) == [("run-1", "node2")]
    assert matching_runs(alert(job="pretrain"), RUNS, CFG) == [("run-2", "pretrain")]
    assert matching_runs(alert(job="run-3"), RUNS, CFG) == [("run-3", "run-3")]  # the run id itself
    assert matching_runs(alert(instance="node9:9100", job="node"), RUNS, CFG) == []
    assert matching_runs(alert(instance="[::1]:9100"), [{"run_id": "r", "labels": {"host": "::1"}}], CFG) == \
        [("r", "::1")]


def test_credentials_are_the_configured_bearer_token_or_basic_auth():
    env = {"MSMON_ALERTMANAGER_TOKEN": "t0k", "MSMON_ALERTMANAGER_PASSWORD": "pw"}
    assert authorized(CFG, "Bearer t0k", env) and not authorized(CFG, "Bearer other", env)
    assert not authorized(CFG, "Bearer ", {})  # no token configured: everything is refused
    basic = AlertmanagerInbound(basic_user="am")
    assert authorized(basic, "Basic " + base64.b64encode(b"am:pw").decode(), env)
    assert not authorized(basic, "Bearer t0k", env)


def _message(status: Status = Status.FIRING) -> Message:
    events = [event(device="0", status=status), event(device="1", status=status)]
    return Message(key="run-42|grad_norm|ERROR|firing", run_id="run-42", project="llm", rule="grad_norm",
                   severity=Severity.ERROR, status=status, events=events)


def test_the_webhook_body_has_alertmanagers_fields_and_one_alert_per_device():
    body = webhook_body(_message(), "msmon", "https://g.example/d?run={run_id}&rule={rule}")
    assert body["version"] == "4" and body["groupKey"] == '{}:{run="run-42", rule="grad_norm"}'
    assert body["commonLabels"] == {"alertname": "grad_norm", "run": "run-42", "rule": "grad_norm",
                                    "severity": "error", "project": "llm"}  # device differs: not common
    assert [a["labels"]["device"] for a in body["alerts"]] == ["0", "1"]
    assert {a["endsAt"] for a in body["alerts"]} == {ZERO_TIME}
    assert body["commonAnnotations"]["chart_url"] == "https://g.example/d?run=run-42&rule=grad_norm"
    assert len({a["fingerprint"] for a in body["alerts"]}) == 2
    resolved = webhook_body(_message(Status.RESOLVED), "msmon", "")
    assert resolved["status"] == "resolved" and all(a["endsAt"] != ZERO_TIME for a in resolved["alerts"])


def test_a_pushed_alert_ends_only_when_resolved_and_job_data_stays_data():
    msg = _message()
    msg.events[0] = copy.copy(msg.events[0])
    msg.events[0].message = '<b>"x"</b> {{ .Labels }}'
    firing = api_alerts(msg, "")
    assert "endsAt" not in firing[0] and firing[0]["annotations"]["message"] == '<b>"x"</b> {{ .Labels }}'
    assert all("endsAt" in a for a in api_alerts(_message(Status.RESOLVED), ""))


def test_a_route_to_an_interop_receiver_is_valid_and_an_unknown_one_names_them():
    load_bot_config({"bot": {"routes": [{"receiver": r} for r in ("alertmanager", "alertmanager_api", "webhook")],
                             "alertmanager": {"webhook_url": "http://127.0.0.1:9/am", "api_url": "http://127.0.0.1:9093"},
                             "webhook": {"url": "https://hooks.example.org/x"}}})
    with pytest.raises(ConfigError, match=r"routes\[0\]\.receiver.*alertmanager_api"):
        load_bot_config({"bot": {"routes": [{"receiver": "alertmanagr"}]}})


@pytest.mark.parametrize(("receiver", "key"), [("alertmanager", "bot.alertmanager.webhook_url"),
                                               ("alertmanager_api", "bot.alertmanager.api_url"),
                                               ("webhook", "bot.webhook.url")])
def test_a_route_to_an_interop_receiver_without_its_address_is_a_config_error(receiver, key):
    with pytest.raises(ConfigError, match=rf"routes use {receiver} but {key} is not set"):
        load_bot_config({"bot": {"routes": [{"receiver": receiver}]}})


def test_an_address_that_is_not_a_url_is_a_config_error_naming_its_key():
    with pytest.raises(ConfigError, match=r"bot\.alertmanager\.api_url: must start with http"):
        load_bot_config({"bot": {"alertmanager": {"api_url": "localhost:9093"}}})
    with pytest.raises(ConfigError, match=r"bot\.webhook\.url"):
        load_bot_config({"bot": {"webhook": {"url": "hooks.example.org/x"}}})
