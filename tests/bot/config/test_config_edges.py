"""bot.yaml at the edges (issue 27): each bad setting is a ConfigError naming the key and the line."""

from __future__ import annotations

import pytest

from bot.config import load_bot_config
from msmon.config.errors import ConfigError


def bot_error_of(path: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_bot_config(path)
    return str(info.value)


@pytest.fixture
def write(tmp_path):
    def _write(name: str, text: str) -> str:
        p = tmp_path / name
        p.write_text(text)
        return str(p)
    return _write


def test_a_label_route_names_its_project(write):
    msg = bot_error_of(write("bot.yaml", "bot:\n  routes:\n    - receiver: slack\n      channel: C0A\n"
                                         "      labels: {team: a}\n"))
    assert "bot.routes[0].labels" in msg and "names its project" in msg and "bot.yaml:5" in msg
    for project in ("a", "*"):
        cfg = load_bot_config({"bot": {"routes": [{"receiver": "slack", "channel": "C0A", "project": project,
                                                   "labels": {"team": "a"}}]}})
        assert cfg.routes[0].project == project


@pytest.mark.parametrize(("text", "key", "line", "says"), [
    ("bot:\n  port: 1\n  host: h\n  port: 2\n", "bot.port", 4, "given twice in this mapping (first at line 2)"),
    ("bot:\n  email:\n    host: a\n    host: b\n", "bot.email.host", 4, "given twice"),
    ('bot:\n  email:\n    host: smtp.x\n    sender: "a@b\\r\\nBcc: x@y"\n', "bot.email.sender", 4,
     "not one plain address"),
    ('bot:\n  email:\n    sender: "ops <a@b>"\n', "bot.email.sender", 3, "not one plain address"),
    ("bot:\n  webhook:\n    url: file:///etc/passwd\n", "bot.webhook.url", 3, "must start with http:// or https://"),
    ("bot:\n  feishu:\n    api_base: file:///etc/passwd\n", "bot.feishu.api_base", 3, "http:// or https://"),
    ("bot:\n  tokens:\n    - {project: '', env: X}\n", "bot.tokens[0].project", 3, "a project needs a name"),
    ("bot:\n  tokens:\n    - env: X\n      project: '   '\n", "bot.tokens[0].project", 4, "a project needs a name"),
    ("bot:\n  store:\n    url: 'postgresql://'\n", "bot.store.url", 3, "names no database"),
    ("bot:\n  store:\n    url: 'postgresql://msmon@db:5432'\n", "bot.store.url", 3, "names no database"),
    ("bot:\n  alertmanager:\n    chart_url: '{0}'\n", "bot.alertmanager.chart_url", 3, "{0} cannot be filled in"),
    ("bot:\n  alertmanager:\n    chart_url: 'http://g/{run_id.__class__}'\n", "bot.alertmanager.chart_url", 3,
     "cannot be filled in"),
    ("bot:\n  alertmanager:\n    chart_url: 'http://g/{run_id'\n", "bot.alertmanager.chart_url", 3, "not a template"),
    ("bot:\n  alertmanager:\n    chart_url: 'grafana/{run_id}'\n", "bot.alertmanager.chart_url", 3,
     "http:// or https://"),
])
def test_each_bad_setting_is_a_config_error_naming_key_and_line(write, text, key, line, says):
    msg = bot_error_of(write("bot.yaml", text))
    assert f"{key}:" in msg and says in msg and f"bot.yaml:{line}" in msg, msg


def test_the_good_forms_of_those_settings_load(write):
    cfg = load_bot_config(write("bot.yaml", "bot:\n  email:\n    sender: msmon-alerts@example.org\n"
                                            "  alertmanager:\n    chart_url: 'https://g/d?run={run_id}&r={{rule}}'\n"
                                            "  store:\n    url: 'postgresql://msmon@db:5432/msmon'\n"
                                            "  tokens:\n    - {project: '*', env: X}\n"))
    assert cfg.alertmanager.chart_url.format(run_id="r1", rule="x") == "https://g/d?run=r1&r={rule}"
    assert load_bot_config({"bot": {"store": {"url": "postgresql://h/?dbname=x"}}}).store.url


def test_a_merge_key_may_be_overridden_and_is_not_a_duplicate(write):
    cfg = load_bot_config(write("bot.yaml", "defaults: &d\n  port: 1\n  host: h\nbot:\n  <<: *d\n  port: 2\n"))
    assert cfg.port == 2 and cfg.host == "h"


@pytest.mark.parametrize(("bot_section", "key", "says"), [
    ("    project: ''\n", "monitor_config.bot.project", "a project needs a name"),
    (f"    project: {'p' * 300}\n", "monitor_config.bot.project", "at most 256 characters"),
    ("    labels:\n" + "".join(f"      l{i}: v\n" for i in range(65)), "monitor_config.bot.labels",
     "at most 64 labels"),
    (f"    labels:\n      big: {'x' * 100_000}\n", "monitor_config.bot.labels", "at most 65,536 characters"),
    (f"    labels:\n      {'k' * 300}: v\n", "monitor_config.bot.labels", "a label name is text of at most 256"),
    ("    labels:\n      team: a\n      team: b\n", "monitor_config.bot.labels.team", "given twice"),
])
def test_check_config_refuses_what_the_bot_would_refuse(write, bot_section, key, says):
    """The training YAML's project and labels are checked by the wire's own check (msmon/contract/wire.py):
    what passes `msmon check-config` is what the bot takes, not a 422 on every envelope."""
    from notifier import load_config

    path = write("train.yaml", "monitor_config:\n  monitor_on: true\n  bot:\n" + bot_section)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert f"{key}:" in str(info.value) and says in str(info.value) and "train.yaml:" in str(info.value)


def test_what_check_config_takes_the_bot_decodes():
    import time

    from msmon.contract.wire import Envelope, decode, encode, labels_problem, project_problem

    labels = {f"l{i}": "v" * 1000 for i in range(64)}
    assert labels_problem(labels) is None and project_problem("p" * 256) is None
    env = Envelope(run_id="r", device="0", sent_at=time.time(), project="p" * 256, labels=labels)
    assert decode(encode(env), Envelope).labels == labels
