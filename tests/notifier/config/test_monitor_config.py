"""monitor_config: the issue's example loads as written; every mistake is an error naming the key path."""

from __future__ import annotations

import logging

import pytest

from notifier import ConfigError, Monitor, load_config
from tests.conftest import ROOT

EXAMPLE = """\
monitor_config:
  monitor_on: True
  step_interval: 10
  log_interval: 100
  metrics: [loss, learning_rate, grad_norm, throughput]
  alert:
    enable: True
    loss_spike_threshold: 3.0
    grad_norm_threshold: 10.0
    alert_interval: 500
  tensorboard:
    enable: True
    log_dir: ./tb_logs
  per_device_metrics: True
"""


def error_of(source) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(source)
    return str(info.value)


def test_the_users_example_loads_exactly_as_written(write):
    cfg = load_config(write("train.yaml", EXAMPLE))
    assert cfg.monitor_on is True
    assert (cfg.step_interval, cfg.log_interval) == (10, 100)
    assert cfg.metrics == ["loss", "learning_rate", "grad_norm", "throughput"]
    assert cfg.alert.alert_interval == 500
    # the two legacy thresholds land on the rules' levels
    assert cfg.alert.rules.loss_spike.warning == 3.0
    assert cfg.alert.rules.loss_spike.error_level() == 6.0
    assert cfg.alert.rules.grad_norm.error == 10.0
    assert cfg.alert.rules.grad_norm.warning_level() == 5.0
    assert cfg.tensorboard.enable and cfg.tensorboard.log_dir == "./tb_logs"
    assert cfg.per_device_metrics is True


def test_shipped_config_is_the_example_plus_comments():
    cfg = load_config(ROOT / "config" / "monitor.yaml")
    ref = load_config({"monitor_config": __import__("yaml").safe_load(EXAMPLE)["monitor_config"]})
    assert cfg == ref


def test_unknown_key_golden(write):
    text = EXAMPLE.replace("grad_norm_threshold", "grad_norm_treshold")
    msg = error_of(write("train.yaml", text))
    assert "monitor_config.alert.grad_norm_treshold: unknown key; did you mean grad_norm_threshold?" in msg
    assert "train.yaml:9" in msg


def test_unknown_key_without_close_match_lists_valid_keys():
    msg = error_of({"monitor_config": {"monitor_on": True, "zzz": 1}})
    assert "monitor_config.zzz: unknown key; valid keys here are actions, alert, bot, checkpoint_ring, csv" in msg


def test_synonym_suggestion():
    msg = error_of({"monitor_config": {"metrics": ["loss", "lr"]}})
    assert msg.endswith("monitor_config.metrics[1]: 'lr' is not allowed; use one of loss, learning_rate, grad_norm, "
                        "throughput (did you mean learning_rate?)")


@pytest.mark.parametrize(
    ("section", "expected"),
    [
        ({"step_interval": 0}, "monitor_config.step_interval: must be at least 1, got 0"),
        ({"step_interval": "ten"}, "monitor_config.step_interval: expected an integer, got 'ten' (str)"),
        ({"monitor_on": "yes please"}, "monitor_config.monitor_on: expected true or false, got 'yes please' (str)"),
        ({"alert": {"loss_spike_threshold": -1}}, "monitor_config.alert.loss_spike_threshold: must be greater than "
                                                  "0, got -1.0"),
        ({"alert": {"rules": {"loss_spike": {"warning": 5, "error": 4}}}},
         "monitor_config.alert.rules.loss_spike.error: the ERROR level (4) must not be below the WARNING level (5)"),
        ({"alert": []}, "monitor_config.alert: expected a mapping (a section with keys), got [] (list)"),
        ({"tensorboard": {"log_dir": 3}}, "monitor_config.tensorboard.log_dir: expected a string, got 3 (int)"),
        ({"alert": {"rules": {"throughput_drop": {"warning": 1.5}}}},
         "monitor_config.alert.rules.throughput_drop.warning: must be at most 1, got 1.5"),
        ({"bot": {"url": "msmon:8080"}}, "monitor_config.bot.url: must start with http:// or https://, got "
                                         "'msmon:8080'"),
    ],
)
def test_wrong_types_and_ranges_golden(section, expected):
    assert expected in error_of({"monitor_config": section})


def test_every_issue_is_reported_at_once():
    msg = error_of({"monitor_config": {"step_interval": 0, "log_intervall": 5, "alert": {"enable": "no"}}})
    assert "monitor_config.step_interval" in msg
    assert "monitor_config.log_intervall: unknown key; did you mean log_interval?" in msg
    assert "monitor_config.alert.enable: expected true or false" in msg


def test_yaml_number_without_dot_is_a_number():
    # PyYAML reads 1e-5 as a string; the author meant a number.
    cfg = load_config({"monitor_config": {"alert": {"rules": {"vanished_grad": {"epsilon": "1e-5"}}}}})
    assert cfg.alert.rules.vanished_grad.epsilon == 1e-5


def test_nested_section_is_an_error_saying_where_it_belongs(write):
    path = write("train.yaml", "model_config:\n  hidden: 4096\n  monitor_config:\n    monitor_on: True\n")
    msg = error_of(path)
    assert ("model_config.monitor_config: found here, but monitor_config must be a top-level key (check its "
            "indentation); as it is, none of its settings would take effect  (train.yaml:3)") in msg


def test_key_slipped_out_of_the_section_is_an_error(write):
    msg = error_of(write("train.yaml", "monitor_config:\n  monitor_on: True\nstep_interval: 10\n"))
    assert ("step_interval: is at the top level of the file; it belongs under monitor_config (check its "
            "indentation)  (train.yaml:3)") in msg


def test_training_yaml_without_section(write):
    msg = error_of(write("train.yaml", "model: {layers: 2}\nseed: 1\n"))
    assert "no monitor_config section found in" in msg and "top-level keys: model, seed" in msg


def test_standalone_file_with_bare_keys(write):
    cfg = load_config(write("monitor.yaml", "monitor_on: true\nstep_interval: 5\n"))
    assert cfg.monitor_on and cfg.step_interval == 5


def test_include(write):
    write("monitor.yaml", "monitor_on: true\nalert:\n  grad_norm_threshold: 7.0\n")
    cfg = load_config(write("train.yaml", "model: {layers: 2}\nmonitor_config: !include monitor.yaml\n"))
    assert cfg.monitor_on and cfg.alert.rules.grad_norm.error == 7.0


def test_include_errors_name_the_file_and_line(write):
    write("monitor.yaml", "monitor_on: true\nalert:\n  grad_norm_treshold: 7.0\n")
    msg = error_of(write("train.yaml", "monitor_config: !include monitor.yaml\n"))
    assert "monitor_config.alert.grad_norm_treshold: unknown key; did you mean grad_norm_threshold?" in msg
    assert "monitor.yaml:3" in msg
    msg = error_of(write("t2.yaml", "monitor_config: !include nope.yaml\n"))
    assert "!include: file not found" in msg and "t2.yaml:1" in msg


def test_include_cycle(write):
    write("a.yaml", "monitor_config: !include b.yaml\n")
    write("b.yaml", "x: !include a.yaml\n")
    assert "include cycle: a.yaml -> b.yaml -> a.yaml" in error_of(write("a.yaml", "monitor_config: !include b.yaml\n"))


def test_invalid_yaml_names_the_line(write):
    msg = error_of(write("train.yaml", "monitor_config:\n  monitor_on: True\n   step_interval: [\n"))
    assert "yaml: not valid YAML" in msg and "train.yaml:3" in msg


def test_legacy_threshold_and_rule_level_both_set():
    msg = error_of({"monitor_config": {"alert": {"grad_norm_threshold": 10.0,
                                                 "rules": {"grad_norm": {"error": 12.0}}}}})
    assert ("monitor_config.alert.grad_norm_threshold: sets the same level as "
            "monitor_config.alert.rules.grad_norm.error; keep one of them") in msg


def test_phases():
    cfg = load_config({"monitor_config": {"alert": {"phases": [
        {"name": "warmup", "end_step": 2000, "rules": {"loss_spike": {"warning": 6.0}}}]}}})
    assert cfg.alert.phases[0].rules == {"loss_spike": {"warning": 6.0}}
    msg = error_of({"monitor_config": {"alert": {"phases": [
        {"name": "warmup", "end_step": 2000, "rules": {"loss_spik": {"warning": 6.0},
                                                       "grad_norm_spike": {"window": 10}}},
        {"name": "late", "start_step": 1000}]}}})
    assert "monitor_config.alert.phases[0].rules.loss_spik: unknown rule; did you mean loss_spike?" in msg
    assert ("monitor_config.alert.phases[0].rules.grad_norm_spike.window: cannot change per phase (a phase may set "
            "consecutive, enable, error, warning); set it once under monitor_config.alert.rules.grad_norm_spike") in msg
    assert "monitor_config.alert.phases[1]: overlaps phases[0] (steps 0-2000); phases must not overlap" in msg


def test_phase_override_checked_against_base_levels():
    msg = error_of({"monitor_config": {"alert": {"phases": [
        {"name": "warmup", "end_step": 100, "rules": {"throughput_drop": {"warning": 0.9}}}]}}})
    assert ("monitor_config.alert.phases[0].rules.throughput_drop.error: the ERROR level (0.6) must not be below "
            "the WARNING level (0.9)") in msg


def test_actions():
    cfg = load_config({"monitor_config": {"actions": [
        {"rule": "grad_norm", "severity": "ERROR", "action": "save_checkpoint"},
        {"rule": "*", "action": "scale_lr", "factor": 0.5}]}})
    assert [a.action for a in cfg.actions] == ["save_checkpoint", "scale_lr"]
    msg = error_of({"monitor_config": {"actions": [
        {"rule": "grad_nrom", "action": "save_checkpoint"},
        {"rule": "loss_spike", "action": "scale_lr"},
        {"rule": "loss_spike", "action": "stopp"},
        {"rule": "loss_spike", "action": "stop", "severity": "FATAL"}]}})
    assert ("monitor_config.actions[0].rule: unknown rule 'grad_nrom'; did you mean grad_norm? "
            "(use * for any rule)") in msg
    assert "monitor_config.actions[1].factor: scale_lr needs a factor, e.g. factor: 0.5" in msg
    assert "monitor_config.actions[2].action: unknown action 'stopp'; did you mean stop?" in msg
    assert "monitor_config.actions[3].severity: 'FATAL' is not allowed; use one of WARNING, ERROR" in msg


def test_monitor_off_logs_one_line_saying_why(caplog):
    with caplog.at_level(logging.INFO, logger="msmon"):
        mon = Monitor({"monitor_config": {"step_interval": 10}}, run_id="run-7")
    assert not mon.enabled
    assert mon.step(0, loss=1.0) == []
    lines = [r.getMessage() for r in caplog.records if r.name == "msmon"]
    assert lines == ["msmon: monitoring is off for run run-7 (monitor_config.monitor_on is not set and defaults to "
                     "false); set monitor_on: true to enable it"]


def test_monitor_off_explicitly(caplog, write):
    with caplog.at_level(logging.INFO, logger="msmon"):
        Monitor(write("t.yaml", "monitor_config:\n  monitor_on: False\n"), run_id="r")
    assert "(monitor_config.monitor_on is false)" in caplog.text


def test_alerting_off_is_said(caplog):
    with caplog.at_level(logging.INFO, logger="msmon"):
        Monitor({"monitor_config": {"monitor_on": True, "alert": {"enable": False}}}, run_id="r").close()
    assert "alerting is off (monitor_config.alert.enable is false)" in caplog.text


def test_two_configs_never_share_their_rules_params():
    """Defaults are deep copies: a level set in one config (a legacy threshold, or live by loosen-threshold)
    must not appear in another built in the same process."""
    one = Monitor({"monitor_config": {"monitor_on": True, "alert": {"grad_norm_threshold": 10.0}}}, "a")
    one.set_threshold("grad_norm_spike", 99.0)
    other = load_config({"monitor_config": {"monitor_on": True}})
    assert (other.alert.rules.get("grad_norm").error, other.alert.rules.get("grad_norm_spike").warning) == (None, 4.0)
