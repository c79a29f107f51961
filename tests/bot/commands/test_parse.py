"""The one command language (bot/commands/parse.py): every verb and alias, round trips, golden errors, help."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bot.commands.parse import (
    COMMANDS,
    VERBS,
    CommandError,
    Parsed,
    format_duration,
    help_text,
    parse,
    parse_duration,
)
from msmon.contract.actions import ACTIONS, VERB_ACTION

P = Parsed
VALID: list[tuple[str, Parsed]] = [
    ("status run-42", P("status", run="run-42")),
    ("  STATUS   Run-42  ", P("status", run="Run-42")),
    ("/msmon status run-42", P("status", run="run-42")),
    ("msmon status run-42", P("status", run="run-42")),
    ("status `run-42`", P("status", run="run-42")),
    ("status “run-42”", P("status", run="run-42")),
    ("status\u00a0run-42", P("status", run="run-42")),
    ("status exp.7:a@b+c_d", P("status", run="exp.7:a@b+c_d")),
    ("runs", P("runs")),
    ("list", P("runs")),
    ("", P("help")),
    ("msmon", P("help")),
    ("pause run-42", P("pause", run="run-42")),
    ("resume run-42", P("resume", run="run-42")),
    ("unpause run-42", P("resume", run="run-42")),
    ("continue run-42", P("resume", run="run-42")),
    ("save-checkpoint run-42", P("save-checkpoint", run="run-42")),
    ("save_checkpoint run-42", P("save-checkpoint", run="run-42")),
    ("checkpoint run-42", P("save-checkpoint", run="run-42")),
    ("save run-42", P("save-checkpoint", run="run-42")),
    ("ckpt run-42", P("save-checkpoint", run="run-42")),
    ("loosen-threshold run-42 grad_norm 12.5", P("loosen-threshold", run="run-42", rule="grad_norm", value=12.5)),
    ("loosen-threshold run-42 grad_norm x1.5", P("loosen-threshold", run="run-42", rule="grad_norm", factor=1.5)),
    ("loosen run-42 Grad_Norm ×1.5", P("loosen-threshold", run="run-42", rule="grad_norm", factor=1.5)),
    ("threshold run-42 grad_norm *2", P("loosen-threshold", run="run-42", rule="grad_norm", factor=2.0)),
    ("loosen_threshold run-42 grad_norm X3 for 2h",
     P("loosen-threshold", run="run-42", rule="grad_norm", factor=3.0, duration=7200.0)),
    ("loosen run-42 loss_spike 4 FOR 1h30m",
     P("loosen-threshold", run="run-42", rule="loss_spike", value=4.0, duration=5400.0)),
    ("loosen run-42 loss_spike 4 1.5h",
     P("loosen-threshold", run="run-42", rule="loss_spike", value=4.0, duration=5400.0)),
    ("loosen run-42 loss_spike 1e-3", P("loosen-threshold", run="run-42", rule="loss_spike", value=0.001)),
    ("scale-lr run-42 0.5", P("scale-lr", run="run-42", factor=0.5)),
    ("scale_lr run-42 x0.5", P("scale-lr", run="run-42", factor=0.5)),
    ("lr run-42 100", P("scale-lr", run="run-42", factor=100.0)),
    ("stop run-42", P("stop", run="run-42")),
    ("stop run-42 CONFIRM", P("stop", run="run-42", confirmed=True)),
    ("ack run-42/loss_spike", P("ack", run="run-42", rule="loss_spike")),
    ("ack run-42/loss_spike/npu:3", P("ack", run="run-42", rule="loss_spike", device="npu:3")),
    ("acknowledge run-42 loss_spike 0", P("ack", run="run-42", rule="loss_spike", device="0")),
    ("silence run-42 30m", P("silence", run="run-42", duration=1800.0)),
    ("silence run-42 loss_spike 2d", P("silence", run="run-42", rule="loss_spike", duration=172800.0)),
    ("mute run-42 90s", P("silence", run="run-42", duration=90.0)),
    ("silence run-42 30d", P("silence", run="run-42", duration=2592000.0)),
    ("silence run-42 0.5s", P("silence", run="run-42", duration=0.5)),
    ("silence run-42 1h0.001s", P("silence", run="run-42", duration=3600.001)),
    ("help", P("help")),
    ("help pause", P("help", topic="pause")),
    ("help ckpt", P("help", topic="save-checkpoint")),
    ("Help Scale_LR", P("help", topic="scale-lr")),
]


@pytest.mark.parametrize(("text", "expected"), VALID, ids=[t or "<empty>" for t, _ in VALID])
def test_parse(text: str, expected: Parsed) -> None:
    assert parse(text) == expected


@pytest.mark.parametrize(("text", "expected"), VALID, ids=[t or "<empty>" for t, _ in VALID])
def test_round_trip(text: str, expected: Parsed) -> None:
    canonical = expected.text()
    assert parse(canonical) == expected
    assert parse(canonical).text() == canonical


@pytest.mark.parametrize(("parsed", "text"), [
    (P("loosen-threshold", run="r", rule="g", factor=1.5, duration=5400.0), "loosen-threshold r g x1.5 for 1h30m"),
    (P("loosen-threshold", run="r", rule="g", value=2.0), "loosen-threshold r g 2"),
    (P("scale-lr", run="r", factor=0.5), "scale-lr r 0.5"),
    (P("stop", run="r", confirmed=True), "stop r confirm"),
    (P("ack", run="r", rule="g", device="3"), "ack r/g/3"),
    (P("silence", run="r", rule="g", duration=90.5), "silence r g 1m30.5s"),
    (P("help", topic="pause"), "help pause"),
    (P("runs"), "runs"),
])
def test_canonical_text(parsed: Parsed, text: str) -> None:
    assert parsed.text() == text


U_PAUSE = "Usage: pause <run> (e.g. pause run-42)"
U_LOOSEN = ("Usage: loosen-threshold <run> <rule> <value|xFACTOR> [for <duration>] "
            "(e.g. loosen-threshold run-42 grad_norm x1.5 for 2h)")
U_SCALE = "Usage: scale-lr <run> <factor> (e.g. scale-lr run-42 0.5)"
U_SILENCE = "Usage: silence <run> [rule] <duration> (e.g. silence run-42 loss_spike 30m)"
U_ACK = "Usage: ack <run>/<rule>[/<device>] (e.g. ack run-42/loss_spike/npu3)"
ALERT = "is not an alert: use <run>/<rule> or <run>/<rule>/<device>"
ERRORS: list[tuple[str, str | None, str]] = [
    ("pasue run-42", None, f"unknown command 'pasue'; did you mean `pause`? {U_PAUSE}"),
    ("chekpoint run-42", None, "unknown command 'chekpoint'; did you mean `save-checkpoint`? "
                               "Usage: save-checkpoint <run> (e.g. save-checkpoint run-42)"),
    ("frobnicate", None, "unknown command 'frobnicate'. Commands: status, runs, pause, resume, save-checkpoint, "
                         "loosen-threshold, scale-lr, rewind, clip-grad, stop, ack, silence, help. Try `help`."),
    ("help pasue", "help", f"unknown command 'pasue'; did you mean `pause`? {U_PAUSE}"),
    ("pause", "pause", f"pause: missing <run>. {U_PAUSE}"),
    ("pause run-42 now", "pause", f"pause: unexpected extra argument 'now'. {U_PAUSE}"),
    ("runs all now", "runs", "runs: unexpected extra arguments 'all now'. Usage: runs (e.g. runs)"),
    ("loosen run-42", "loosen-threshold", f"loosen-threshold: missing <rule> <value|xFACTOR>. {U_LOOSEN}"),
    ("loosen run-42 g for 2h", "loosen-threshold", f"loosen-threshold: missing <value|xFACTOR>. {U_LOOSEN}"),
    ("loosen run-42 g 2 for", "loosen-threshold", f"loosen-threshold: missing <duration> after 'for'. {U_LOOSEN}"),
    ("loosen run-42 g 2 for 2h x", "loosen-threshold", f"loosen-threshold: unexpected extra argument 'x'. {U_LOOSEN}"),
    ("loosen run-42 g abc", "loosen-threshold", f"loosen-threshold: 'abc' is not a number. {U_LOOSEN}"),
    ("loosen run-42 g xabc", "loosen-threshold", f"loosen-threshold: 'xabc' is not a number. {U_LOOSEN}"),
    ("loosen run-42 g inf", "loosen-threshold", f"loosen-threshold: 'inf' is not a number. {U_LOOSEN}"),
    ("loosen run-42 g -1", "loosen-threshold", f"loosen-threshold: threshold must be > 0, got '-1'. {U_LOOSEN}"),
    ("loosen run-42 g x0", "loosen-threshold", f"loosen-threshold: factor must be > 0, got 'x0'. {U_LOOSEN}"),
    ("loosen run-42 1bad 2", "loosen-threshold", "loosen-threshold: '1bad' is not a rule name "
                                                 f"(letters, digits and _, not starting with a digit). {U_LOOSEN}"),
    ("scale-lr run-42", "scale-lr", f"scale-lr: missing <factor>. {U_SCALE}"),
    ("scale-lr run-42 abc", "scale-lr", f"scale-lr: 'abc' is not a number. {U_SCALE}"),
    ("scale-lr run-42 nan", "scale-lr", f"scale-lr: 'nan' is not a number. {U_SCALE}"),
    ("scale-lr run-42 0", "scale-lr", f"scale-lr: factor must be in (0, 100], got '0'. {U_SCALE}"),
    ("scale-lr run-42 100.5", "scale-lr", f"scale-lr: factor must be in (0, 100], got '100.5'. {U_SCALE}"),
    ("stop run-42 now", "stop", "stop: unexpected 'now'; to confirm, send `stop run-42 confirm`. "
                                "Usage: stop <run> [confirm] (e.g. stop run-42 confirm)"),
    ("status a/b", "status", "status: run ids have no '/': 'a/b'. Usage: status <run> (e.g. status run-42)"),
    ("status run#1", "status", "status: 'run#1' is not a run id (letters, digits and . _ : @ + -). "
                               "Usage: status <run> (e.g. status run-42)"),
    ("ack", "ack", f"ack: missing <run>/<rule>. {U_ACK}"),
    ("ack run-42", "ack", f"ack: 'run-42' {ALERT}. {U_ACK}"),
    ("ack run-42//npu3", "ack", f"ack: 'run-42//npu3' {ALERT}. {U_ACK}"),
    ("ack a/b/c/d", "ack", f"ack: 'a/b/c/d' {ALERT}. {U_ACK}"),
    ("silence run-42", "silence", f"silence: missing <duration>. {U_SILENCE}"),
    ("silence run-42 g 1h x", "silence", f"silence: unexpected extra argument 'x'. {U_SILENCE}"),
    ("silence run-42 90", "silence",
     f"silence: '90' needs a unit: s, m, h or d (e.g. 90s, 15m, 1h30m, 2d). {U_SILENCE}"),
    ("silence run-42 soon", "silence", f"silence: 'soon' is not a duration (e.g. 90s, 15m, 1h30m, 2d). {U_SILENCE}"),
    ("silence run-42 2w", "silence", f"silence: '2w' is not a duration (e.g. 90s, 15m, 1h30m, 2d). {U_SILENCE}"),
    ("silence run-42 0m", "silence", f"silence: duration '0m' must be longer than 0. {U_SILENCE}"),
    ("silence run-42 31d", "silence", f"silence: duration '31d' is longer than the 30-day maximum. {U_SILENCE}"),
    ("help pause now", "help", "help: unexpected extra argument 'now'. "
                               "Usage: help [command] (e.g. help loosen-threshold)"),
]


@pytest.mark.parametrize(("text", "verb", "message"), ERRORS, ids=[t for t, _, _ in ERRORS])
def test_errors(text: str, verb: str | None, message: str) -> None:
    with pytest.raises(CommandError) as info:
        parse(text)
    assert (str(info.value), info.value.verb) == (message, verb)


@pytest.mark.parametrize(("text", "seconds"), [
    ("90s", 90.0), ("15m", 900.0), ("1h", 3600.0), ("2d", 172800.0), ("1h30m", 5400.0), ("1.5h", 5400.0),
    (" 2H ", 7200.0), ("1hr", 3600.0), ("10min", 600.0), ("3hours", 10800.0), (".5m", 30.0),
    ("1d2h3m4s", 93784.0),
])
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds
    assert parse_duration(format_duration(seconds)) == seconds


@pytest.mark.parametrize("text", ["", "90", "1.5", "h", "1h30", "-5m", "1x", "1h 30m", "0s", "0.0001s", "30d1s"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(CommandError) as info:
        parse_duration(text)
    assert info.value.verb is None and f"'{text}'" in str(info.value)


def test_format_duration() -> None:
    assert [format_duration(s) for s in (90.0, 5400.0, 86400.0, 0.5, 93784.0)] == ["1m30s", "1h30m", "1d", "0.5s",
                                                                                   "1d2h3m4s"]


def test_tables_cover_every_verb() -> None:
    assert VERBS == ("status", "runs", "pause", "resume", "save-checkpoint", "loosen-threshold", "scale-lr", "rewind",
                     "clip-grad", "stop", "ack", "silence", "help")
    assert all(COMMANDS[v].usage.split()[0] == v and COMMANDS[v].summary and COMMANDS[v].example for v in VERBS)
    assert COMMANDS["loosen-threshold"].usage == "loosen-threshold <run> <rule> <value|xFACTOR> [for <duration>]"


def test_every_chat_action_is_a_verb_that_queues_it() -> None:
    """The job-action table (msmon/contract/actions.py) is where the job's verbs come from."""
    chat = {a.verb: a.name for a in ACTIONS.values() if a.chat}
    assert chat == VERB_ACTION
    assert set(chat) == {v for v in VERBS if COMMANDS[v].destructive}
    assert {"set-threshold", "restore-threshold"}.isdisjoint(VERBS)  # the job's own, not for chat


@pytest.mark.parametrize("verb", VERBS)
def test_destructive(verb: str) -> None:
    changes_job = verb in {"pause", "resume", "stop", "scale-lr", "loosen-threshold", "save-checkpoint", "rewind",
                           "clip-grad"}
    assert COMMANDS[verb].destructive == changes_job
    assert P(verb).destructive == changes_job


def test_help_lists_every_verb() -> None:
    lines = help_text().splitlines()
    for verb in VERBS:
        v = COMMANDS[verb]
        assert any(line.startswith(v.usage) and v.summary in line for line in lines), verb


def test_help_for_one_verb() -> None:
    assert help_text("ckpt") == ("save-checkpoint <run>\n  save a checkpoint now\n  e.g. save-checkpoint run-42\n"
                                 "  aliases: checkpoint, ckpt, save")
    assert help_text("stop").splitlines()[2] == "  e.g. stop run-42 confirm"
    with pytest.raises(CommandError, match="did you mean `silence`"):
        help_text("silense")


@pytest.mark.parametrize("verb", VERBS)
def test_every_help_example_parses(verb: str) -> None:
    example = help_text(verb).splitlines()[2].removeprefix("  e.g. ")
    assert parse(example).verb == verb


def test_every_verb_the_parser_knows_is_carried_out_by_the_service_and_each_action_param_is_a_parsed_field(
        tmp_path) -> None:  # noqa: ANN001
    """One action table drives both: a verb the parser accepts that the service has no handler for (or an action
    parameter the parser cannot fill) fails here, not in chat at 2 a.m."""
    import dataclasses

    from bot.commands.parse import Parsed
    from bot.commands.service import CommandService
    from bot.config import load_bot_config
    from bot.metrics import BotMetrics
    from bot.shared import BotState
    from bot.store.sqlite import Store

    cfg = load_bot_config({"bot": {"port": 0, "state_path": str(tmp_path / "s.sqlite")}})
    service = CommandService(BotState(cfg, Store(cfg.state_path), BotMetrics(), lambda: 1000.0))
    assert service.handled_verbs() == set(VERBS)
    fields = {f.name for f in dataclasses.fields(Parsed)}
    for action in VERB_ACTION.values():
        assert {p.name for p in ACTIONS[action].params} - {"timeout"} <= fields, action


@pytest.mark.parametrize(("text", "expected"), [
    ("rewind run-42", P("rewind", run="run-42")),
    ("rewind run-42 to 41,000", P("rewind", run="run-42", to=41000)),
    ("rewind run-42 before-alert skip 300", P("rewind", run="run-42", before=-1, skip=300)),
    ("Rewind run-42 skip 200 to 100", P("rewind", run="run-42", to=100, skip=200)),
    ("clip-grad run-42 1.5", P("clip-grad", run="run-42", max_norm=1.5)),
    ("clip_grad run-42 off", P("clip-grad", run="run-42", max_norm=0.0)),
])
def test_rewind_and_clip_grad(text: str, expected: Parsed) -> None:
    assert parse(text) == expected
    assert parse(expected.text()) == expected


@pytest.mark.parametrize(("text", "message"), [
    ("rewind run-42 to 5 before-alert", "not both"),
    ("rewind run-42 skip", "missing <N> after 'skip'"),
    ("rewind run-42 to -5", "whole number"),
    ("rewind run-42 sideways", "unexpected 'sideways'"),
    ("clip-grad run-42", "missing <max_norm|off>"),
    ("clip-grad run-42 -1", "max_norm must be"),
])
def test_rewind_and_clip_grad_errors(text: str, message: str) -> None:
    with pytest.raises(CommandError, match=re.escape(message)):
        parse(text)


_ARG = (st.sampled_from(["to", "skip", "before", "before-alert", "off", "none", "0", "-5", "1e-50", "1e-38", "1e-40",
                         "1e12", "1e13", "1000000000000", "2147483647", "2147483648", "300", "1,000", "1_0", "nan",
                         "inf", "-0", "abc", "x2", "٣", "1.5", "+3"])
        | st.text(max_size=10))


@settings(max_examples=600, deadline=None)
@given(verb=st.sampled_from(sorted(VERB_ACTION)), args=st.lists(_ARG, max_size=5))
def test_any_job_command_text_parses_to_params_every_rank_takes_or_is_refused(verb, args):
    """issue 36: whatever follows a job verb, the parser refuses it (CommandError, the user's answer) or gives
    parameters the action table takes (check_params: what each rank checks again)."""
    from msmon.contract.actions import check_params

    try:
        p = parse(" ".join([verb, "run-1", *args]))
    except CommandError as exc:
        assert str(exc) and exc.verb == verb
        return
    action = VERB_ACTION[p.verb]
    params = {x.name: getattr(p, x.name) for x in ACTIONS[action].params if getattr(p, x.name, None) is not None}
    assert check_params(action, params) == params
    assert parse(p.text()) == p


def test_clip_grad_and_rewind_refuse_what_no_rank_could_honour():
    for text, why in (("clip-grad r 1e-50", "positive normal float32"), ("clip-grad r 1e-40", "positive normal"),
                      ("rewind r skip 1000000000000", "skip must be a whole number of batches in [0, 2,147,483,647]"),
                      ("clip-grad r -1", "max_norm must be"), ("clip-grad r abc", "not a number")):
        with pytest.raises(CommandError, match=re.escape(why)):
            parse(text)
    assert parse("clip-grad r 1.2e-38").max_norm == 1.2e-38 and parse("rewind r skip 2147483647").skip == 2**31 - 1


def test_the_guarded_verbs_in_bot_yaml_are_every_verb_that_changes_a_job():
    """issue 36: docs/reference/bot-yaml.md listed commands.allow's verbs without rewind and clip-grad. The page's
    list is bot.config.GUARDED_VERBS, made from the action table (tests/project/test_config_reference.py checks the
    page is what the code writes)."""
    from bot.config import GUARDED_VERBS, Permission

    assert set(GUARDED_VERBS) == {v for v, verb in COMMANDS.items() if verb.destructive}
    assert {"rewind", "clip-grad", "stop", "pause"} <= set(GUARDED_VERBS) and "status" not in GUARDED_VERBS
    assert all(v in (Permission.__doc__ or "") for v in GUARDED_VERBS)
