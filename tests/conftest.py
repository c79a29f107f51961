from __future__ import annotations

import contextlib
import ctypes
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

# Property suites: reproducible in CI (same examples every run), no per-example deadline on a shared
# 2-core machine; `HYPOTHESIS_PROFILE=dev` explores new examples locally.
settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", deadline=None, max_examples=500)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
TRACES = SHARED / "data" / "real-traces"
ROOT = Path(__file__).resolve().parents[1]


def pytest_sessionstart(session: pytest.Session) -> None:
    """Orphans come back to this process (Linux's child subreaper): a rank that msrun started in a session of
    its own and that outlives msrun is still ours to find at the end."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """No process of the suite outlives it: whatever a test left (stopped or not) is ended here and named, and the
    run fails, so the test that leaked it gets fixed (tests/fakes/process.py's terminate_group ends a job whole)."""
    from tests.fakes.process import descendants, kill_tree

    if session.config.pluginmanager.has_plugin("dsession"):
        return  # pytest-xdist's controller: its children are the workers, each of which checks its own tests
    left = [pid for pid in descendants(os.getpid()) if _cmdline(pid)]
    if left:
        names = "; ".join(f"{pid}: {_cmdline(pid)[:120]}" for pid in left)
        kill_tree(left)
        session.config.stash[LEFT_BEHIND] = names
        if session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED  # a leak is a failure of the suite
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:  # the orphans that ended here, reaped
            pass


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    names = config.stash.get(LEFT_BEHIND, "")
    if names:
        terminalreporter.write_line(f"processes left behind by the tests, now killed: {names}", red=True)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


LEFT_BEHIND = pytest.StashKey[str]()


@pytest.fixture(autouse=True)
def _msmon_logging():
    """Keep msmon's logger on INFO and propagating, so caplog sees it whatever ran before."""
    log = logging.getLogger("msmon")
    old = (log.level, log.propagate, list(log.handlers))
    log.setLevel(logging.INFO)
    log.propagate = True
    yield
    log.setLevel(old[0])
    log.propagate = old[1]
    log.handlers[:] = old[2]


@pytest.fixture
def bot_server() -> Iterator[Any]:
    """`bot_server(config, **app_kwargs)`: the real bot (tests/fakes/bot_server.py's BotServer: its config through
    bot.config, on PostgreSQL when MSMON_TEST_STORE=postgresql) served on loopback from a thread; each bot a test
    starts is stopped after it, whatever the test did (a bot the test stopped itself is not stopped twice)."""
    from tests.fakes.bot_server import BotServers

    bots = BotServers()
    try:
        yield bots
    finally:
        bots.stop_all()


@pytest.fixture
def slack() -> Iterator[Any]:
    """The local Slack-API-compatible server (tests/fakes/slack_api.py) on loopback."""
    from tests.fakes.slack_api import SlackAPIServer

    with SlackAPIServer() as s:
        yield s


@pytest.fixture
def smtp() -> Iterator[Any]:
    """aiosmtpd on loopback (tests/fakes/smtp.py); imported here, so a module without email tests needs no aiosmtpd."""
    from tests.fakes.smtp import SMTPServer

    with SMTPServer() as s:
        yield s


@pytest.fixture
def schema() -> Iterator[str]:
    """A fresh schema on the real PostgreSQL (tests/fakes/postgres.py), dropped afterwards; skipped with the reason
    when PostgreSQL does not answer."""
    from tests.fakes import postgres

    postgres.required()
    with postgres.fresh_schema() as name:
        yield name


@pytest.fixture
def traces() -> Path:
    if not TRACES.is_dir():
        pytest.skip(f"real traces not found at {TRACES} (they live in ../shared beside the checkout; where they "
                    "come from and how to lay them out: docs/user-guide/offline-analysis.md, 'Real traces')")
    return TRACES


@pytest.fixture
def write(tmp_path):
    def _write(name: str, text: str) -> str:
        p = tmp_path / name
        p.write_text(text)
        return os.fspath(p)

    return _write
