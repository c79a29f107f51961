"""What a newcomer meets on the command line (issue 19): msmon --version, help on every option, the default
monitor_config shipped in the package (equal to the documented config/monitor.yaml) so replay works from any
folder, a plain note for a configured metric the log lacks, and msmon cmd saying what to add to which file."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from msmon.cli.common import default_monitor_config
from msmon.cli.main import build_parser
from tests.conftest import ROOT
from tests.fakes.helpers import msmon


def _actions(parser: argparse.ArgumentParser, path: str):
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sub in a.choices.items():
                yield from _actions(sub, f"{path} {name}")
        elif not isinstance(a, argparse._HelpAction):
            yield path, a


def test_every_option_of_every_subcommand_has_help() -> None:
    missing = [f"{path} {a.option_strings or a.dest}" for path, a in _actions(build_parser(), "msmon") if not a.help]
    assert missing == []


def test_version() -> None:
    p = msmon("--version")
    assert p.returncode == 0 and p.stdout.startswith("msmon ") and p.stdout.split()[1][0].isdigit(), p.stdout


def test_the_packaged_default_config_is_the_documented_one() -> None:
    """One source: msmon/data/monitor.yaml is what replay, demo and backtest read without --config; the repo's
    config/monitor.yaml is the documented example. They must not drift apart."""
    packaged = Path(default_monitor_config())
    assert packaged.is_file()
    assert packaged.read_bytes() == (ROOT / "config" / "monitor.yaml").read_bytes(), (
        "config/monitor.yaml changed: copy it to the package, cp config/monitor.yaml msmon/data/monitor.yaml")


def _log(path: Path) -> Path:
    lines = ["step,loss,grad_norm"] + [f"{i},{2.0 + 0.01 * (i % 7)},{1.0 if i < 700 else 40.0}" for i in range(800)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_replay_runs_outside_the_repository_and_says_which_metric_the_log_lacks(tmp_path: Path) -> None:
    log = _log(tmp_path / "mine.csv")
    p = msmon("replay", "mine.csv", cwd=tmp_path)  # no --config, and no config/ folder here
    assert p.returncode == 0, p.stderr
    assert "step     710  ERROR    grad_norm " in p.stdout  # the shipped config: every 10th step, threshold 10
    # learning_rate and throughput are in the config's metrics but not in this log: said without -v
    assert ("msmon replay: note: learning_rate is in the config's metrics but not in this log (800 rows read), so "
            "the rules on it did not run; if the log names it otherwise, map it with --columns lr=NAME") in p.stderr
    assert "throughput is in the config's metrics" in p.stderr and "loss is in" not in p.stderr
    assert log.exists()


def test_backtest_without_config_uses_the_packaged_one(tmp_path: Path) -> None:
    p = msmon("backtest", str(tmp_path), cwd=tmp_path)  # no labels: the error is about them, not the config
    assert p.returncode == 2 and "labels" in p.stderr and "config/monitor.yaml" not in p.stderr, p.stderr


def test_cmd_without_a_token_says_what_to_add_to_which_file(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "MSMON_OPERATOR_TOKEN"}
    p = subprocess.run([sys.executable, "-m", "msmon.cli.main", "cmd", "help"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    err = p.stderr
    assert "MSMON_OPERATOR_TOKEN holds no operator token" in err
    assert "bot.yaml lists under commands.operators" in err and '{user: "cli:me", env: MSMON_OPERATOR_TOKEN}' in err
    assert "config/bot.local.yaml has it already" in err and "export MSMON_OPERATOR_TOKEN=" in err


@pytest.mark.parametrize("name", ["bot.yaml", "bot.local.yaml"])
def test_the_shipped_bot_configs_listen_on_loopback(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("aiohttp")
    from bot.config import load_bot_config

    monkeypatch.setenv("MSMON_TOKEN", "job-token-0123456789")
    monkeypatch.setenv("MSMON_OPERATOR_TOKEN", "operator-token-0123456789")
    cfg = load_bot_config(str(ROOT / "config" / name))
    assert cfg.host == "127.0.0.1"
    if name == "bot.local.yaml":  # one operator, who may act on every project; no routes: the console receiver
        assert [o.user for o in cfg.commands.operators] == ["cli:me"] and cfg.routes == []
        assert [(p.project, p.users) for p in cfg.commands.allow] == [("*", ["cli:me"])]


def test_git_and_docker_ignore_what_they_should() -> None:
    gitignore = (ROOT / ".gitignore").read_text().split()
    assert "msmon-bot.sqlite*" in gitignore and "*.sqlite-wal" in gitignore and "*.sqlite-shm" in gitignore
    from tests.project.test_image import in_context  # .dockerignore's allow-list, read as Docker reads it

    assert not any(in_context(p) for p in (".venv/bin/python", ".git/HEAD", "demo-out/charts/a.png"))
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "pip install --no-deps --no-build-isolation /src" in dockerfile
    assert "COPY config/bot.local.yaml /etc/msmon/bot.yaml" in dockerfile
    assert "-e SLACK_SIGNING_SECRET=" in dockerfile and "-e MSMON_OPERATOR_TOKEN=" in dockerfile


def test_demo_without_the_bot_runs_outside_the_repository_and_says_what_to_try_next(tmp_path: Path) -> None:
    p = msmon("demo", "--no-bot", "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "through msmon's default monitor config" in p.stdout
    after = p.stdout.split("What to try next:\n", 1)[1]
    assert "msmon replay YOUR_LOG.csv" in after and "config/bot.local.yaml" in after
    assert "charts the bot drew" not in after  # there was no bot
