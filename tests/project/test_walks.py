"""docs/ARCHITECTURE.md's walk of one ERROR checked against the path the code really takes (issue 39): a real
Monitor in a custom loop reports to the real bot on loopback, which posts to the local Slack-API-compatible server;
every function of msmon/, notifier/ and bot/ that runs, in any thread, from the `Monitor.step` of the ERROR until
Slack has the message, is recorded (sys.setprofile / threading.setprofile). Every file the walk leads a step with
(from step 2, `Monitor.step`, on; step 1 is MindSpore's callback, which a custom loop does not run) must be among
them: the test fails when the code's path changes, not when a sentence does. The modules that ran are printed
(`pytest -s`), background tasks included (the heartbeat and the bot's periodic flush run in the same window).
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.bot.test_project_isolation import env  # noqa: F401 - the job and Slack tokens
from tests.fakes.bot_server import wait_for
from tests.project.test_architecture_doc import _walk_files

pytest.importorskip("aiohttp")
pytestmark = pytest.mark.usefixtures("env")
ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("msmon", "notifier", "bot")


class Recorder:
    """The repository's modules whose functions run while `on`, in every thread started after `install`."""

    def __init__(self) -> None:
        self.on = False
        self.files: dict[str, None] = {}  # first run first
        self._prefixes = tuple(str(ROOT / p) + "/" for p in PACKAGES)
        self._root = len(str(ROOT)) + 1

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        if event == "call" and self.on:
            f = frame.f_code.co_filename
            if f.startswith(self._prefixes) and f not in self.files:
                self.files[f] = None

    def install(self) -> None:
        sys.setprofile(self)
        threading.setprofile(self)

    def remove(self) -> None:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]

    def modules(self) -> list[str]:
        return [f[self._root:] for f in self.files]


def test_the_walk_of_one_error_is_the_path_the_code_takes(tmp_path, slack, bot_server) -> None:
    from notifier.monitor import Monitor

    rec = Recorder()
    rec.install()  # before the bot's and the transport's threads start: they inherit it
    try:
        bot = bot_server({"bot": {
            "port": 0, "state_path": str(tmp_path / "bot.sqlite"),
            "tokens": [{"project": "llm", "env": "MSMON_TEST_TOKEN"}],
            "routes": [{"receiver": "slack", "channel": "C0ALERTS"}],
            "slack": {"base_url": slack.base_url, "max_retries": 3},
            "pipeline": {"group_wait": 0.0}, "console": {"charts": False}}})
        mon = Monitor({"monitor_on": True, "step_interval": 1, "log_interval": 0,
                       "alert": {"grad_norm_threshold": 10.0},
                       "bot": {"url": bot.url, "token_env": "MSMON_TEST_TOKEN", "project": "llm",
                               "spool_dir": str(tmp_path / "spool")}}, "walk")
        for step in range(1, 21):
            mon.step(step, loss=2.0 - step * 0.01, grad_norm=1.0 + 0.01 * step, lr=1e-3)
        assert wait_for(lambda: bot.store.run("walk") is not None, timeout=30)
        rec.on = True
        for step in (21, 22):  # grad_norm pages at 2 samples in a row over its ERROR level
            mon.step(step, loss=1.79, grad_norm=10.97, lr=1e-3)
        assert wait_for(lambda: any("grad_norm" in (m.get("text") or "") for m in slack.messages()), timeout=60)
        rec.on = False
        mon.close()
    finally:
        rec.remove()
    ran = rec.modules()
    print(f"\n{len(ran)} modules ran from Monitor.step to the Slack call:\n  " + "\n  ".join(ran))
    walk = _walk_files("The path of one event")
    assert walk[0] == "notifier/mindspore/callback.py"
    missing = [f for f in walk[1:] if not _ran(f, ran)]
    assert not missing, f"the walk names files the ERROR's path no longer runs: {missing}; ran: {ran}"


def test_the_walk_of_one_command_is_the_path_the_code_takes(tmp_path, slack, bot_server) -> None:
    """`/msmon loosen-threshold walk grad_norm 15` typed in Slack until the job's JobControl has applied it at a
    step boundary; every file the command walk leads a step with must have run, but the framework's own (the
    walk's save-checkpoint goes through notifier/mindspore/backend.py; a custom loop without a backend applies a
    threshold command instead)."""
    from notifier.control import JobControl
    from notifier.monitor import Monitor
    from tests.fakes.slack_signing import slash

    rec = Recorder()
    rec.install()
    try:
        bot = bot_server({"bot": {
            "port": 0, "state_path": str(tmp_path / "bot.sqlite"),
            "tokens": [{"project": "llm", "env": "MSMON_TEST_TOKEN"}],
            "routes": [{"receiver": "slack", "channel": "C0ALERTS"}],
            "slack": {"base_url": slack.base_url, "max_retries": 2},
            "pipeline": {"group_wait": 0.0}, "console": {"charts": False},
            "commands": {"allow": [{"project": "llm", "users": ["U0ALICE"]}]}}})
        mon = Monitor({"monitor_on": True, "step_interval": 1, "log_interval": 0,
                       "alert": {"grad_norm_threshold": 10.0},
                       "bot": {"url": bot.url, "token_env": "MSMON_TEST_TOKEN", "project": "llm",
                               "spool_dir": str(tmp_path / "spool")}}, "walk")
        control = JobControl(mon)
        control.listen()
        done = threading.Event()

        def train() -> None:
            step = 0
            while not done.is_set():
                step += 1
                mon.step(step, loss=2.0, grad_norm=1.0, lr=1e-3)
                control.apply(step)
                done.wait(0.02)

        loop = threading.Thread(target=train, daemon=True)
        loop.start()
        assert wait_for(lambda: bot.store.run("walk") is not None, timeout=30)
        rec.on = True
        code, _ = slash(bot.url, "loosen-threshold walk grad_norm 15")
        assert code == 200
        assert wait_for(lambda: any(r.action == "loosen_threshold" for r in control.results), timeout=60)
        assert [r.ok for r in control.results if r.action == "loosen_threshold"] == [True], control.results
        rec.on = False
        done.set()
        loop.join(10)
        mon.close()
    finally:
        rec.remove()
    ran = rec.modules()
    print(f"\n{len(ran)} modules ran from the slash command to the job's step boundary:\n  " + "\n  ".join(ran))
    walk = [f for f in _walk_files("The path of one command") if not f.startswith("notifier/mindspore/")]
    missing = [f for f in walk if not _ran(f, ran)]
    assert not missing, f"the walk names files the command's path no longer runs: {missing}; ran: {ran}"


def _ran(path: str, ran: list[str]) -> bool:
    """A module ran, or, for a package's `__init__.py` that declares data (bot/pipeline's STAGES), a module of its
    package did."""
    if path in ran:
        return True
    return path.endswith("/__init__.py") and any(r.startswith(path.removesuffix("__init__.py")) for r in ran)
