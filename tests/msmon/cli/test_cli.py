"""The msmon command line, run as a user runs it (a real subprocess of the installed console script)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.fakes.helpers import MSMON, msmon


@pytest.mark.slow  # about 30 s on two cores
@pytest.mark.mindspore
def test_demo_runs_the_bot_and_catches_the_incident_before_the_loss_spike(tmp_path):
    """The README's main command. Part 1: the bot starts, the incident is replayed into it as a job would
    send it, and the console receiver prints the alerts in the order they happened, with charts. Part 2:
    a real MindSpore job goes unstable, its ERROR and chart arrive, and `msmon cmd` checkpoints, pauses,
    resumes and stops it, with the results reported."""
    p = msmon("demo", "--out", os.fspath(tmp_path), "--config", os.fspath(ROOT / "config" / "monitor.yaml"))
    assert p.returncode == 0, p.stderr
    delivered = [line for line in p.stdout.splitlines() if line.startswith("[msmon] WARNING")
                 or line.startswith("[msmon] ERROR")]
    assert delivered[0] == "[msmon] WARNING grad_norm_creep: run demo-13b, device 0, step 2240"
    assert "[msmon] ERROR loss_spike: run demo-13b, device 0, step 2420" in delivered
    charts = sorted((tmp_path / "charts").glob("demo-13b-*.png"))
    assert len(charts) == sum(line.startswith("[msmon] ERROR") and "demo-13b" in line for line in delivered) >= 3
    first = [line for line in p.stdout.splitlines() if line.startswith("First alert:")][0]
    assert first.startswith("First alert: WARNING grad_norm_creep at step 2240, 160 steps (27 minutes)")
    assert "The bot now holds run demo-13b at step 2590" in p.stdout
    part2 = p.stdout.split("msmon demo, part 2")[1]
    assert any(line.startswith("[msmon] ERROR") and "run demo-ms" in line for line in part2.splitlines())
    assert list((tmp_path / "charts").glob("demo-ms-*.png"))
    ckpt = re.search(r"c1 done: device 0 OK at step (\d+): checkpoint of step \1 written to (\S+)", part2)
    assert ckpt and os.path.exists(ckpt.group(2)), part2
    assert re.search(r"c2 done: device 0 OK at step (\d+): paused at step \1", part2)
    assert "PAUSED" in part2 and "chart: " in part2  # status, while paused
    assert re.search(r"done: device 0 OK at step \d+: resumed at step", part2)
    assert re.search(r"done: device 0 OK at step (\d+): stopping after step \1", part2)


def test_demo_without_the_bot(tmp_path):
    p = msmon("demo", "--no-bot", "--out", os.fspath(tmp_path), "--config",
              os.fspath(ROOT / "config" / "monitor.yaml"))
    assert p.returncode == 0, p.stderr
    assert "WARNING  grad_norm_creep" in p.stdout and "ERROR    loss_spike" in p.stdout


def test_replay_prints_alerts(tmp_path):
    log = tmp_path / "log.csv"
    lines = ["step,loss,grad_norm"] + [f"{i},{2.0 + 0.01 * (i % 7)},{1.0 if i < 700 else 40.0}" for i in range(800)]
    log.write_text("\n".join(lines) + "\n")
    cfg = tmp_path / "m.yaml"
    cfg.write_text("monitor_config:\n  monitor_on: true\n  alert:\n    grad_norm_threshold: 10.0\n")
    p = msmon("replay", os.fspath(log), "--config", os.fspath(cfg))
    assert p.returncode == 0, p.stderr
    assert "step     701  ERROR    grad_norm" in p.stdout
    assert p.stdout.strip().splitlines()[-1].startswith("2 alert(s): 2 ERROR, 0 WARNING")


def test_replay_bad_input_names_the_line(tmp_path):
    log = tmp_path / "log.csv"
    log.write_text("step,loss\n0,2.0\n1,abc\n")
    p = msmon("replay", os.fspath(log))
    assert p.returncode == 2
    assert "log.csv:3: column 'loss' holds 'abc', which is not a number" in p.stderr
    log.write_text("step,loss\n0,2.0\n5,nan\n3,2.0\n")
    p = msmon("replay", os.fspath(log))
    assert p.returncode == 2 and "log.csv:4: step 3 comes after step 5: steps must increase" in p.stderr


def test_check_config_says_what_will_be_monitored(tmp_path):
    train = tmp_path / "train.yaml"
    train.write_text("model: {layers: 2}\nmonitor_config: !include monitor.yaml\n")
    body = (ROOT / "config" / "monitor.yaml").read_text().split("monitor_config:\n", 1)[1]
    (tmp_path / "monitor.yaml").write_text(body.replace("\n  ", "\n").lstrip())
    p = msmon("check-config", os.fspath(train))
    assert p.returncode == 0, p.stderr
    assert "valid" in p.stdout
    assert "every 10 step(s), log line every 100" in p.stdout
    assert "grad_norm: WARNING at 5, ERROR at 10, 2 sample(s) in a row" in p.stdout
    assert "loss_spike: WARNING at 3, ERROR at 6, 3 sample(s) in a row" in p.stdout


def test_check_config_errors_exit_2(tmp_path):
    bad = tmp_path / "train.yaml"
    bad.write_text("monitor_config:\n  monitor_on: true\n  alert:\n    grad_norm_treshold: 1\n")
    p = msmon("check-config", os.fspath(bad))
    assert p.returncode == 2
    assert "monitor_config.alert.grad_norm_treshold: unknown key; did you mean grad_norm_threshold?" in p.stderr


def test_check_config_monitor_off(tmp_path):
    off = tmp_path / "train.yaml"
    off.write_text("monitor_config:\n  step_interval: 10\n")
    p = msmon("check-config", os.fspath(off))
    assert p.returncode == 0 and "monitoring is OFF" in p.stdout


def test_notifier_import_stays_light():
    code = ("import sys, notifier, notifier.monitor, msmon.offline.replay, msmon.cli.main; "
            "heavy = [m for m in ('aiohttp', 'slack_sdk', 'matplotlib', 'tensorboardX', 'mindspore', 'numpy') "
            "if m in sys.modules]; print(heavy)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert p.stdout.strip() == "[]"


def test_the_wire_and_the_pure_delivery_code_import_alone():
    """What the bot takes from notifier (the wire schema, safe names, the Retry-After reader) and the bot's
    own delivery scheduler load no Monitor, no YAML, no thread, socket or HTTP client."""
    code = ("import sys, msmon.contract.wire, msmon.common.safenames, notifier.sendq, bot.delivery; "
            "print([m for m in ('yaml', 'notifier.monitor', 'notifier.config', 'notifier.transport', 'threading', "
            "'socket', 'urllib.request', 'aiohttp') if m in sys.modules])")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert p.stdout.strip() == "[]"
    from notifier import Monitor, Severity  # the package's names still load on use

    assert Monitor.__name__ == "Monitor" and Severity.ERROR.value == "ERROR"


def test_check_config_on_the_shipped_training_yaml():
    p = msmon("check-config", os.fspath(ROOT / "config" / "train_example.yaml"))
    assert p.returncode == 0, p.stderr
    assert "every 10 step(s), log line every 100" in p.stdout
    assert "Remember to attach it: Model.train(..., callbacks=[MonitorCallback(" in p.stdout


def test_cmd_says_what_is_missing(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "MSMON_OPERATOR_TOKEN"}
    p = subprocess.run([MSMON, "cmd", "status", "run-42"], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 2 and "MSMON_OPERATOR_TOKEN holds no operator token" in p.stderr
    p = subprocess.run([MSMON, "cmd", "--bot", "http://127.0.0.1:9", "status", "run-42"], capture_output=True,
                       text=True, env={**env, "MSMON_OPERATOR_TOKEN": "t"}, timeout=60)
    assert p.returncode == 2 and "cannot reach the msmon bot at http://127.0.0.1:9" in p.stderr
    p = subprocess.run([MSMON, "cmd", "--bot", "127.0.0.1:8080", "status", "run-42"], capture_output=True,
                       text=True, env={**env, "MSMON_OPERATOR_TOKEN": "t"}, timeout=60)
    assert p.returncode == 2 and "the bot's URL must start with http:// or https://" in p.stderr
