"""MindFormers' monitor_config, its top-level switches and the PyNative `monitor:` section: golden tests of every
key's effect on msmon's config and of the line that records how it was taken."""

from __future__ import annotations

import argparse
import logging
import textwrap

import pytest

from msmon.cli import check_config as cli
from notifier import ConfigError, Monitor, load_config
from notifier.config.mindformers import DEPRECATED, MINDFORMERS_KEYS
from notifier.config.model import MonitorConfig
from notifier.monitor import describe
from tests.conftest import ROOT

DEFAULT = MonitorConfig()


def load(write, text: str) -> MonitorConfig:
    return load_config(write("train.yaml", textwrap.dedent(text)))


def how(cfg: MonitorConfig, key: str) -> list[str]:
    return [t.how for t in cfg.mindformers if t.key == key]


def error_of(write, text: str) -> str:
    with pytest.raises(ConfigError) as info:
        load(write, text)
    return str(info.value)


# --- the global norm: MindFormers stops or skips at the threshold, msmon pages by then -----------------------


def test_check_for_global_norm_makes_the_threshold_grad_norm_s_error_level_at_the_first_sample(write):
    cfg = load(write, """\
        monitor_config:
          monitor_on: True
          check_for_global_norm: True
          global_norm_spike_threshold: 2.5
        """)
    rule = cfg.alert.rules.grad_norm
    assert (rule.error, rule.warning_level(), rule.consecutive) == (2.5, 1.25, 1)
    assert cfg.alert.baseline_steps == 0  # MindFormers acts from step 1
    assert how(cfg, "monitor_config.check_for_global_norm") == [
        "MindFormers stops the run at the first step whose global norm reaches 2.5"]
    assert how(cfg, "monitor_config.global_norm_spike_threshold") == [
        "ERROR level of msmon's grad_norm rule (2.5; WARNING at 1.25), so msmon pages when MindFormers acts; it "
        "fires after 1 sample(s) in a row at or above it (MindFormers stops at the first)"]
    line = next(t for t in cfg.mindformers if t.key == "monitor_config.global_norm_spike_threshold")
    assert line.location == "train.yaml:4" and line.value == 2.5


def test_the_threshold_s_default_is_mindformers_own(write):
    cfg = load(write, "monitor_config: {monitor_on: True, check_for_global_norm: True}\n")
    assert cfg.alert.rules.grad_norm.error == 3.0  # template.py MonitorConfig.global_norm_spike_threshold


def test_skip_data_turns_the_count_into_a_run_length_that_fires_before_mindformers_stops(write):
    cfg = load(write, """\
        use_skip_data_by_global_norm: True
        monitor_config:
          monitor_on: True
          global_norm_spike_threshold: 3.0
          global_norm_spike_count_threshold: 10
        """)
    rule = cfg.alert.rules.grad_norm
    assert (rule.error, rule.consecutive) == (3.0, 9)
    assert how(cfg, "use_skip_data_by_global_norm") == [
        "MindFormers skips each batch whose global norm reaches 3 and stops after 10 in a row"]
    assert how(cfg, "monitor_config.global_norm_spike_count_threshold") == [
        "run length of the grad_norm rule: it fires after 9 sample(s) in a row at or above it, before MindFormers "
        "stops at the 10th step in a row"]


@pytest.mark.parametrize(("count", "interval", "run"), [(10, 1, 9), (10, 3, 3), (10, 20, 1), (1, 1, 1), (2, 1, 1)])
def test_the_run_length_counts_samples_so_it_shrinks_with_the_step_interval(write, count, interval, run):
    cfg = load(write, f"""\
        use_skip_data_by_global_norm: True
        monitor_config:
          monitor_on: True
          step_interval: {interval}
          global_norm_spike_count_threshold: {count}
        """)
    assert cfg.alert.rules.grad_norm.consecutive == run
    # the run-th breaching sample, at worst at step interval-1 after the first breach, comes before the stop
    in_time = count == 1 or (interval - 1) + (run - 1) * interval < count - 1
    warned = any("the run can stop before msmon pages" in h for h in how(cfg, "monitor_config.step_interval"))
    assert in_time is not warned, (in_time, warned)


def test_the_threshold_does_nothing_when_mindformers_does_nothing_with_it(write):
    cfg = load(write, """\
        monitor_config:
          monitor_on: True
          global_norm_spike_threshold: 1.0
          global_norm_spike_count_threshold: 10
        """)
    assert cfg.alert.rules.grad_norm == DEFAULT.alert.rules.grad_norm
    assert cfg.alert.baseline_steps == DEFAULT.alert.baseline_steps
    assert how(cfg, "monitor_config.global_norm_spike_threshold")[0].startswith(
        "not acted on: MindFormers reads it only with check_for_global_norm or use_skip_data_by_global_norm")


def test_msmon_s_own_grad_norm_level_wins_and_says_it_pages_too_late(write):
    cfg = load(write, """\
        monitor_config:
          monitor_on: True
          check_for_global_norm: True
          global_norm_spike_threshold: 3.0
          alert:
            baseline_steps: 100
            rules:
              grad_norm: {error: 50.0, consecutive: 4}
        """)
    rule = cfg.alert.rules.grad_norm
    assert (rule.error, rule.consecutive, cfg.alert.baseline_steps) == (50.0, 4, 100)
    assert how(cfg, "monitor_config.global_norm_spike_threshold") == [
        "msmon's own grad_norm ERROR level 50 wins over global_norm_spike_threshold 3; MindFormers acts at 3, "
        "before msmon would page: lower it; msmon's own alert.rules.grad_norm.consecutive 4 wins (the translation "
        "gives 1) (MindFormers stops at the first)"]
    assert how(cfg, "monitor_config.alert.baseline_steps") == []


def test_the_legacy_grad_norm_threshold_is_msmon_s_own_level_too(write):
    cfg = load(write, """\
        monitor_config:
          monitor_on: True
          check_for_global_norm: True
          alert: {grad_norm_threshold: 2.0}
        """)
    assert cfg.alert.rules.grad_norm.error == 2.0
    assert "msmon's own grad_norm ERROR level 2 wins" in how(cfg, "monitor_config.global_norm_spike_threshold")[0]


def test_check_with_a_step_interval_warns_that_a_one_step_spike_can_be_missed(write):
    cfg = load(write, "monitor_config: {monitor_on: True, step_interval: 5, check_for_global_norm: True}\n")
    assert how(cfg, "monitor_config.step_interval")[-1].startswith(
        "MindFormers checks the global norm every step, msmon every 5: a one-step spike")


def test_check_and_skip_together_are_refused_as_mindformers_refuses_them(write):
    msg = error_of(write, """\
        use_skip_data_by_global_norm: True
        monitor_config: {monitor_on: True, check_for_global_norm: True}
        """)
    assert "monitor_config.check_for_global_norm: MindFormers refuses check_for_global_norm together with " \
           "use_skip_data_by_global_norm" in msg and "(train.yaml:2)" in msg


def test_the_count_is_not_acted_on_with_check_for_global_norm(write):
    cfg = load(write, "monitor_config: {monitor_on: True, check_for_global_norm: True, "
                      "global_norm_spike_count_threshold: 4}\n")
    assert cfg.alert.rules.grad_norm.consecutive == 1
    assert how(cfg, "monitor_config.global_norm_spike_count_threshold")[0].startswith("not acted on")


# --- *_format: the log line and TensorBoard ---------------------------------------------------------------


def test_formats_choose_the_log_line_and_tensorboard_in_mindformers_tensorboard_dir(write):
    cfg = load(write, """\
        monitor_config:
          monitor_on: True
          step_interval: 2
          local_loss_format: [log, tensorboard]
        tensorboard:
          tensorboard_dir: worker/tensorboard
        """)
    assert cfg.log_interval == 2
    assert (cfg.tensorboard.enable, cfg.tensorboard.log_dir) == (True, "worker/tensorboard")
    assert how(cfg, "monitor_config.local_loss_format") == [
        "msmon's step loss (metrics: loss) stands for the local loss: a log line at every sample and msmon's "
        "TensorBoard scalars"]
    assert how(cfg, "tensorboard.tensorboard_dir") == [
        "msmon's TensorBoard scalars go to worker/tensorboard/RUN_ID/device_N"]


@pytest.mark.parametrize("key", ["local_loss_format", "device_local_loss_format", "local_norm_format",
                                 "device_local_norm_format"])
def test_tensorboard_without_mindformers_tensorboard_section_means_log_as_in_mindformers(write, key):
    cfg = load(write, f"monitor_config: {{monitor_on: True, {key}: tensorboard}}\n")
    assert cfg.tensorboard.enable is False and cfg.log_interval == 1
    assert "so 'tensorboard' means 'log' (as in MindFormers): a log line at every sample" in how(
        cfg, f"monitor_config.{key}")[0]


@pytest.mark.parametrize("key", ["optimizer_state_format", "weight_state_format", "max_attention_logit_format"])
def test_formats_of_metrics_msmon_does_not_compute_change_no_output(write, key):
    cfg = load(write, f"monitor_config: {{monitor_on: True, {key}: [log, tensorboard]}}\n"
                      "tensorboard: {tensorboard_dir: tb}\n")
    assert (cfg.log_interval, cfg.tensorboard) == (DEFAULT.log_interval, DEFAULT.tensorboard)
    assert how(cfg, f"monitor_config.{key}")[0].endswith("msmon does not compute it and writes nothing for it")


def test_msmon_s_own_outputs_win_over_the_formats(write):
    cfg = load(write, """\
        monitor_config:
          monitor_on: True
          log_interval: 50
          local_norm_format: [log, tensorboard]
          tensorboard: {enable: False, log_dir: mine}
        tensorboard: {tensorboard_dir: theirs}
        """)
    assert (cfg.log_interval, cfg.tensorboard.enable, cfg.tensorboard.log_dir) == (50, False, "mine")
    assert how(cfg, "monitor_config.log_interval") == [
        "msmon's own log_interval 50 wins over the 'log' of the *_format keys (a line every sample)"]
    assert how(cfg, "monitor_config.tensorboard.enable") == [
        "msmon's own tensorboard.enable: false wins over the 'tensorboard' of the *_format keys"]


def test_a_bad_format_names_key_line_and_the_outputs(write):
    msg = error_of(write, "monitor_config:\n  monitor_on: True\n  local_norm_format: [log, tensorbord]\n")
    assert ("monitor_config.local_norm_format: 'tensorbord' is not an output; use log, tensorboard, a list of them "
            "or null (did you mean tensorboard?)  (train.yaml:3)") in msg


# --- the shared keys, the rest of MindFormers' keys, the switches ------------------------------------------


def test_monitor_on_and_step_interval_are_shared(write):
    cfg = load(write, "monitor_config: {monitor_on: True, step_interval: 10, print_struct: False}\n")
    assert (cfg.monitor_on, cfg.step_interval) == (True, 10)
    assert how(cfg, "monitor_config.monitor_on") == ["msmon's key too, same meaning: monitoring is on"]
    assert how(cfg, "monitor_config.step_interval") == ["msmon's key too, same meaning: a sample every 10 step(s)"]


@pytest.mark.parametrize(("key", "value", "says"), [
    ("dump_path", "'./dump'", "msmon does not read MindFormers' dump files"),
    ("target", "['layers.0.']", "msmon watches the global grad norm over all parameters instead"),
    ("invert", "True", "goes with target"),
    ("print_struct", "True", "expect the run to end at step 1"),
    ("stable_rank_config", "{format: log, step_interval: 100, target: ['layers'], do_aggregation: False, "
                           "moe_show_mode: all, power_iteration_num: 5}", "weights' stable rank"),
    ("health_checkpoint", "{enable: True}", "checkpoint health is MindFormers' record"),
])
def test_keys_msmon_cannot_act_on_are_accepted_and_named_with_what_msmon_does_instead(write, key, value, says):
    cfg = load(write, f"monitor_config: {{monitor_on: True, {key}: {value}}}\n")
    (taken,) = [t for t in cfg.mindformers if t.key == f"monitor_config.{key}"]
    assert not taken.acted and taken.how.startswith("not acted on: ") and says in taken.how
    assert cfg.alert == DEFAULT.alert and cfg.tensorboard == DEFAULT.tensorboard
    assert any(f"MindFormers monitor_config.{key}:" in line for line in describe(cfg, "r"))


def test_throughput_baseline_is_the_throughput_rules_expected_rate(write):
    cfg = load(write, "monitor_config: {monitor_on: True, throughput_baseline: 1200}\n")
    assert cfg.alert.rules.throughput_drop.expected == 1200
    assert how(cfg, "monitor_config.throughput_baseline")[0].startswith(
        "the expected rate of msmon's throughput_drop rule: 1200 samples/s per device")
    own = load(write, "monitor_config: {monitor_on: True, throughput_baseline: 1200, "
                      "alert: {rules: {throughput_drop: {expected: 900}}}}\n")
    assert own.alert.rules.throughput_drop.expected == 900
    assert how(own, "monitor_config.throughput_baseline") == [
        "msmon's own throughput_drop expected rate 900 samples/s wins"]


def test_throughput_below_the_baseline_pages_from_the_first_span(write):
    """A job at 40% of MindFormers' throughput_baseline is an ERROR as soon as its first span is judged:
    no rolling baseline to learn first."""
    cfg = load(write, "monitor_config: {monitor_on: True, step_interval: 1, throughput_baseline: 100, "
                      "alert: {baseline_steps: 0, rules: {throughput_drop: {consecutive: 1, min_seconds: 0}}}}\n")
    mon = Monitor(cfg, "mf-run", sinks=[])
    events = []
    for step in range(1, 6):
        events += mon.step(step, loss=2.0, throughput=None, samples=40, time=float(step))
    errors = [e for e in events if e.rule == "throughput_drop"]
    assert errors and errors[0].severity.value == "ERROR" and errors[0].step <= 3
    assert "below the expected 100 samples/s (throughput_baseline" in errors[0].message


def test_null_means_mindformers_default_where_mindformers_says_so(write):
    cfg = load(write, "monitor_config: {monitor_on: True, dump_path: null, invert: null, print_struct: null, "
                      "check_for_global_norm: null, target: null, local_norm_format: null}\n")
    assert cfg.alert == DEFAULT.alert and cfg.log_interval == DEFAULT.log_interval
    assert how(cfg, "monitor_config.check_for_global_norm") == ["off: MindFormers does not stop on the global norm"]
    assert how(cfg, "monitor_config.local_norm_format")[0].endswith(": no output")


def test_a_misspelt_switch_is_named_with_the_switch_it_is_close_to(write):
    cfg = load(write, "use_skip_data_by_globalnorm: True\nuse_parallel: True\nmonitor_config: {monitor_on: True}\n")
    assert cfg.alert.rules.grad_norm == DEFAULT.alert.rules.grad_norm
    assert how(cfg, "use_skip_data_by_globalnorm") == [
        "not acted on: not a MindFormers key (MindFormers warns that it is useless and ignores it); did you mean "
        "use_skip_data_by_global_norm?"]
    assert how(cfg, "use_parallel") == []  # MindFormers' other top-level keys are its business


def test_checkpoint_health_switch_turns_msmons_health_checkpoints_on(write):
    cfg = load(write, "use_checkpoint_health_monitor: True\nmonitor_config: {monitor_on: True}\n")
    assert cfg.checkpoint_ring.enable
    assert how(cfg, "use_checkpoint_health_monitor")[0].startswith("msmon keeps health checkpoints")
    own = load(write, "use_checkpoint_health_monitor: True\nmonitor_config: {monitor_on: True, "
                      "checkpoint_ring: {enable: False}}\n")
    assert not own.checkpoint_ring.enable
    assert how(own, "use_checkpoint_health_monitor") == ["msmon's own checkpoint_ring.enable (False) wins"]


def test_the_health_checkpoints_global_norm_threshold_is_the_grad_norm_error_level(write):
    cfg = load(write, "monitor_config: {monitor_on: True, health_checkpoint: {global_norm_spike_threshold: 5.0, "
                      "embedding_local_norm_threshold: 1.0}}\n")
    assert cfg.alert.rules.grad_norm.error == 5.0
    (says,) = how(cfg, "monitor_config.health_checkpoint")
    assert says.startswith("global_norm_spike_threshold 5 is msmon's grad_norm ERROR level")
    assert "embedding_local_norm_threshold: not acted on" in says
    own = load(write, "monitor_config: {monitor_on: True, health_checkpoint: {global_norm_spike_threshold: 5.0}, "
                      "alert: {rules: {grad_norm: {error: 9.0}}}}\n")
    assert own.alert.rules.grad_norm.error == 9.0 and "wins" in how(own, "monitor_config.health_checkpoint")[0]


@pytest.mark.parametrize(("value", "says"), [
    ("True", "MindFormers stops on a NaN/Inf loss or grad norm; msmon's nonfinite rule pages on the same sample"),
    ("False", "off in MindFormers; msmon's nonfinite rule still pages on a NaN/Inf loss or grad norm"),
])
def test_the_nan_switch_keeps_msmon_s_nonfinite_rule_on(write, value, says):
    cfg = load(write, f"check_for_nan_in_loss_and_grad: {value}\nmonitor_config: {{monitor_on: True}}\n")
    assert cfg.alert.rules.nonfinite.enable is True
    assert how(cfg, "check_for_nan_in_loss_and_grad") == [says]


def test_msmon_s_nonfinite_switch_wins_over_the_nan_switch(write):
    cfg = load(write, "check_for_nan_in_loss_and_grad: True\n"
                      "monitor_config: {monitor_on: True, alert: {rules: {nonfinite: {enable: False}}}}\n")
    assert cfg.alert.rules.nonfinite.enable is False
    assert how(cfg, "check_for_nan_in_loss_and_grad") == ["msmon's own alert.rules.nonfinite.enable false wins"]


def test_deprecated_spellings_are_taken_with_the_current_one_suggested(write):
    cfg = load(write, """\
        monitor_config:
          monitor_on: True
          check_for_global_norm: True
          global_norm_error_threshold: 4.0
          global_norm_record_path: ./abnormal.json
        """)
    assert cfg.alert.rules.grad_norm.error == 4.0
    assert how(cfg, "monitor_config.global_norm_error_threshold")[0].startswith("ERROR level of msmon's grad_norm")
    assert how(cfg, "monitor_config.global_norm_error_threshold")[1] == (
        "a deprecated MindFormers spelling: " + DEPRECATED["global_norm_error_threshold"])
    assert "renamed global_norm_spike_threshold" in DEPRECATED["global_norm_error_threshold"]
    assert how(cfg, "monitor_config.global_norm_record_path")[0].startswith(
        "a deprecated MindFormers spelling: removed in MindFormers 1.6")


def test_the_current_spelling_wins_over_the_deprecated_one(write):
    cfg = load(write, "monitor_config: {monitor_on: True, check_for_global_norm: True, "
                      "global_norm_spike_threshold: 2.0, global_norm_error_threshold: 9.0}\n")
    assert cfg.alert.rules.grad_norm.error == 2.0


# --- typos, bad values: did you mean, against both vocabularies ----------------------------------------------


@pytest.mark.parametrize(("typo", "hint"), [
    ("global_norm_spike_treshold", "global_norm_spike_threshold (a MindFormers key)"),
    ("check_for_global_nrom", "check_for_global_norm (a MindFormers key)"),
    ("local_los_format", "local_loss_format (a MindFormers key)"),
    ("log_intervall", "log_interval"),
])
def test_typos_get_did_you_mean_against_both_vocabularies(write, typo, hint):
    msg = error_of(write, f"monitor_config:\n  monitor_on: True\n  {typo}: 1\n")
    assert f"monitor_config.{typo}: unknown key; did you mean {hint}?  (train.yaml:3)" in msg


def test_an_unknown_key_lists_both_vocabularies(write):
    msg = error_of(write, "monitor_config: {zzz: 1}\n")
    assert "unknown key; valid keys here are actions, alert, bot, checkpoint_ring, csv" in msg
    assert "(msmon's) and check_for_global_norm, device_local_loss_format" in msg


@pytest.mark.parametrize(("text", "says"), [
    ("global_norm_spike_threshold: -1", "monitor_config.global_norm_spike_threshold: must be greater than 0"),
    ("global_norm_spike_count_threshold: 0", "monitor_config.global_norm_spike_count_threshold: must be at least 1"),
    ("throughput_baseline: 0", "monitor_config.throughput_baseline: must be greater than 0"),
    ("target: layers.0", "monitor_config.target: expected a list"),
    ("invert: maybe", "monitor_config.invert: expected true or false"),
    ("stable_rank_config: {step_interval: 0}", "monitor_config.stable_rank_config.step_interval: must be at least 1"),
    ("stable_rank_config: {formt: log}", "monitor_config.stable_rank_config.formt: unknown key; did you mean format?"),
    ("health_checkpoint: 3", "monitor_config.health_checkpoint: expected a mapping"),
])
def test_bad_mindformers_values_name_the_key(write, text, says):
    assert says in error_of(write, f"monitor_config:\n  monitor_on: True\n  {text}\n")


def test_bad_switch_names_the_top_level_key_and_line(write):
    msg = error_of(write, "use_skip_data_by_global_norm: yes please\nmonitor_config: {monitor_on: True}\n")
    assert "use_skip_data_by_global_norm: expected true or false, got 'yes please' (str)  (train.yaml:1)" in msg


# --- the PyNative trainer's monitor: section ------------------------------------------------------------------


def test_pynative_monitor_alone_switches_msmon_on_as_mindformers_monitor_is(write):
    cfg = load(write, """\
        monitor:
          train_state:
            local_norm: layers.0
            local_loss: True
          moe_monitor:
            save_tokens_per_expert_interval: 10
        """)
    assert cfg.monitor_on is True and cfg.log_interval == 1
    assert how(cfg, "monitor.train_state")[0] == (
        "no monitor_config: msmon monitors as MindFormers' PyNative monitor does, on (monitor_on: true)")
    assert how(cfg, "monitor.train_state.local_loss") == ["msmon's step loss (metrics: loss) stands for it"]
    assert how(cfg, "monitor.train_state.local_norm")[0].startswith("msmon does not compute per-parameter norms")
    assert how(cfg, "monitor.moe_monitor.save_tokens_per_expert_interval")[0].startswith("MoE expert load")


def test_pynative_monitor_with_nothing_on_leaves_msmon_off(write):
    cfg = load(write, "monitor:\n  train_state: {local_norm: '', local_loss: False}\n")
    assert cfg.monitor_on is False


def test_pynative_typo_gets_did_you_mean(write):
    msg = error_of(write, "monitor:\n  train_state:\n    local_los: True\n")
    assert "monitor.train_state.local_los: unknown key; did you mean local_loss?  (train.yaml:3)" in msg


# --- files in msmon's vocabulary alone, and the example --------------------------------------------------------


def test_a_file_in_msmon_s_vocabulary_alone_has_no_mindformers_record(write):
    cfg = load(write, "monitor_config: {monitor_on: True, step_interval: 10}\n")
    assert cfg.mindformers == ()


def test_a_standalone_section_may_carry_mindformers_keys(write):
    cfg = load(write, "monitor_on: True\ncheck_for_global_norm: True\nglobal_norm_spike_threshold: 5\n")
    assert cfg.alert.rules.grad_norm.error == 5.0


def test_the_example_covers_every_documented_key_and_loads_with_each_taken():
    cfg = load_config(ROOT / "config" / "mindformers_example.yaml")
    keys = {t.key.removeprefix("monitor_config.") for t in cfg.mindformers}
    documented = MINDFORMERS_KEYS - set(DEPRECATED) - {"max_attention_logit_format", "stable_rank_config",
                                                        "health_checkpoint"}  # not in the documented sample
    assert documented <= keys, documented - keys
    assert {"monitor_on", "step_interval", "check_for_nan_in_loss_and_grad", "tensorboard.tensorboard_dir"} <= keys
    assert cfg.alert.rules.grad_norm.error == 3.0 and cfg.actions[0].action == "save_checkpoint"
    assert cfg.tensorboard.log_dir == "worker/tensorboard"


def test_the_monitor_logs_the_record_at_start_up(write, caplog):
    caplog.set_level(logging.INFO, logger="msmon")
    mon = Monitor(write("train.yaml", "monitor_config: {monitor_on: True, target: ['attn']}\n"), "r", sinks=[])
    mon.close()
    assert "MindFormers monitor_config.target: ['attn'] -> not acted on: a per-parameter selection" in caplog.text


# --- msmon check-config --------------------------------------------------------------------------------------


def check_config(path: str, capsys) -> str:
    assert cli.run(argparse.Namespace(file=path)) == 0
    return capsys.readouterr().out


def test_check_config_prints_what_is_monitored_and_how_each_mindformers_key_was_taken(capsys):
    out = check_config(str(ROOT / "config" / "mindformers_example.yaml"), capsys)
    assert "  grad_norm: WARNING at 1.5, ERROR at 3, 1 sample(s) in a row" in out
    assert ("  MindFormers monitor_config.global_norm_spike_threshold: 3.0 -> ERROR level of msmon's grad_norm rule "
            "(3; WARNING at 1.5)") in out
    assert "  MindFormers monitor_config.weight_state_format: None -> not acted on: weight L2 norms" in out
    assert "MindFormers keys are taken as listed above (msmon's own keys win where both are set)." in out


def test_check_config_with_monitoring_off_still_says_how_the_keys_were_taken(write, capsys):
    out = check_config(write("train.yaml", "monitor_config: {target: ['attn']}\n"), capsys)
    assert "valid, but monitoring is OFF" in out
    assert "  MindFormers monitor_config.target: ['attn'] -> not acted on" in out


def test_the_runs_accumulation_total_and_warmup_steps_come_from_mindformers_keys(write):
    """Issue 37: runner_config.gradient_accumulation_steps and lr_schedule's total_steps / warmup_steps are msmon's
    training facts (the rules judge optimizer steps; lr_schedule warns of a warmup as long as the run); msmon's own
    keys win, and lr_schedule.total_steps -1 (computed from the epochs) is not a count."""
    cfg = load(write, "runner_config: {gradient_accumulation_steps: 4}\nlr_schedule: {total_steps: 2000, "
                      "warmup_steps: 2000}\nmonitor_config: {monitor_on: True}\n")
    t = cfg.training
    assert (t.grad_accumulation_steps, t.total_steps, t.warmup_steps) == (4, 2000, 2000)
    assert how(cfg, "runner_config.gradient_accumulation_steps") == ["msmon's training.grad_accumulation_steps: 4"]
    own = load(write, "runner_config: {gradient_accumulation_steps: 4}\nlr_schedule: {total_steps: -1}\n"
                      "monitor_config: {monitor_on: True, training: {grad_accumulation_steps: 1}}\n")
    assert own.training.grad_accumulation_steps == 1 and own.training.total_steps is None
    assert how(own, "runner_config.gradient_accumulation_steps") == [
        "msmon's own training.grad_accumulation_steps (1) wins"]
    assert how(own, "lr_schedule.total_steps")[0].startswith("not acted on: not a count")


def test_check_config_of_a_yaml_with_an_msmon_callbacks_entry_says_it_is_attached_there(write, capsys):
    out = check_config(write("train.yaml", "run_mode: train\nmonitor_config: {monitor_on: False, step_interval: 5}\n"
                                           "callbacks:\n  - {type: MFLossMonitor}\n"
                                           "  - {type: MsmonCallback, run_id: llama, log_interval: 0}\n"), capsys)
    assert "monitoring run llama: every 5 step(s)" in out  # the entry turns msmon on; step_interval is shared
    assert "Attached by the file's callbacks entry (type: MsmonCallback)" in out
    assert "monitor_config.monitor_on: False -> MindFormers' switch of its own TrainingStateMonitor" in out


def test_msmon_keys_in_a_mindformers_training_yaml_s_monitor_config_are_refused_as_mindformers_refuses_them(write):
    with pytest.raises(ConfigError, match=r"monitor_config.actions: MindFormers refuses this file \(KeyError: The "
                                          r"config 'monitor_config' gets an unexpected key: actions\)"):
        load(write, "run_mode: train\nmonitor_config:\n  monitor_on: true\n"
                    "  actions: [{rule: grad_norm, severity: ERROR, action: save_checkpoint}]\n")


def test_an_msmon_callbacks_entry_may_take_its_settings_from_a_standalone_file_which_its_own_keys_override(write):
    own = write("msmon.yaml", "monitor_config:\n  step_interval: 7\n  log_interval: 0\n"
                              "  bot: {url: 'http://127.0.0.1:9', token_env: MSMON_TOKEN}\n")
    cfg = load(write, f"run_mode: train\ncallbacks:\n  - {{type: MsmonCallback, config: '{own}', step_interval: 3}}\n")
    assert cfg.monitor_on and cfg.step_interval == 3 and cfg.log_interval == 0
    assert cfg.bot.url == "http://127.0.0.1:9"
    with pytest.raises(ConfigError, match=r"callbacks\[0\]\.config: expected the path"):
        load(write, "run_mode: train\ncallbacks:\n  - {type: MsmonCallback, config: 5}\n")
    with pytest.raises(ConfigError, match="nowhere.yaml"):
        load(write, "run_mode: train\ncallbacks:\n  - {type: MsmonCallback, config: /nowhere.yaml}\n")
