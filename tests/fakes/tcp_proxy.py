"""A fault-injecting TCP proxy on loopback, in front of a real server (the tests' PostgreSQL): what a flaky
network or a restarting database does to the connections of a client that is left running.

    client ─► 127.0.0.1:<port> ─► FaultyProxy ─► target

- `reset()`: every open connection is aborted both ways with an RST (SO_LINGER 0), as a database that
  restarts or a middlebox that drops its state does: the client's next read or write fails.
- `refuse(seconds)`: `reset()`, then every new connection for that long is reset the moment it comes.
- `blackhole(seconds)`: nothing is forwarded either way and nothing is closed (no FIN, no RST: a host that
  died, a network that drops every packet); new connections are accepted and never answered. After
  `seconds` (or `restore()`) the open ones forward again and the held new ones are closed.

`faults` counts what was done. Each connection has a thread of its own (select on both sockets); a fault is
applied by that thread within its select timeout, and each call returns once it is applied.
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading
import time

from tests.fakes.peers import _Listener

_TICK = 0.05  # seconds a connection's thread waits in select before it looks at the proxy's state again


class _Pair:
    """One proxied connection: the client's socket and the target's."""

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client, self.upstream = client, upstream
        self.abort = threading.Event()  # set: abort both sides with an RST (the pump does it)
        self.done = threading.Event()

    def close(self, rst: bool) -> None:
        for s in (self.client, self.upstream):
            with contextlib.suppress(OSError):
                if rst:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                s.close()
        self.done.set()


class FaultyProxy(_Listener):
    """A TCP proxy from 127.0.0.1:`port` to `host`:`target_port` that resets, refuses and blackholes."""

    def __init__(self, host: str, target_port: int) -> None:
        self.target = (host, target_port)
        self._lock = threading.Lock()
        self._pairs: list[_Pair] = []
        self._held: list[socket.socket] = []  # accepted while blackholed: never answered
        self._refuse_until = 0.0
        self._hole_until = 0.0
        self.faults = {"reset": 0, "refused": 0, "blackhole": 0, "connections": 0}
        super().__init__()

    # -- faults ------------------------------------------------------------------------------------

    def reset(self) -> int:
        """Abort every open connection with an RST; how many."""
        with self._lock:
            pairs = [p for p in self._pairs if not p.done.is_set()]
        for p in pairs:
            p.abort.set()
        for p in pairs:
            p.done.wait(2.0)
        self.faults["reset"] += 1
        return len(pairs)

    def refuse(self, seconds: float) -> None:
        """`reset()`, then reset every new connection for `seconds`."""
        self._refuse_until = time.monotonic() + seconds
        self.reset()

    def blackhole(self, seconds: float) -> None:
        """Forward nothing and close nothing for `seconds`."""
        self._hole_until = time.monotonic() + seconds
        self.faults["blackhole"] += 1

    def restore(self) -> None:
        """End a refusal or a blackhole now."""
        self._refuse_until = self._hole_until = 0.0
        self._release_held()

    @property
    def holed(self) -> bool:
        return time.monotonic() < self._hole_until

    # -- forwarding --------------------------------------------------------------------------------

    def _serve(self, conn: socket.socket) -> None:
        self._release_held()
        self.faults["connections"] += 1
        if self.holed:
            self._held.append(conn)
            return
        if time.monotonic() < self._refuse_until:
            self.faults["refused"] += 1
            _Pair(conn, socket.socket()).close(rst=True)
            return
        try:
            up = socket.create_connection(self.target, timeout=5)
        except OSError:
            _Pair(conn, socket.socket()).close(rst=True)
            return
        pair = _Pair(conn, up)
        with self._lock:
            self._pairs = [p for p in self._pairs if not p.done.is_set()] + [pair]
        threading.Thread(target=self._pump, args=(pair,), name="faulty-proxy-pair", daemon=True).start()

    def _release_held(self) -> None:
        if self._held and not self.holed:
            held, self._held = self._held, []
            for s in held:
                with contextlib.suppress(OSError):
                    s.close()

    def _pump(self, pair: _Pair) -> None:
        socks = [pair.client, pair.upstream]
        try:
            while not self._done.is_set():
                if pair.abort.is_set():
                    pair.close(rst=True)
                    return
                if self.holed:
                    time.sleep(_TICK)  # the proxy's own pacing while it drops everything (not a test's wait)
                    continue
                readable, _, _ = select.select(socks, [], [], _TICK)
                for s in readable:
                    data = s.recv(65536)
                    if not data:  # one side closed: the other sees it close too
                        pair.close(rst=False)
                        return
                    (pair.upstream if s is pair.client else pair.client).sendall(data)
        except (OSError, ValueError):
            pass
        pair.close(rst=True)

    def close(self) -> None:
        self._stop()
        with self._lock:
            pairs = list(self._pairs)
        for p in pairs:
            p.done.wait(1.0)
            p.close(rst=False)
        self._hole_until = 0.0
        self._release_held()

    def __enter__(self) -> FaultyProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
