"""A real HTTP server on loopback that speaks the bot's ingest protocol and records what it gets.

It is the peer for the transport's own tests (retries, spool, heartbeats) until the bot service
exists; it decodes every body with the real wire schema, so a malformed envelope fails here.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from msmon.contract.wire import Envelope, Heartbeat, decode
from tests.fakes.helpers import wait_for


class RecordingBot:
    def __init__(self, port: int = 0) -> None:
        self.envelopes: list[Envelope] = []
        self.heartbeats: list[Heartbeat] = []
        self.auth: list[str | None] = []
        self.mode = "ok"  # ok | 500 | 429 | 401 | 400 | hang
        self.hang = threading.Event()
        self.commands: list[dict[str, Any]] = []
        self._port = port
        self.server: ThreadingHTTPServer | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    def start(self) -> None:
        bot = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                bot.auth.append(self.headers.get("Authorization"))
                if bot.mode == "hang":
                    bot.hang.wait(30)
                if bot.mode in ("500", "429", "401", "400"):
                    self.send_response(int(bot.mode))
                    if bot.mode == "429":
                        self.send_header("Retry-After", "0.2")
                    self.end_headers()
                    self.wfile.write(b'{"error": "try later"}')
                    return
                if self.path == "/v1/heartbeat":
                    bot.heartbeats.append(decode(body, Heartbeat))
                    answer: dict[str, Any] = {}
                else:
                    bot.envelopes.append(decode(body, Envelope))
                    answer = {"accepted": True, "commands": bot.commands}
                    bot.commands = []
                out = json.dumps(answer).encode()
                self.send_response(202)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        self.server = ThreadingHTTPServer(("127.0.0.1", self._port), Handler)
        self.server.daemon_threads = True
        self._port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self.server is not None:
            self.hang.set()
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    # -- what arrived -------------------------------------------------------------------------

    def events(self) -> list[Any]:
        return [e for env in self.envelopes for e in env.events]

    def samples(self) -> list[Any]:
        return [s for env in self.envelopes for s in env.samples]

    def actions(self) -> list[Any]:
        return [a for env in self.envelopes for a in env.actions]

    def wait_for(self, cond: Any, timeout: float = 10.0) -> bool:
        return wait_for(cond, timeout)
