"""Peers for delivery under real faults, on loopback: a robot server (tests/fakes/im_robot.py) served from
a thread of its own (for a bot that runs in another thread: BotServer, `msmon serve`), and a peer that
hangs: it accepts TCP connections and reads what comes, and never answers (a hung platform, a
blackholed load balancer), until it is told to answer again."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Iterator

from tests.fakes.im_robot import FakeRobot


class ThreadedRobot:
    """`robot` served on 127.0.0.1 from a thread's event loop; `url` once started."""

    def __init__(self, robot: FakeRobot) -> None:
        self.robot = robot
        self.url = ""
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), name="robot", daemon=True)

    async def _main(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        async with self.robot.serving() as url:
            self.url = url
            self._ready.set()
            await self._stop.wait()

    def __enter__(self) -> ThreadedRobot:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the robot server did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


class _Listener:
    """A loopback listener whose thread hands each connection to `_serve` until closed."""

    def __init__(self) -> None:
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.2)
        self.port = self._sock.getsockname()[1]
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._accept, name=type(self).__name__, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._done.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._serve(conn)

    def _serve(self, conn: socket.socket) -> None:
        raise NotImplementedError

    def _stop(self) -> None:
        self._done.set()
        self._thread.join(5)
        self._sock.close()


class HangingPeer(_Listener):
    """Accepts connections and never answers while `hanging`; `answer` (a full HTTP response) is sent to the
    connections that come after `hanging` is cleared. `connections`: how many came."""

    def __init__(self, answer: bytes = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 29"
                                      b"\r\nConnection: close\r\n\r\n{\"errcode\": 0, \"errmsg\": \"ok\"}") -> None:
        self.answer = answer
        self.hanging = True
        self.connections = 0
        self._held: list[socket.socket] = []
        super().__init__()
        self.url = f"http://127.0.0.1:{self.port}"

    def _serve(self, conn: socket.socket) -> None:
        self.connections += 1
        if self.hanging:
            self._held.append(conn)  # read nothing, answer nothing, keep it open
            return
        with conn:
            conn.settimeout(2)
            with contextlib.suppress(OSError):
                conn.recv(65536)
                conn.sendall(self.answer)

    def __enter__(self) -> HangingPeer:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop()
        for c in self._held:
            c.close()


class TcpProxy(_Listener):
    """A TCP proxy to `target` on loopback that can black-hole: `blackhole()` stops forwarding both ways
    and keeps every connection open (no FIN, no RST: a database host that died, a network that drops), new
    connections are accepted and never answered; `restore()` forwards again (new connections)."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.holed = False
        self._conns: list[socket.socket] = []
        super().__init__()

    def blackhole(self) -> None:
        self.holed = True

    def restore(self) -> None:
        self.holed = False

    def _serve(self, conn: socket.socket) -> None:
        self._conns.append(conn)
        if self.holed:
            return
        try:
            up = socket.create_connection(self.target, timeout=5)
        except OSError:
            conn.close()
            return
        self._conns.append(up)
        for a, b in ((conn, up), (up, conn)):
            threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        src.settimeout(0.2)
        while not self._done.is_set():
            if self.holed:  # read nothing more, send nothing more, close nothing
                self._done.wait(0.2)
                continue
            try:
                data = src.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                break
            if not data:
                break
            try:
                dst.sendall(data)
            except OSError:
                break
        if not self.holed:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._stop()
        for c in self._conns:
            with contextlib.suppress(OSError):
                c.close()


@contextlib.contextmanager
def robots(*items: FakeRobot) -> Iterator[list[ThreadedRobot]]:
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(ThreadedRobot(r)) for r in items]
