"""`msmon serve` as a newcomer meets it: a line when it listens and when it stops, and a prompt stop on SIGTERM
while a job long-polls (the poll is answered at once with no commands; the job polls again later)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("aiohttp")

ROOT = Path(__file__).resolve().parents[3]


def _start(tmp_path: Path, env: dict[str, str], commands: str = "") -> tuple[subprocess.Popen[str], str]:
    cfg = tmp_path / "bot.yaml"
    cfg.write_text("bot:\n  host: 127.0.0.1\n  port: 0\n  state_path: " + str(tmp_path / "bot.sqlite") +
                   "\n  tokens:\n    - {project: \"*\", env: T_JOB}\n  commands:\n    long_poll: 30\n" + commands)
    p = subprocess.Popen([sys.executable, "-m", "msmon.cli.main", "serve", "--config", str(cfg)], cwd=tmp_path,
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout is not None
    line = p.stdout.readline()  # the first line says where it listens
    assert line.startswith("msmon bot: listening on http://127.0.0.1:"), (line, p.stderr.read() if p.poll() else "")
    return p, line.split("listening on ", 1)[1].split(" ", 1)[0]


def test_serve_says_when_it_listens_and_stops_promptly_during_a_long_poll(tmp_path: Path) -> None:
    env = {**os.environ, "T_JOB": "job-token-1234567890", "PYTHONPATH": str(ROOT)}
    proc, url = _start(tmp_path, env)
    try:
        answer: dict[str, object] = {}

        def long_poll() -> None:
            req = urllib.request.Request(url + "/v1/commands/poll", method="POST",
                                         data=json.dumps({"run_id": "r1", "device": "0", "wait": 30}).encode(),
                                         headers={"Authorization": "Bearer job-token-1234567890",
                                                  "Content-Type": "application/json"})
            started = time.monotonic()
            with urllib.request.urlopen(req, timeout=60) as r:
                answer.update(status=r.status, body=json.loads(r.read()), took=time.monotonic() - started)

        poller = threading.Thread(target=long_poll)
        poller.start()
        time.sleep(1.0)  # the poll is now waiting in the bot (up to 30 s)
        assert poller.is_alive()
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        stopped = time.monotonic() - sent
        poller.join(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    print(f"msmon serve stopped {stopped:.2f} s after SIGTERM; the long poll was answered after {answer.get('took')}")
    assert proc.returncode == 0, err
    assert answer["status"] == 200 and answer["body"] == {"commands": [], "cursor": 0}, answer
    assert stopped < 10  # the long poll would have held it 30 s (and aiohttp's default grace is 60 s)
    assert "msmon bot: SIGTERM: stopping" in out and "msmon bot: stopped (SIGTERM, in" in out, out
    assert "1 job long poll(s) answered" in err, err


def test_cmd_with_an_unknown_token_is_told_what_to_add_and_a_known_one_gets_help(tmp_path: Path) -> None:
    env = {**os.environ, "T_JOB": "job-token-1234567890", "T_OP": "operator-token-1234567890",
           "PYTHONPATH": str(ROOT)}
    cfg_extra = "    operators:\n      - {user: \"cli:me\", env: T_OP}\n"
    proc, url = _start(tmp_path, env, cfg_extra)
    try:
        def cmd(token: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "msmon.cli.main", "cmd", "help", "--bot", url],
                                  env={**env, "MSMON_OPERATOR_TOKEN": token}, capture_output=True, text=True,
                                  timeout=60)

        wrong = cmd("not-a-token-of-this-bot")
        assert wrong.returncode == 2 and "HTTP 401" in wrong.stderr, wrong.stderr
        assert "commands.operators" in wrong.stderr and "env: MSMON_OPERATOR_TOKEN}" in wrong.stderr
        right = cmd("operator-token-1234567890")
        assert right.returncode == 0, right.stderr
        assert right.stdout.startswith("c1: ") and "status" in right.stdout  # help, with its command-log id
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)


def test_a_bad_config_is_answered_before_the_server_is_imported(tmp_path: Path) -> None:
    """`msmon serve --config BAD` reads and checks the config first: the server (aiohttp, the store, the chat
    platforms, about a second of CPU) is never imported for a config that cannot run."""
    bad = tmp_path / "bot.yaml"
    bad.write_text("bot:\n  port: many\n")
    p = subprocess.run([sys.executable, "-X", "importtime", "-m", "msmon.cli.main", "serve", "--config", str(bad)],
                       cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 2
    assert "bot.port: expected an integer, got 'many'" in p.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in p.stderr.splitlines() if line.startswith("import time:")}
    assert "bot.config" in imported and not {"bot.server", "bot.app", "aiohttp"} & imported


@pytest.mark.parametrize(("env", "value", "says"), [
    ("FEISHU_WEBHOOK_URL", "no url here", "it has no scheme"),
    ("DINGTALK_WEBHOOK_URL", "file:///etc/passwd", "it starts with file://"),
    ("WECOM_WEBHOOK_URL", "http://example.com/cgi-bin/webhook/send?key=secret-key", "http only to this machine"),
])
def test_a_robot_webhook_that_is_not_an_https_url_is_a_config_error_naming_the_key(tmp_path: Path, env: str,
                                                                                   value: str, says: str) -> None:
    cfg = tmp_path / "bot.yaml"
    cfg.write_text("bot:\n  port: 0\n  state_path: " + str(tmp_path / "bot.sqlite") + "\n")
    p = subprocess.run([sys.executable, "-m", "msmon.cli.main", "serve", "--config", str(cfg), "--allow-no-tokens"],
                       cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT), env: value}, capture_output=True,
                       text=True, timeout=60)
    section = env.split("_", 1)[0].lower()
    assert p.returncode == 2 and f"bot.{section}.webhook_env: the environment variable {env}" in p.stderr, p.stderr
    assert says in p.stderr and "secret-key" not in p.stderr and "passwd" not in p.stderr  # the URL is a secret


def test_over_long_request_lines_are_one_quiet_line_not_a_traceback_each(tmp_path: Path) -> None:
    """Any client, no token needed, could fill the log with aiohttp's traceback per malformed request."""
    env = {**os.environ, "T_JOB": "job-token-1234567890", "PYTHONPATH": str(ROOT)}
    proc, url = _start(tmp_path, env)
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    try:
        import socket

        for _ in range(20):
            with socket.create_connection((host, int(port)), timeout=10) as s:
                s.sendall(b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
                assert s.recv(64).startswith(b"HTTP/1.0 400 Bad Request")
        with urllib.request.urlopen(url + "/healthz", timeout=10) as r:  # still serving
            assert r.status == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert "Traceback" not in err and "aaaaaaaaaa" not in err, err[-3000:]
    said = [line for line in err.splitlines() if "malformed HTTP request" in line]
    assert len(said) == 1 and "LineTooLong" in said[0] and "answered 400" in said[0], err[-3000:]
