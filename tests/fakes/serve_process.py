"""A real `msmon serve` process on a free port, for the tests that need a bot they can SIGKILL: its config
written from a dict, its output in a log file, `request` as BotServer's so the tests' helpers take either."""

from __future__ import annotations

import copy
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from tests.fakes.bot_server import request, wait_for
from tests.fakes.process import terminate

MSMON = str(Path(sys.executable).parent / "msmon")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServeProcess:
    """`msmon serve --config <tmp>/<name>.yaml` with `config`'s `bot.port` set to a free port. Ready when
    `ready(self)` holds (default: /healthz answers ok); a process that does not get there is stopped and
    the test fails with the end of its log."""

    def __init__(self, tmp: Path, name: str, config: dict[str, Any], env: dict[str, str] | None = None,
                 ready: Callable[[ServeProcess], object] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cfg = copy.deepcopy(config)
        cfg["bot"]["port"] = self.port
        path = tmp / f"{name}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        self.log = tmp / f"{name}.log"
        with open(self.log, "ab") as out:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen([MSMON, "serve", "--config", str(path)], env={**os.environ, **(env or {})},
                                         stdout=out, stderr=out)
        check = ready or (lambda p: p.health().get("ok"))
        started = wait_for(lambda: self.proc.poll() is not None or check(self), timeout=60)
        if not started or self.proc.poll() is not None:
            self.stop()
            raise AssertionError(f"msmon serve {name} did not start: {self.log.read_text()[-3000:]}")

    def health(self) -> dict[str, Any]:
        try:
            with urllib.request.urlopen(self.url + "/healthz", timeout=2) as r:
                return dict(json.loads(r.read()))
        except OSError:
            return {}

    def request(self, method: str, path: str, body: bytes | None = None, token: str | None = "job-token",
                content_type: str = "application/json") -> tuple[int, Any]:
        return request(self.url, method, path, body, token, content_type)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        terminate(self.proc, 15)
