"""Chaos: a real Monitor raises ERRORs while a raw loopback server answers the job's transport with
every kind of broken reply a network, a proxy or a sick bot can produce, then answers properly.

`FaultyBot` speaks HTTP on a real socket by hand (so it can also not speak it): each request to
/v1/ingest takes the next reply of its script; when the script is spent it answers as the bot does
(202 and a JSON object) and records the envelope. Only envelopes answered properly count as
received: whatever the job sent into a broken answer must come again.
"""

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

import pytest

from msmon.contract.wire import Envelope, Event, Severity, Status, decode
from notifier.monitor import Monitor
from notifier.transport import BotTransport
from tests.helpers import wait_for

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


@pytest.fixture
def faulty():
    b = FaultyBot()
    yield b
    b.stop()


def chaos_monitor(bot: FaultyBot, tmp_path: Any, **kw: Any) -> Monitor:
    transport = BotTransport(bot.url, "chaos", "0", token="t", spool_dir=str(tmp_path / "spool"),
                             flush_interval=0.05, heartbeat_interval=0.1, timeout=0.5,
                             backoff=(0.05, 0.3), **kw)
    transport.listen(lambda cmds: None)  # the command long-poll thread runs too
    cfg = {"monitor_config": {"monitor_on": True, "step_interval": 1, "csv": {"enable": False},
                              "alert": {"grad_norm_threshold": 10.0, "baseline_steps": 0, "alert_interval": 0,
                                        "resolve_after": 1}}}
    return Monitor(cfg, "chaos", transport=transport)


def test_every_error_arrives_once_through_every_broken_answer(faulty, tmp_path):
    """ERRORs raised while the peer answers with each broken reply in turn: once it answers properly,
    the bot has every one of them, none twice, and the job's threads are all alive."""
    faulty.script.extend(FAULTS)  # each broken reply once, in turn
    faulty.script.extend(["reset", "not-http", "hang", "500-html", "truncated-body", "200-garbage-json"])
    faulty.side.extend([*FAULTS, *FAULTS])  # heartbeats and command polls get them too
    mon = chaos_monitor(faulty, tmp_path)
    tr = mon.transport
    assert tr is not None
    raised: list[int] = []
    step = 0
    deadline = time.monotonic() + 8.0
    while (faulty.script or step < 200) and time.monotonic() < deadline:
        for ev in mon.step(step, loss=2.0, grad_norm=100.0 if step % 3 != 2 else 1.0):
            if ev.severity is Severity.ERROR and ev.status is Status.FIRING:
                raised.append(ev.step)
        step += 1
        time.sleep(0.005)
    assert not faulty.script, f"the sender stopped asking: {len(faulty.script)} replies never given"
    assert wait_for(lambda: not faulty.side, timeout=10), "the heartbeat or poll thread stopped asking"
    seen = len(faulty.requests)
    assert wait_for(lambda: {p for p, r in faulty.requests[seen:] if r == "ok"} >= {"/v1/heartbeat",
                                                                                    "/v1/commands/poll"})
    assert wait_for(lambda: len(faulty.errors()) >= len(raised), timeout=10)
    threads = {t.name: t.is_alive() for t in (tr._sender, tr._beater, tr._poller) if t is not None}
    t0 = time.monotonic()
    mon.close()
    close_s = time.monotonic() - t0
    got = [e.step for e in faulty.errors()]
    print(f"\nchaos: {len(raised)} ERRORs raised, {len(set(got))} received, {len(got) - len(set(got))} duplicates, "
          f"{len(raised) - len(set(got) & set(raised))} lost; {len(faulty.requests)} requests; close {close_s:.2f} s")
    assert threads == {"msmon-sender": True, "msmon-heartbeat": True, "msmon-commands": True}
    assert len(raised) > 50
    assert sorted(got) == sorted(raised)  # every ERROR, none twice
    assert got == sorted(got)  # in the order they were raised
    assert tr.dropped.get("errors", 0) == 0


def test_an_error_in_an_outage_arrives_within_2s_of_the_bot_answering(faulty, tmp_path):
    """The bot is down long enough for the backoff to grow; an ERROR raised then goes out within 2 s
    of the bot answering again (it rings the sender, and high items are probed often)."""
    faulty.answer_ok = False  # every ingest: connection closed without an answer
    t = BotTransport(faulty.url, "chaos", "0", token="t", spool_dir=str(tmp_path / "spool"),
                     flush_interval=0.05, heartbeat_interval=60.0, timeout=0.5, backoff=(1.0, 30.0))
    from tests.test_transport import ev, sample

    for i in range(100):
        t.sample(sample(i))
    time.sleep(4.0)  # failures at ~0, 1, 3 s: the backoff is now 4-12 s
    t.event(ev(7))
    time.sleep(0.3)
    faulty.answer_ok = True
    up = time.monotonic()
    assert wait_for(lambda: faulty.errors(), timeout=30)
    arrived = time.monotonic() - up
    t.close()
    print(f"\nrecovery: first ERROR {arrived:.2f} s after the bot answered again")
    assert arrived < 2.0
    assert [e.step for e in faulty.errors()] == [7]
