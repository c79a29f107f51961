"""NATS for the tests: the machine's nats-server (127.0.0.1:4222), or a private `nats-server -js` on a free
port with its store in a temporary directory, which a test may stop and start again (a NATS restart that
keeps its JetStream store, on the same port)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from tests.fakes.process import terminate

SHARED = "nats://127.0.0.1:4222"


def _binary() -> str | None:
    return shutil.which("nats-server") or next((p for p in ("/usr/sbin/nats-server", "/usr/bin/nats-server")
                                                if os.path.exists(p)), None)


def _answers(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5) as s:
            return s.recv(4).startswith(b"INFO")
    except OSError:
        return False


def shared_problem() -> str | None:
    """Why the machine's NATS JetStream (127.0.0.1:4222) cannot be used, or None."""
    if not _answers(4222):
        return "no NATS server answers on 127.0.0.1:4222 (start one: nats-server -js)"
    try:
        asyncio.run(_account_info(SHARED))
    except Exception as exc:  # noqa: BLE001 - any reason is a reason to skip
        return f"NATS on 127.0.0.1:4222 has no JetStream ({type(exc).__name__}: {exc}; start it with -js)"
    return None


def private_problem() -> str | None:
    """Why no private nats-server can be started, or None."""
    return None if _binary() else "no nats-server binary on this machine (apt-get install nats-server)"


async def _account_info(url: str) -> Any:
    import nats

    nc = await nats.connect(url, connect_timeout=2, allow_reconnect=False, max_reconnect_attempts=0)
    try:
        return await nc.jetstream().account_info()
    finally:
        await nc.close()


def delete_streams(url: str, *names: str) -> None:
    """Remove a test's streams (missing ones are fine)."""
    async def run() -> None:
        import nats
        import nats.js.errors

        nc = await nats.connect(url, connect_timeout=2, allow_reconnect=False, max_reconnect_attempts=0)
        try:
            js = nc.jetstream()
            for name in names:
                with contextlib.suppress(nats.js.errors.NotFoundError):
                    await js.delete_stream(name)
        finally:
            await nc.close()

    asyncio.run(run())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class NatsServer:
    """`nats-server -js` on 127.0.0.1:<a free port>, its JetStream store under `store_dir`."""

    def __init__(self, store_dir: str | Path) -> None:
        binary = _binary()
        if binary is None:
            raise RuntimeError(private_problem())
        self.binary, self.store_dir = binary, str(store_dir)
        self.port = _free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = Path(self.store_dir) / "nats-server.log"

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self, timeout: float = 15.0) -> None:
        os.makedirs(self.store_dir, exist_ok=True)
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen([self.binary, "-js", "-a", "127.0.0.1", "-p", str(self.port), "-sd",
                                          self.store_dir], stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"nats-server exited with {self.proc.returncode}; see {self.log}")
            if _answers(self.port):
                return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"nats-server did not answer on port {self.port} within {timeout:g} s; see {self.log}")

    def stop(self) -> None:
        terminate(self.proc)
        self.proc = None

    def __enter__(self) -> NatsServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["SHARED", "NatsServer", "delete_streams", "private_problem", "shared_problem"]
