"""`msmon serve` is quiet by default (issue 29): with a real MindSpore job reporting and a `msmon cmd` waiting
for its result, the bot's output is the alerts and one line per lifecycle change; the scheduler's per-second
ticks and the per-request access log only come with `-v`. And the first minutes: GET / opens the console,
/favicon.ico is there, `--port 0` names the real port in the console's line, an operator whose token is empty
is told apart from no operator at all, and a bot that would refuse every request does not start unless told.

How the quiet run is measured: about 30 s of steady state (a real job posting samples and heartbeats about once
a second and long-polling for commands, then paused and resumed; a second real job hung (SIGSTOP) with a pause
for it waiting 25 s in `msmon cmd`, which asks for its result five times a second). Every line the bot wrote in
that window that is not an alert (the console receiver's `[msmon] ` lines) is counted. The time-driven sources
(apscheduler's 1 s tick, aiohttp's line per request) are switched off, not slowed down, so the count in the
window is the commands' own lifecycle lines and nothing per second: 0 time-driven lines in about 30 s (a source
ticking every 30 s or more would not show here).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.fakes.bot_server import request, wait_for
from tests.fakes.process import terminate, terminate_group

pytest.importorskip("aiohttp")

JOB, OP = "job-token-quiet-1234567890", "operator-token-quiet-1234567890"
ENV = {**os.environ, "T_JOB": JOB, "T_OP": OP, "PYTHONPATH": str(ROOT)}
MSMON = [sys.executable, "-m", "msmon.cli.main"]


def _config(tmp: Path, operators: str = "      - {user: \"cli:me\", env: T_OP}\n") -> Path:
    cfg = tmp / "bot.yaml"
    cfg.write_text(f"bot:\n  host: 127.0.0.1\n  port: 0\n  state_path: {tmp / 'bot.sqlite'}\n"
                   "  tokens:\n    - {project: \"*\", env: T_JOB}\n  pipeline: {group_wait: 1}\n"
                   f"  console: {{charts_dir: {tmp / 'charts'}}}\n"
                   "  commands:\n    allow:\n      - {project: \"*\", users: [\"cli:me\"]}\n"
                   + (f"    operators:\n{operators}" if operators else ""))
    return cfg


class Serve:
    """`msmon serve` with its stdout and stderr in one file, read as it goes."""

    def __init__(self, tmp: Path, *args: str, env: dict[str, str] | None = None, cfg: Path | None = None) -> None:
        self.log = tmp / f"serve{len(list(tmp.glob('serve*.log')))}.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen([*MSMON, "serve", "--config", str(cfg or _config(tmp)), *args], cwd=tmp,
                                         env=env or ENV, stdout=out, stderr=out)
        assert wait_for(lambda: "listening on" in self.text() or self.proc.poll() is not None, timeout=60)
        m = re.search(r"listening on (http://127\.0\.0\.1:(\d+))", self.text())
        assert m and self.proc.poll() is None, self.text()
        self.url, self.port = m.group(1), int(m.group(2))

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> str:
        terminate(self.proc, 15)
        return self.text()


def _not_alerts(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip() and not line.startswith("[msmon] ")]


def _cmd(url: str, words: str, wait: float = 60) -> subprocess.Popen[str]:
    return subprocess.Popen([*MSMON, "cmd", "--bot", url, "--wait", str(wait), words],
                            env={**ENV, "MSMON_OPERATOR_TOKEN": OP}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


@pytest.mark.slow  # about 45 s on two cores
@pytest.mark.mindspore
def test_serve_with_a_job_and_a_waiting_cmd_writes_alerts_and_lifecycle_lines_only(tmp_path: Path) -> None:
    pytest.importorskip("mindspore")
    bot = Serve(tmp_path)
    jobs: list[subprocess.Popen[bytes]] = []
    try:
        (tmp_path / "monitor.yaml").write_text(
            "monitor_config:\n  monitor_on: true\n  step_interval: 1\n  log_interval: 1000\n"
            f"  alert: {{baseline_steps: 100}}\n  bot: {{url: \"{bot.url}\", token_env: T_JOB}}\n")
        for run in ("quiet-run", "hung-run"):  # one job that goes on, one that will hang
            jobs.append(subprocess.Popen([sys.executable, str(ROOT / "examples" / "custom_loop.py"), "--steps",
                                          "100000", "--run-id", run, "--step-time", "0.02", "--config",
                                          "monitor.yaml"], cwd=tmp_path, env=ENV, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL, start_new_session=True))

        def seen(run: str) -> bool:
            status, body = request(bot.url, "GET", "/v1/runs", token=OP)
            return status == 200 and any(r.get("run_id") == run for r in body.get("runs", body))

        assert wait_for(lambda: seen("quiet-run") and seen("hung-run"), timeout=180), bot.text()[-2000:]
        time.sleep(3)  # past the jobs' first posts
        os.killpg(jobs[1].pid, signal.SIGSTOP)  # hung (a wedged process): it takes no command any more
        start, t0 = len(bot.text()), time.monotonic()
        time.sleep(5)  # steady: samples and heartbeats about once a second, a long poll held
        pause = _cmd(bot.url, "pause quiet-run")
        assert pause.wait(90) == 0, pause.communicate()
        waiting = _cmd(bot.url, "pause hung-run", wait=25)  # no job takes it: it asks 5 times a second
        time.sleep(20)
        assert waiting.poll() is None, waiting.communicate()  # still waiting
        resume = _cmd(bot.url, "resume quiet-run")
        assert resume.wait(90) == 0, resume.communicate()
        out, err = waiting.communicate(timeout=90)
        assert waiting.returncode != 0 and "no result from the job after 25 s" in out, (out, err)
        window = time.monotonic() - t0
        seen_text = bot.text()[start:]
    finally:
        for job in jobs:
            terminate_group(job)  # the hung one too: SIGCONT, then SIGKILL
        text = bot.stop()
    lines = _not_alerts(seen_text)
    lifecycle = [line for line in lines if re.search(r"msmon bot: command c\d+ `", line)]
    # the bot's own overload changes (bot/ingest/overload.py: one line when the level changes, never per request)
    # come when a busy test machine starves its loop; they are state changes, not the per-tick noise looked for
    overload = [line for line in lines if re.search(r"msmon bot: ingest (no longer )?overloaded", line)]
    other = [line for line in lines if line not in lifecycle and line not in overload]
    assert len(overload) <= 6, overload  # a few changes of level at most, never one per envelope
    print(f"{window:.0f} s of two jobs (one hung), a pause, a msmon cmd waiting 25 s on the hung one and a "
          f"resume: {len(lines)} non-alert lines ({len(lifecycle)} the commands' own lifecycle lines, "
          f"{len(other)} time-driven or other)")
    assert other == [], "\n".join(other[:20])
    assert len(lifecycle) == 3, lifecycle  # pause, the waiting pause, resume: one line each
    assert "[msmon] c" in seen_text  # the results were reported on the console as alerts are
    whole = _not_alerts(text)
    assert len(whole) <= 10, "\n".join(whole)  # start (listening, console), 3 commands, stop (3 lines)


def test_verbose_shows_the_scheduler_ticks_and_the_access_log(tmp_path: Path) -> None:
    bot = Serve(tmp_path, "-v")
    try:
        for _ in range(5):
            request(bot.url, "GET", "/healthz", token=None)
        time.sleep(3)
    finally:
        text = bot.stop()
    assert len(re.findall(r"apscheduler\S* INFO", text)) >= 2, text
    assert text.count("GET /healthz") == 5, text  # the access log, one line per request


def test_root_redirects_to_the_console_favicon_and_the_real_port(tmp_path: Path) -> None:
    bot = Serve(tmp_path)
    try:
        class NoRedirect(urllib.request.HTTPRedirectHandler):
            def redirect_request(self, *args: object, **kwargs: object) -> None:
                return None

        opener = urllib.request.build_opener(NoRedirect)
        try:
            opener.open(bot.url + "/", timeout=10)
            raise AssertionError("GET / was not redirected")
        except urllib.error.HTTPError as exc:
            assert exc.code == 302 and exc.headers["Location"] == "/console/", (exc.code, exc.headers)
        with urllib.request.urlopen(bot.url + "/favicon.ico", timeout=10) as r:
            assert r.status == 200 and r.headers["Content-Type"] == "image/x-icon"
            assert r.read()[:4] == b"\x00\x00\x01\x00"  # an ICO file
    finally:
        text = bot.stop()
    assert f"web console at http://127.0.0.1:{bot.port}/console/ (log in with an operator's token: cli:me)" in text
    assert "<port>" not in text


def test_an_operator_with_an_empty_token_is_not_called_nobody(tmp_path: Path) -> None:
    env = {k: v for k, v in ENV.items() if k != "T_OP"}
    text = Serve(tmp_path, env=env).stop()
    assert "nobody can log in: the token of cli:me is empty (env T_OP); set it and restart" in text, text
    assert "add an operator" not in text
    (tmp_path / "none").mkdir()
    text = Serve(tmp_path / "none", cfg=_config(tmp_path / "none", operators="")).stop()
    assert "nobody can log in yet: add an operator to commands.operators" in text, text


def test_a_bot_that_would_refuse_everything_does_not_start_unless_told(tmp_path: Path) -> None:
    env = {k: v for k, v in ENV.items() if k not in ("T_JOB", "T_OP")}
    p = subprocess.run([*MSMON, "serve", "--config", str(_config(tmp_path))], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert "would refuse every job and every command" in p.stderr and "--allow-no-tokens" in p.stderr, p.stderr
    assert "env T_JOB" in p.stderr  # the warnings above say which variables are empty
    bot = Serve(tmp_path, "--allow-no-tokens", env=env)
    status, _ = request(bot.url, "GET", "/v1/runs", token=JOB)
    bot.proc.send_signal(signal.SIGTERM)
    bot.stop()
    assert status == 401
