"""The bot as a real process: SIGKILLed with 100 ERRORs in its outbox, restarted, posts all 100 once."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from msmon.contract.wire import Envelope, encode
from tests.fakes.bot_server import wait_for
from tests.fakes.records import event
from tests.fakes.slack_api import SlackAPIServer

pytestmark = pytest.mark.slow

MSMON = str(Path(sys.executable).parent / "msmon")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(cfg_path: Path, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    out = open(log, "ab")  # noqa: SIM115 - the child owns it
    return subprocess.Popen([MSMON, "serve", "--config", str(cfg_path)], env=env, stdout=out, stderr=out)


def get(url: str) -> dict:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return json.loads(r.read())
    except OSError:
        return {}


def test_sigkill_with_100_errors_in_the_outbox_then_restart_posts_all_once(tmp_path):
    port = free_port()
    with SlackAPIServer() as slack:
        cfg = {"bot": {"port": port, "state_path": str(tmp_path / "bot.sqlite"),
                       "tokens": [{"project": "*", "env": "MSMON_TEST_TOKEN"}],
                       "routes": [{"receiver": "slack", "channel": "C0ALERTS"}],
                       "slack": {"base_url": slack.base_url, "max_retries": 0},
                       "console": {"charts": False},
                       "rate_limit": {"per_channel": 1000, "per_run": 1000, "global_rate": 1000, "burst": 100}}}
        cfg_path = tmp_path / "bot.yaml"
        cfg_path.write_text(yaml.safe_dump(cfg))
        env = {**os.environ, "MSMON_TEST_TOKEN": "job-token", "SLACK_BOT_TOKEN": "xoxb-test"}
        slack.fail("chat.postMessage", status=500, times=10**6)  # Slack is down
        proc = start(cfg_path, env, tmp_path / "bot.log")
        try:
            assert wait_for(lambda: get(f"http://127.0.0.1:{port}/healthz").get("ok"), timeout=30)
            for i in range(100):
                body = encode(Envelope(run_id=f"run-{i}", device="0", sent_at=time.time(),
                                       events=[event(run=f"run-{i}")]))
                req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/ingest", data=body, method="POST",
                                             headers={"Content-Type": "application/json",
                                                      "Authorization": "Bearer job-token"})
                with urllib.request.urlopen(req, timeout=5) as r:
                    assert r.status == 202  # accepted: from here on it must not be lost
            assert get(f"http://127.0.0.1:{port}/healthz")["outbox_depth"] == 100
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert slack.messages() == []
        slack.reset()  # Slack is back
        proc = start(cfg_path, env, tmp_path / "bot.log")
        try:
            assert wait_for(lambda: len(slack.messages()) >= 100, timeout=60)
            assert wait_for(lambda: get(f"http://127.0.0.1:{port}/healthz").get("outbox_depth") == 0)
            time.sleep(1.0)
            runs = [m["text"].split(",")[0] for m in slack.messages()]
            assert len(runs) == 100 and len(set(runs)) == 100  # all of them, none twice
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(15)
        # a clean restart after that posts nothing again
        proc = start(cfg_path, env, tmp_path / "bot.log")
        try:
            assert wait_for(lambda: get(f"http://127.0.0.1:{port}/healthz").get("ok"), timeout=30)
            time.sleep(1.5)
            assert len(slack.messages()) == 100
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(15)
