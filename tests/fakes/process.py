"""Ending the real processes the tests start (msmon serve, jobs and their msrun ranks, nats-server, Prometheus,
Alertmanager, Synapse), whole and always: a rank that msrun started in a session of its own, or one a test
SIGSTOPped, is ended too (SIGCONT, then SIGKILL: a stopped process never acts on a SIGTERM)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path


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


def descendants(pid: int) -> list[int]:
    """The processes below `pid` now (children, theirs...), from /proc; [] where there is no /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after "pid (comm)": state, ppid, ...
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def kill_tree(pids: list[int]) -> None:
    """SIGCONT and SIGKILL to each of `pids` and to its process group (unless it is the caller's own group)."""
    own = os.getpgrp()
    groups = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            groups.add(os.getpgid(pid))
    for sig in (signal.SIGCONT, signal.SIGKILL):
        for group in groups - {own}:
            with contextlib.suppress(OSError):
                os.killpg(group, sig)
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, sig)


def terminate_group(proc: subprocess.Popen[bytes] | subprocess.Popen[str] | None, grace: float = 10.0) -> None:
    """`proc` and every process below it, whatever group or session they are in and whether or not they are
    stopped: SIGTERM (with SIGCONT) to them all, SIGKILL to what is left after `grace` seconds."""
    if proc is None:
        return
    tree = [proc.pid, *descendants(proc.pid)] if proc.poll() is None else descendants(proc.pid)
    for pid in tree:
        for sig in (signal.SIGTERM, signal.SIGCONT):
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and (proc.poll() is None or any(_alive(p) for p in tree if p != proc.pid)):
        time.sleep(0.1)
    kill_tree([p for p in tree if _alive(p)] + [*descendants(proc.pid)])
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)


def _alive(pid: int) -> bool:
    """Whether `pid` is a process that has not ended (a zombie has ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def job_command(script: Path, ranks: int, log_dir: Path, env: dict[str, str]) -> list[str]:
    """The command that runs the job `script`: one process, or `ranks` ranks under MindSpore's msrun on a free
    port (the test skips where msrun is not installed); the venv's bin goes first on `env`'s PATH for msrun's
    workers."""
    import shutil
    import socket
    import sys

    import pytest

    if ranks == 1:
        return [sys.executable, str(script)]
    msrun = shutil.which("msrun", path=os.path.dirname(sys.executable))
    if msrun is None:
        pytest.skip("msrun (MindSpore's launcher) is not installed")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return [msrun, f"--worker_num={ranks}", f"--local_worker_num={ranks}", f"--master_port={port}",
            f"--log_dir={log_dir}", "--join=True", str(script)]
