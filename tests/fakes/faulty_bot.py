"""`FaultyBot`: a raw loopback server that answers the job's transport with every kind of broken reply
a network, a proxy or a sick bot can produce (`FAULTS`), then answers as the bot does. It speaks HTTP
on a real socket by hand, so it can also not speak it: each request to /v1/ingest takes the next
reply of its script; when the script is spent it answers 202 and a JSON object and records the
envelope. Only envelopes answered properly count as received."""

from __future__ import annotations

import email.utils
import json
import socket
import socketserver
import struct
import threading
import time
from collections import deque
from typing import Any

from msmon.contract.wire import Envelope, Event, Severity, Status, decode

# Every broken reply, by name: what the peer writes back (None: nothing, the connection just closes).
FAULTS: dict[str, bytes | None] = {
    "retry-after-http-date": b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: %s\r\nContent-Length: 0\r\n\r\n"
                             % email.utils.formatdate(time.time() + 3600, usegmt=True).encode(),
    "retry-after-inf": b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: inf\r\nContent-Length: 0\r\n\r\n",
    "retry-after-garbage": b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: soon, maybe\r\nContent-Length: 0\r\n\r\n",
    "retry-after-negative": b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: -5\r\nContent-Length: 0\r\n\r\n",
    "not-http": b"SSH-2.0-OpenSSH_9.6\r\n",
    "truncated-body": b"HTTP/1.1 202 Accepted\r\nContent-Type: application/json\r\nContent-Length: 400\r\n\r\n"
                      b'{"accepted": {"events": 1',
    "200-garbage-json": b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 16\r\n\r\n"
                        b'{"accepted": tru',
    "200-html": b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 27\r\n\r\n"
                b"<html>captive portal</html>",
    "500-html": b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/html\r\nContent-Length: 25\r\n\r\n"
                b"<html><h1>oops</h1></html>",
    "429": b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 0.1\r\nContent-Length: 0\r\n\r\n",
    "hang": None,  # longer than the job's timeout, then closed without a word
    "reset": None,  # closed with RST
    "close": None,  # closed at once without a word
}


class FaultyBot:
    """A raw HTTP/1.1 peer on loopback that answers /v1/ingest from a script, then properly."""

    def __init__(self, script: list[str] | None = None, hang_s: float = 1.5) -> None:
        self.script: deque[str] = deque(script or [])
        self.side: deque[str] = deque()  # the same for heartbeats and command polls
        self.hang_s = hang_s
        self.received: list[Envelope] = []  # envelopes answered properly
        self.requests: list[tuple[str, str]] = []  # (path, reply given)
        self.answering_since: float | None = None  # monotonic time of the first proper ingest answer
        self.commands: list[dict[str, Any]] = []
        self.gate = threading.Event()  # a "gate" reply waits for it, then answers properly
        self.answer_ok = True  # False: the script is spent but every ingest gets the fault below
        self.down_fault = "close"
        self._lock = threading.Lock()
        bot = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                bot._handle(self.request)

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # -- what arrived ---------------------------------------------------------------------------

    def events(self) -> list[Event]:
        with self._lock:
            return [e for env in self.received for e in env.events]

    def errors(self) -> list[Event]:
        return [e for e in self.events() if e.severity is Severity.ERROR and e.status is Status.FIRING]

    # -- the wire -------------------------------------------------------------------------------

    def _handle(self, sock: socket.socket) -> None:
        sock.settimeout(10)
        f = sock.makefile("rb")
        try:
            line = f.readline()
            if not line:
                return
            path = line.split()[1].decode()
            length = 0
            while True:
                h = f.readline()
                if h in (b"\r\n", b"\n", b""):
                    break
                name, _, value = h.decode("latin-1").partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value.strip())
            body = f.read(length)
        except (OSError, ValueError, IndexError):
            return
        with self._lock:
            script = self.script if path == "/v1/ingest" else self.side
            fault = script.popleft() if script else None
            if fault is None and path == "/v1/ingest" and not self.answer_ok:
                fault = self.down_fault
            self.requests.append((path, fault or "ok"))
        if fault == "gate":
            self.gate.wait(30)
        if fault in (None, "ok", "gate"):
            self._answer(sock, path, body)
        else:
            self._fault(sock, fault)

    def _answer(self, sock: socket.socket, path: str, body: bytes) -> None:
        answer: dict[str, Any] = {"ok": True}
        if path == "/v1/ingest":
            env = decode(body, Envelope)
            with self._lock:
                self.received.append(env)
                if self.answering_since is None:
                    self.answering_since = time.monotonic()
                answer = {"accepted": {"events": len(env.events)}, "commands": self.commands}
                self.commands = []
        elif path == "/v1/commands/poll":
            time.sleep(0.2)  # a short long-poll
            answer = {"commands": [], "cursor": 0}
        out = json.dumps(answer).encode()
        head = b"HTTP/1.1 202 Accepted\r\nContent-Type: application/json\r\nContent-Length: %d\r\n" \
               b"Connection: close\r\n\r\n" % len(out)
        sock.sendall(head + out)

    def _fault(self, sock: socket.socket, fault: str) -> None:
        if fault == "hang":
            time.sleep(self.hang_s)
        elif fault == "reset":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        raw = FAULTS[fault]
        if raw is not None:
            sock.sendall(raw)
