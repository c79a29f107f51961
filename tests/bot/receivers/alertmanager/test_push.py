"""A firing msmon ERROR stays active in a real Alertmanager (Debian's prometheus-alertmanager on loopback)
whose resolve_timeout is 20 s, and is back after the Alertmanager restarts: msmon pushes its firing alerts
again every bot.alertmanager.resend_interval with an endsAt four intervals ahead (as Prometheus does), to
every peer of api_url and api_urls."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.bot_server import wait_for
from tests.fakes.prom import ALERTMANAGER, Daemon, bot_config, get_json, job_post
from tests.fakes.records import event

RESEND = 3.0


def alertmanager(folder: Path) -> Daemon:
    config = ("global:\n  resolve_timeout: 20s\nroute:\n  receiver: none\nreceivers:\n- name: none\n")
    return Daemon(ALERTMANAGER, folder, config, [f"--storage.path={folder / 'data'}", "--cluster.listen-address="])


def active(am: Daemon) -> list[dict[str, Any]]:
    try:
        return [a for a in get_json(am.url + "/api/v2/alerts?active=true") if a["labels"].get("run") == "run-42"]
    except OSError:
        return []


@pytest.mark.slow  # waits past the Alertmanagers' resolve_timeout: about 27 s
def test_a_firing_error_stays_active_past_resolve_timeout_and_after_a_restart_on_every_peer(tmp_path, monkeypatch,
                                                                                            bot_server):
    monkeypatch.setenv("MSMON_TEST_TOKEN", "job-token")
    am1, am2 = alertmanager(tmp_path / "am1"), alertmanager(tmp_path / "am2")
    with am1, am2:
        bot = bot_server(bot_config(tmp_path, [{"receiver": "alertmanager_api"}],
                                    alertmanager={"api_url": am1.url, "api_urls": [am2.url],
                                                  "resend_interval": RESEND}))
        job_post(bot, [event()])
        assert wait_for(lambda: active(am1) and active(am2), timeout=10)
        time.sleep(25)  # past the Alertmanagers' resolve_timeout
        assert active(am1) and active(am2), "the firing ERROR was resolved by Alertmanager's resolve_timeout"
        am1.__exit__()
        am1.__enter__()  # restarted: it kept no alerts
        assert wait_for(lambda: bool(active(am1)), timeout=RESEND * 3), "not pushed again after the restart"
        (alert,) = active(am1)
        assert alert["status"]["state"] == "active" and alert["labels"]["severity"] == "error"
