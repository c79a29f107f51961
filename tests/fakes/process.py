"""Ending the real servers the tests start (msmon serve, nats-server, Prometheus, Alertmanager, Synapse)."""

from __future__ import annotations

import subprocess


def terminate(proc: subprocess.Popen[bytes] | None, grace: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after `grace` seconds; nothing for a process that is gone (or None)."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
