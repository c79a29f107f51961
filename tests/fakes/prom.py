"""A real Alertmanager and a real Prometheus (Debian's prometheus-alertmanager and prometheus) on
loopback for the interop tests: generated configs, random ports, storage in a temporary folder; and
a small HTTP server that records what is POSTed to it (a webhook consumer). A test skips, saying
why, where the binaries are not installed (.ci/run installs them)."""

from __future__ import annotations

import http.server
import json
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from msmon.contract.wire import Envelope, Event, Sample, encode
from tests.fakes.bot_server import BotServer
from tests.fakes.helpers import wait_for
from tests.fakes.process import terminate

ALERTMANAGER = "prometheus-alertmanager"
PROMETHEUS = "prometheus"


def binary(name: str) -> str:
    """The binary's path, or the test is skipped with the package to install."""
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (apt-get install -y prometheus prometheus-alertmanager; .ci/run does)")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def bot_config(tmp_path: Path, routes: list[dict[str, Any]], **bot: Any) -> dict[str, Any]:
    """A bot on a free port for project llm's jobs (env MSMON_TEST_TOKEN), alerts sent without a group wait."""
    return {"bot": {"port": 0, "state_path": str(tmp_path / "bot.sqlite"), "routes": routes,
                    "tokens": [{"env": "MSMON_TEST_TOKEN", "project": "llm"}], "pipeline": {"group_wait": 0},
                    "console": {"charts": False}, **bot}}


def job_post(bot: BotServer, events: list[Event], labels: dict[str, str] | None = None, run: str = "run-42",
             samples: list[Sample] | None = None) -> None:
    """One envelope of project llm's run, as a job posts it; asserts the bot took it."""
    body = encode(Envelope(run_id=run, device="0", sent_at=time.time(), project="llm", labels=labels or {},
                           events=events, samples=samples or []))
    status, answer = bot.request("POST", "/v1/ingest", body)
    assert status == 202, answer


class Recorder:
    """A loopback HTTP server keeping every POST: (path, headers, body)."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, dict[str, str], bytes]] = []
        self.lock = threading.Lock()
        recorder = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with recorder.lock:
                    recorder.posts.append((self.path, dict(self.headers.items()), body))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                """Quiet."""

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def bodies(self) -> list[Any]:
        with self.lock:
            return [json.loads(b) for _, _, b in self.posts]

    def __enter__(self) -> Recorder:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


class Daemon:
    """A Prometheus-family binary started on a random loopback port, stopped on exit."""

    def __init__(self, name: str, folder: Path, config: str, args: list[str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.yml").write_text(config)
        self.log = folder / "log.txt"
        self.cmd = [binary(name), f"--config.file={folder / 'config.yml'}",
                    f"--web.listen-address=127.0.0.1:{self.port}", *args]
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Daemon:
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(self.cmd, stdout=out, stderr=subprocess.STDOUT)
        if not wait_for(self._ready, 30):
            self.__exit__()
            raise RuntimeError(f"{self.cmd[0]} did not get ready in 30 s: {self.log.read_text()[-2000:]}")
        return self

    def _ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.cmd[0]} exited with {self.proc.returncode}: {self.log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def __exit__(self, *exc: object) -> None:
        terminate(self.proc)


def alertmanager(folder: Path, webhook_url: str, *, bearer: str = "") -> Daemon:
    """Alertmanager routing every alert at once to `webhook_url` (with a bearer token when given)."""
    auth = f"\n    http_config:\n      authorization:\n        credentials: {bearer}" if bearer else ""
    config = ("route:\n  receiver: hook\n  group_by: [run, rule]\n  group_wait: 100ms\n  group_interval: 1s\n"
              "  repeat_interval: 1h\nreceivers:\n- name: hook\n  webhook_configs:\n"
              f"  - url: {webhook_url}\n    send_resolved: true{auth}\n")
    return Daemon(ALERTMANAGER, folder, config, [f"--storage.path={folder / 'data'}", "--cluster.listen-address="])


def prometheus(folder: Path, target: str, bearer: str = "") -> Daemon:
    """Prometheus scraping `target` (host:port) every second as job msmon (with a bearer token when given:
    the bot's /metrics takes its scrape token, an operator's or a job token)."""
    auth = f"  authorization:\n    credentials: {bearer}\n" if bearer else ""
    config = ("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n- job_name: msmon\n"
              f"{auth}  static_configs:\n  - targets: ['{target}']\n")
    return Daemon(PROMETHEUS, folder, config, [f"--storage.tsdb.path={folder / 'data'}"])


def query(prom: Daemon, promql: str, timeout: float = 30.0) -> list[Any]:
    """The vector a PromQL instant query returns, waiting (up to `timeout` s) until it is not empty."""
    url = prom.url + "/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    found: list[Any] = []

    def answered() -> bool:
        found[:] = get_json(url)["data"]["result"]
        return bool(found)

    wait_for(answered, timeout)
    return found
