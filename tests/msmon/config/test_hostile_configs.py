"""Hostile configs fail clearly and fast: every one is a ConfigError naming the key and the line, never a
traceback, a RecursionError or a hang (bad encodings, deep nesting, alias bombs, huge files, absurd numbers,
broken URLs, shared tokens), and a fuzz property holds that nothing else ever comes out."""

from __future__ import annotations

import dataclasses
import os
import time
import typing

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bot.config import BotConfig as BotServiceConfig
from bot.config import load_bot_config
from notifier import ConfigError, load_config
from notifier.config import MonitorConfig
from tests.fakes.helpers import msmon

BASE = "monitor_config:\n  monitor_on: true\n"


def error_of(source) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(source)
    return str(info.value)


def bot_error_of(source) -> str:
    with pytest.raises(ConfigError) as info:
        load_bot_config(source)
    return str(info.value)


def write_bytes(tmp_path, name: str, data: bytes) -> str:
    p = tmp_path / name
    p.write_bytes(data)
    return os.fspath(p)


# --- encodings --------------------------------------------------------------------------------------------


def test_latin1_file_names_the_byte_and_line(tmp_path):
    path = write_bytes(tmp_path, "train.yaml", (BASE + "  bot:\n    project: caf\xe9\n").encode("latin-1"))
    msg = error_of(path)
    assert "not UTF-8 text" in msg
    assert "byte 0xe9 at byte 58" in msg and "train.yaml:4" in msg
    bom = write_bytes(tmp_path, "bom.yaml", b"\xef\xbb\xbf" + BASE.encode())  # UTF-8 with a BOM is fine
    assert load_config(bom).monitor_on is True


def test_utf16_file_says_so(tmp_path):
    path = write_bytes(tmp_path, "train.yaml", BASE.encode("utf-16"))
    assert "not UTF-8 text (found a UTF-16 BOM" in error_of(path)


def test_binary_file_says_where_the_binary_starts(tmp_path):
    path = write_bytes(tmp_path, "model.ckpt", b"monitor_config:\n\x00\x01\x02\xff\xfe" * 10)
    msg = error_of(path)
    assert "not UTF-8 text (binary: a NUL byte at byte 16)" in msg and "model.ckpt:2" in msg


def test_bot_config_in_latin1_is_a_config_error(tmp_path):
    path = write_bytes(tmp_path, "bot.yaml", "bot:\n  host: h\xf4te\n".encode("latin-1"))
    msg = bot_error_of(path)
    assert "invalid bot config" in msg and "not UTF-8 text" in msg and "bot.yaml:2" in msg


# --- sizes, nesting, aliases ------------------------------------------------------------------------------


def test_a_file_over_the_size_bound_is_refused_unread(tmp_path):
    path = write_bytes(tmp_path, "train.yaml", BASE.encode() + b"# " + b"x" * (2 << 20) + b"\n")
    t0 = time.perf_counter()
    msg = error_of(path)
    assert time.perf_counter() - t0 < 1.0
    assert "larger than 1 MiB" in msg


def test_a_fifo_is_refused_instead_of_blocking_on_open(tmp_path):
    fifo = tmp_path / "train.yaml"
    os.mkfifo(fifo)
    assert "not a regular file" in error_of(os.fspath(fifo))


def test_deep_flow_nesting_names_the_line(write):
    path = write("train.yaml", BASE + "model:\n  layers: " + "[" * 5000 + "]" * 5000 + "\n")
    msg = error_of(path)
    assert "nested more than 64 levels deep" in msg and "train.yaml:4" in msg


def test_deep_block_nesting_names_the_line(write):
    deep = "".join(" " * (2 * i) + f"k{i}:\n" for i in range(200)) + " " * 400 + "v: 1\n"
    msg = error_of(write("train.yaml", BASE + deep))
    assert "nested more than 64 levels deep" in msg and "train.yaml:" in msg


def test_deep_or_cyclic_mappings_given_in_code():
    deep: dict = {}
    node = deep
    for _ in range(5000):
        node["a"] = {}
        node = node["a"]
    assert "nested more than 64 levels deep" in error_of({"monitor_config": {"monitor_on": True}, "model": deep})
    loop: dict = {"x": 1}
    loop["self"] = loop
    assert "refers to itself" in error_of({"monitor_config": {"monitor_on": True}, "model": loop})


BILLION_LAUGHS = """\
a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""


def test_billion_laughs_anywhere_in_the_training_yaml_is_refused_in_under_a_second(write):
    path = write("train.yaml", "data:\n  lol:\n" + "".join("    " + line + "\n" for line in BILLION_LAUGHS.splitlines())
                 + BASE)
    t0 = time.perf_counter()
    msg = error_of(path)
    elapsed = time.perf_counter() - t0
    assert elapsed < 1.0, f"took {elapsed:.2f} s"
    assert "aliases expand to more than 50000 YAML nodes (an alias bomb?)" in msg and "train.yaml:" in msg


def test_billion_laughs_in_bot_yaml(write):
    msg = bot_error_of(write("bot.yaml", BILLION_LAUGHS + "bot: {}\n"))
    assert "expand to more than" in msg and "invalid bot config" in msg


def test_recursive_alias_is_refused(write):
    msg = error_of(write("train.yaml", BASE + "model: &m\n  layers: [*m]\n"))
    assert "refers to the node that contains it" in msg and "train.yaml:4" in msg


def test_include_fan_out_is_bounded(tmp_path):
    (tmp_path / "leaf.yaml").write_text("x: 1\n")
    for level in range(6):  # each file includes the one below ten times: 10**6 loads if unbounded
        below = "leaf.yaml" if level == 0 else f"l{level - 1}.yaml"
        (tmp_path / f"l{level}.yaml").write_text("".join(f"k{i}: !include {below}\n" for i in range(10)))
    (tmp_path / "train.yaml").write_text(BASE + "model: !include l5.yaml\n")
    t0 = time.perf_counter()
    msg = error_of(os.fspath(tmp_path / "train.yaml"))
    assert time.perf_counter() - t0 < 2.0
    assert "more than 64 files" in msg


def test_huge_integer_literal_is_a_short_config_error(write):
    msg = error_of(write("train.yaml", BASE + "  step_interval: 1" + "0" * 5000 + "\n"))
    assert "monitor_config.step_interval: an integer of 5001 digits" in msg and "train.yaml:3" in msg
    assert len(msg) < 400


def test_impossible_date_is_a_config_error(write):
    msg = error_of(write("train.yaml", BASE + "started: 2024-13-45\n"))
    assert "train.yaml:3" in msg and "month must be in 1..12" in msg


# --- a sane range on every numeric key --------------------------------------------------------------------


@pytest.mark.parametrize(("key", "value", "expected"), [
    ("bot.heartbeat_interval", "1e12", "monitor_config.bot.heartbeat_interval: must be at most 3600"),
    ("bot.heartbeat_interval", "1e-300", "monitor_config.bot.heartbeat_interval: must be at least 0.01"),
    ("bot.spool_max_mb", "1e308", "monitor_config.bot.spool_max_mb: must be at most 1e+06"),
    ("step_interval", "100000000", "monitor_config.step_interval: must be at most 1e+06"),
    ("alert.alert_interval", "1e15", "monitor_config.alert.alert_interval: must be at most 1e+09"),
    ("alert.rules.loss_spike.window", "100000000", "monitor_config.alert.rules.loss_spike.window: must be at most"),
    ("alert.rules.grad_norm_spike.warning", "1e300", "monitor_config.alert.rules.grad_norm_spike.warning: must be "
                                                     "at most"),
    ("actions", "[{rule: '*', action: pause, timeout: 1e12}]", "monitor_config.actions[0].timeout: must be at most"),
    ("training.target_loss", "-1e300", "monitor_config.training.target_loss: must be at least"),
])
def test_monitor_numbers_out_of_range_name_key_and_line(write, key, value, expected):
    *parents, leaf = key.split(".")
    text = BASE + "".join("  " * (i + 1) + f"{p}:\n" for i, p in enumerate(parents))
    text += "  " * (len(parents) + 1) + f"{leaf}: {value}\n"
    msg = error_of(write("train.yaml", text))
    assert expected in msg
    assert f"train.yaml:{text.count(chr(10))}" in msg


@pytest.mark.parametrize(("key", "value", "expected"), [
    ("window_samples", "1e8", "bot.window_samples: must be at most 100000"),
    ("max_runs", "1e9", "bot.max_runs: must be at most"),
    ("max_request_bytes", "1e15", "bot.max_request_bytes: must be at most"),
    ("rate_limit.per_channel", "1e-300", "bot.rate_limit.per_channel: must be at least 0.001"),
    ("rate_limit.global_rate", "1e300", "bot.rate_limit.global_rate: must be at most"),
    ("pipeline.repeat_interval", "1e300", "bot.pipeline.repeat_interval: must be at most"),
    ("pipeline.heartbeat_timeout", "1e-300", "bot.pipeline.heartbeat_timeout: must be at least"),
    ("commands.expire_after", "1e12", "bot.commands.expire_after: must be at most"),
    ("slack.max_retries", "1000000", "bot.slack.max_retries: must be at most"),
])
def test_bot_numbers_out_of_range_name_key_and_line(write, key, value, expected):
    *parents, leaf = key.split(".")
    text = "bot:\n" + "".join("  " * (i + 1) + f"{p}:\n" for i, p in enumerate(parents))
    text += "  " * (len(parents) + 1) + f"{leaf}: {value}\n"
    msg = bot_error_of(write("bot.yaml", text))
    assert expected in msg and f"bot.yaml:{text.count(chr(10))}" in msg


def test_window_memory_is_bounded_across_keys(write):
    msg = bot_error_of(write("bot.yaml", "bot:\n  window_samples: 100000\n  max_runs: 1000\n"))
    assert "bot.window_samples: with max_runs 1000, up to 100,000,000 samples per device" in msg
    assert "about 7 GB" in msg and "bot.yaml:2" in msg


def _numeric_fields(cls: type, path: str, seen: set[type]) -> typing.Iterator[tuple[str, type, str]]:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if not f.init or f.metadata.get("internal"):
            continue
        tp = hints[f.name]
        args = [a for a in typing.get_args(tp) if a is not type(None)] or [tp]
        inner = args[0] if len(args) == 1 else tp
        if typing.get_origin(inner) is list:
            inner = typing.get_args(inner)[0]
        if inner in (int, float):
            yield f"{path}.{f.name}", cls, f.name
        elif dataclasses.is_dataclass(inner) and inner not in seen:
            yield from _numeric_fields(inner, f"{path}.{f.name}", seen | {inner})


def test_every_numeric_key_has_a_lower_and_an_upper_bound():
    from msmon.config.validate import bounds_of

    keys = list(_numeric_fields(MonitorConfig, "monitor_config", set()))
    keys += list(_numeric_fields(BotServiceConfig, "bot", set()))
    assert len(keys) > 60
    unbounded = []
    for path, cls, name in keys:
        b = bounds_of(cls, name)
        if b.get("le") is None or (b.get("ge") is None and b.get("gt") is None):
            unbounded.append(path)
    assert unbounded == []


# --- URLs and tokens --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("url", "why"), [
    ("http://msmon bot:8080", "has a space"),
    ("msmon-bot:8080", "needs a scheme"),
    ("ftp://bob:s3cret@msmon-bot", "must start with http:// or https://, got 'ftp://***@msmon-bot'"),
    ("http://", "has no host"),
    ("http://msmon-bot:99999", "port"),
    ("http://msmon-bot:8080/\x07", "control character"),
    ("http://[::1", "cannot be read as a URL (Invalid IPv6 URL)"),
])
def test_bad_bot_url_names_the_key(write, url, why):
    text = BASE + f"  bot:\n    url: {yaml.safe_dump(url).splitlines()[0]}\n"
    msg = error_of(write("train.yaml", text))
    assert "monitor_config.bot.url:" in msg and why in msg and "train.yaml:4" in msg
    assert "s3cret" not in msg


def test_bad_slack_base_url_names_the_key_and_good_urls_load(write):
    msg = bot_error_of(write("bot.yaml", "bot:\n  slack:\n    base_url: localhost:9000/api\n"))
    assert "bot.slack.base_url:" in msg and "needs a scheme" in msg and "bot.yaml:3" in msg
    for url in ("http://msmon-bot:8080", "https://bot.example.org/msmon/", "http://127.0.0.1:1", "http://[::1]:80"):
        assert load_config({"monitor_config": {"bot": {"url": url}}}).bot.url == url
        assert load_bot_config({"bot": {"slack": {"base_url": url}}}).slack.base_url == url


def test_operator_token_equal_to_a_job_token_is_refused_without_printing_it(write, monkeypatch):
    monkeypatch.setenv("MSMON_H5_JOB", "s3cret-job-token")
    monkeypatch.setenv("MSMON_H5_OP", "s3cret-job-token")
    msg = bot_error_of(write("bot.yaml", "bot:\n  tokens:\n    - {project: llm, env: MSMON_H5_JOB}\n"
                             "  commands:\n    operators:\n      - {user: 'cli:bob', env: MSMON_H5_OP}\n"))
    assert "bot.commands.operators[0]" in msg and "same token as bot.tokens[0]" in msg and "bot.yaml:6" in msg
    assert "s3cret" not in msg


def test_operator_reading_the_job_tokens_variable_is_refused_even_when_unset(write, monkeypatch):
    monkeypatch.delenv("MSMON_H5_UNSET", raising=False)
    msg = bot_error_of(write("bot.yaml", "bot:\n  tokens:\n    - {project: llm, env: MSMON_H5_UNSET}\n"
                             "  commands:\n    operators:\n      - {user: 'cli:bob', env: MSMON_H5_UNSET}\n"))
    assert "bot.commands.operators[0]" in msg and "same token as bot.tokens[0]" in msg


def test_two_projects_sharing_a_token_is_refused(write, tmp_path, monkeypatch):
    secret = tmp_path / "token"
    secret.write_text("shared-s3cret\n")
    monkeypatch.setenv("MSMON_H5_A", "shared-s3cret")
    msg = bot_error_of(write("bot.yaml", f"bot:\n  tokens:\n    - {{project: llm, env: MSMON_H5_A}}\n"
                             f"    - {{project: vision, file: {secret}}}\n"))
    assert "bot.tokens[1]" in msg and "same token as bot.tokens[0] (project llm)" in msg and "bot.yaml:4" in msg
    assert "s3cret" not in msg
    monkeypatch.setenv("MSMON_H5_A", "a-token")  # distinct tokens load
    monkeypatch.setenv("MSMON_H5_B", "b-token")
    cfg = load_bot_config({"bot": {"tokens": [{"project": "llm", "env": "MSMON_H5_A"}],
                                   "commands": {"operators": [{"user": "cli:x", "env": "MSMON_H5_B"}]}}})
    assert len(cfg.tokens) == 1


# --- the command line: a ConfigError, exit 2, no traceback ------------------------------------------------


def test_check_config_on_a_binary_file_exits_2_without_traceback(tmp_path):
    path = write_bytes(tmp_path, "train.yaml", b"\x89PNG\r\n\x1a\n\x00\x00")
    p = msmon("check-config", path)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "not UTF-8 text" in p.stderr


def test_serve_with_a_hostile_config_exits_2_without_traceback(write):
    p = msmon("serve", "--config", write("bot.yaml", BILLION_LAUGHS + "bot:\n  window_samples: 1e8\n"))
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "expand to more than" in p.stderr


def test_serve_with_an_out_of_range_value_exits_2(write):
    p = msmon("serve", "--config", write("bot.yaml", "bot:\n  window_samples: 1e8\n"))
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "bot.window_samples: must be at most 100000" in p.stderr and "bot.yaml:2" in p.stderr


# --- fuzz: a config or a ConfigError, nothing else, and fast ----------------------------------------------

FUZZ = settings(max_examples=150, deadline=1000, suppress_health_check=[HealthCheck.too_slow])

_KEYS = st.sampled_from([
    "monitor_on", "step_interval", "log_interval", "metrics", "alert", "rules", "loss_spike", "window", "warning",
    "error", "consecutive", "phases", "name", "start_step", "end_step", "bot", "url", "spool_max_mb",
    "heartbeat_interval", "labels", "actions", "rule", "action", "factor", "timeout", "training", "total_steps",
    "target_loss", "monitor_config", "tokens", "env", "file", "project", "port", "window_samples", "rate_limit",
    "per_channel", "commands", "operators", "user", "routes", "receiver", "channel", "slack", "base_url", "x",
])
_SCALARS = (st.none() | st.booleans() | st.integers(min_value=-(10**30), max_value=10**30)
            | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20)
            | st.sampled_from(["*", "pause", "loss", "http://h:1", "ERROR", "1e12", "nan", "2024-13-45", "a\0b",
                              "<10**5000>", -(10**400), 1e308]))
_VALUES = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_KEYS, inner, max_size=5),
                       max_leaves=30)
_MAPPINGS = st.dictionaries(_KEYS, _VALUES, max_size=6)


def _hostile(value):
    """The drawn value with each "<10**5000>" made that integer (hypothesis cannot print one itself)."""
    if value == "<10**5000>":
        return 10**5000
    if isinstance(value, dict):
        return {k: _hostile(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_hostile(v) for v in value]
    return value


def _config_or_error(load, source) -> None:
    try:
        load(_hostile(source) if isinstance(source, dict) else source)
    except ConfigError as exc:
        assert str(exc)


@FUZZ
@given(data=st.binary(max_size=400) | st.text(max_size=300).map(str.encode))
def test_fuzz_arbitrary_bytes(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("fuzz") / "c.yaml"
    path.write_bytes(data)
    _config_or_error(load_config, os.fspath(path))
    _config_or_error(load_bot_config, os.fspath(path))


@FUZZ
@given(section=_MAPPINGS, wrap=st.booleans())
def test_fuzz_yamlish_monitor_mappings(tmp_path_factory, section, wrap):
    data = {"monitor_config": section} if wrap else section
    _config_or_error(load_config, data)
    _config_or_error(load_config, _as_file(tmp_path_factory, data))


@FUZZ
@given(section=_MAPPINGS | _VALUES)
def test_fuzz_yamlish_bot_mappings(tmp_path_factory, section):
    _config_or_error(load_bot_config, {"bot": section})
    _config_or_error(load_bot_config, _as_file(tmp_path_factory, {"bot": section}))


def _as_file(tmp_path_factory, data) -> str:
    path = tmp_path_factory.mktemp("fuzz") / "c.yaml"
    try:
        path.write_text(yaml.safe_dump(_hostile(data)))
    except ValueError:  # PyYAML cannot write 10**5000: write it by hand
        path.write_text("bot:\n  port: 1" + "0" * 5000 + "\nmonitor_config:\n  step_interval: -1" + "0" * 500 + "\n")
    return os.fspath(path)


_PIECES = st.sampled_from([
    "monitor_config:", "bot:", "\n", "\n  ", "\n    ", "- ", ": ", "[", "]", "{", "}", ", ", "&a ", "*a", "&b ", "*b",
    "<<: ", "!include ", "x.yaml", "!!binary ", "!!set ", "!!omap ", "!!float ", "!!int ", "!!str ", "? ", "'", '"',
    "step_interval", "alert", "rules", "loss_spike", "window", "1e8", "1e-300", "2024-13-45", "0x1F", "1:30",
    "null", "~", "true", "-", "#", "|", ">", "\t", "\\u0000", "é", "monitor_on", "url", "http://h:1", "tokens",
])


@FUZZ
@given(pieces=st.lists(_PIECES, max_size=40))
def test_fuzz_yamlish_text(tmp_path_factory, pieces):
    folder = tmp_path_factory.mktemp("fuzz")
    (folder / "x.yaml").write_text("monitor_on: true\n")
    path = folder / "train.yaml"
    path.write_text("".join(pieces))
    _config_or_error(load_config, os.fspath(path))
    _config_or_error(load_bot_config, os.fspath(path))
