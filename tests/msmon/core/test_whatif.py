"""What a threshold change would have done: the pure effect function, the job's answer and its level-change file."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest

from msmon.contract.wire import Sample
from msmon.core.detectors.grad_norm import GradNormParams
from msmon.core.gate import AlertGate
from msmon.core.whatif import Alerts, Effect, LevelChange, combine, effect, levels_text
from notifier.control import JobControl
from notifier.levels_effect import levels_path, read_level_changes
from notifier.monitor import Monitor


def sample(step: int, grad_norm: float) -> Sample:
    return Sample(run_id="r", device="0", step=step, time=float(step), grad_norm=grad_norm)


def spiky(n: int = 120, every: int = 10, high: float = 12.0) -> list[Sample]:
    """Grad norm 1, with two samples in a row at `high` every `every` samples (an episode each)."""
    return [sample(s, high if s % every in (0, 1) else 1.0) for s in range(1, n + 1)]


def test_effect_counts_episodes_at_the_old_and_the_new_levels() -> None:
    old, new = GradNormParams(error=10.0), GradNormParams(error=30.0)
    e = effect(spiky(), "grad_norm", old, new)
    assert (e.samples, e.first_step, e.last_step) == (120, 1, 120)
    assert e.old == Alerts(11, 11) and e.new == Alerts(0, 0)  # 11 pairs over 10 (and single ones); none over 15
    assert e.describe() == ("over the last 120 samples (steps 1-120): 0 alerts at 15 / 30 instead of 11 alerts "
                            "(11 ERROR) at 5 / 10")
    assert e.to_dict()["old"] == {"total": 11, "errors": 11}
    half = effect(spiky(), "grad_norm", old, GradNormParams(error=15.0))  # 12 is over the new WARNING level 7.5
    assert half.new == Alerts(11, 0) and "11 alerts at 7.5 / 15 instead of" in half.describe()


def test_a_warning_that_rises_to_error_is_one_episode_one_error() -> None:
    rows = [sample(s, 1.0) for s in range(1, 11)] + [sample(11, 6.0), sample(12, 6.0), sample(13, 11.0),
                                                     sample(14, 11.0)]
    e = effect(rows, "grad_norm", GradNormParams(error=10.0), GradNormParams(error=10.0))
    assert e.old == e.new == Alerts(1, 1)


def test_the_runs_gate_applies_baseline_and_consecutive() -> None:
    p = GradNormParams(error=10.0, consecutive=3)  # pairs never make three in a row
    assert effect(spiky(), "grad_norm", p, p).old == Alerts()
    gated = AlertGate(alert_interval=0, baseline_steps=1000, resolve_after=3)  # absolute levels pass the baseline
    assert effect(spiky(), "grad_norm", GradNormParams(error=10.0), GradNormParams(error=10.0), gate=gated).old.total


def test_no_samples_and_combining_devices() -> None:
    p = GradNormParams(error=10.0)
    none = effect([], "grad_norm", p, p)
    assert none.describe() == "no recent samples to judge the change on"
    one = effect([sample(7, 12.0)], "grad_norm", p, p)
    assert one.describe() == "over the last 1 sample (step 7): 0 alerts at 5 / 10 instead of 0 alerts at 5 / 10"
    both = combine([effect(spiky(), "grad_norm", p, GradNormParams(error=30.0)), none])
    assert both is not None and (both.samples, both.old, both.first_step, both.last_step) == (120, Alerts(11, 11), 1,
                                                                                               120)
    assert combine([]) is None
    assert levels_text((None, None)) == "off" and levels_text((None, 3.0)) == "3" and levels_text((2.0, 2.0)) == "2"


def test_level_change_round_trip_and_refusals() -> None:
    c = LevelChange(step=40, rule="grad_norm", warning=None, error=15.0, old_error=10.0, action="set_threshold")
    assert LevelChange.from_dict(json.loads(json.dumps(c.to_dict()))) == c
    for bad, msg in (({"rule": "grad_norm"}, "missing key 'step'"), ({"step": 1, "rule": "nope"}, "unknown rule"),
                     ({"step": -1, "rule": "grad_norm"}, "step must be"), ({"step": 1, "rule": "grad_norm",
                      "colour": 1}, "unknown key 'colour'"), ({"step": 1, "rule": "grad_norm", "error": "x"},
                                                              "error must be a number")):
        with pytest.raises(ValueError, match=msg):
            LevelChange.from_dict(bad, "f.jsonl:3")


def monitor(tmp_path: Path) -> Monitor:
    cfg = {"monitor_config": {"monitor_on": True, "step_interval": 1, "log_interval": 0,
                              "csv": {"enable": True, "path": str(tmp_path / "{run_id}.csv")},
                              "alert": {"baseline_steps": 0, "alert_interval": 0, "grad_norm_threshold": 10.0}}}
    return Monitor(cfg, "run-42")


def test_a_live_change_is_answered_with_its_effect_and_written_next_to_the_csv(tmp_path: Path) -> None:
    mon = monitor(tmp_path)
    try:
        for s in spiky(100):
            mon.step(s.step, grad_norm=s.grad_norm, loss=1.0, time=float(s.step))
        control = JobControl(mon)
        control.request("loosen_threshold", source="chat", rule="grad_norm", value=30.0)
        (res,) = control.apply(100)
        assert res.ok, res.detail
        assert res.detail == ("grad_norm WARNING 5 -> 15, ERROR 10 -> 30; over the last 100 samples (steps 1-100): "
                              "0 alerts at 15 / 30 instead of 9 alerts (9 ERROR) at 5 / 10")
        control.request("set_threshold", rule="grad_norm", value=11.0, level="error")
        (res,) = control.apply(101)
        assert res.detail == ("grad_norm error level 30.0 -> 11; over the last 100 samples (steps 1-100): 9 alerts "
                              "(9 ERROR) at 5.5 / 11 instead of 0 alerts at 15 / 30")  # WARNING: half the ERROR
    finally:
        mon.close()
    path = levels_path(mon)
    assert path == str(tmp_path / "run-42.levels.jsonl")
    changes = read_level_changes(path)
    assert [(c.step, c.action, c.old_error, c.error) for c in changes] == [
        (100, "loosen_threshold", 10.0, 30.0), (101, "set_threshold", 30.0, 11.0)]
    assert changes[0].effect.startswith("over the last 100 samples")


def test_the_end_of_a_timed_loosening_says_its_effect_too(tmp_path: Path) -> None:
    mon = monitor(tmp_path)
    try:
        for s in spiky(100):
            mon.step(s.step, grad_norm=s.grad_norm, loss=1.0, time=float(s.step))
        control = JobControl(mon)
        control.request("loosen_threshold", rule="grad_norm", factor=3.0, duration=0.05, undo="c7")
        control.apply(100)
        deadline = time.monotonic() + 5.0
        while not control.has_pending and time.monotonic() < deadline:
            time.sleep(0.01)
        (res,) = control.apply(101)
        assert res.action == "restore_threshold" and res.detail == (
            "grad_norm levels restored; over the last 100 samples (steps 1-100): 9 alerts (9 ERROR) at 5 / 10 instead "
            "of 0 alerts at 15 / 30")
    finally:
        mon.close()
    assert [c.action for c in read_level_changes(str(tmp_path / "run-42.levels.jsonl"))] == [
        "loosen_threshold", "restore_threshold"]


def test_a_change_of_an_unknown_rule_fails_as_before(tmp_path: Path) -> None:
    mon = monitor(tmp_path)
    control = JobControl(mon)
    control.request("set_threshold", rule="grad_nrom", value=3.0)
    (res,) = control.apply(1)
    mon.close()
    assert not res.ok and res.detail == "ValueError: unknown rule 'grad_nrom'; did you mean grad_norm?"
    assert not (tmp_path / "run-42.levels.jsonl").exists()


def test_read_level_changes_names_the_line(tmp_path: Path) -> None:
    f = tmp_path / "x.levels.jsonl"
    f.write_text('{"step": 5, "rule": "grad_norm", "error": 3}\n\n[1]\n')
    with pytest.raises(ValueError, match=r"x\.levels\.jsonl:3: a level change is a JSON object"):
        read_level_changes(str(f))
    f.write_text("{nope\n")
    with pytest.raises(ValueError, match=r":1: not JSON"):
        read_level_changes(str(f))


def test_effect_is_frozen_data() -> None:
    e = Effect("grad_norm", 0, None, None, (None, None), (None, None), Alerts(), Alerts())
    with pytest.raises(dataclasses.FrozenInstanceError):
        e.samples = 3  # type: ignore[misc]


# -- the bot keeps each change with its run and shows it in status -------------------------------------------------


def test_the_bot_keeps_level_changes_and_status_shows_them(tmp_path: Path) -> None:
    from bot.commands.origin import Origin
    from bot.commands.service import CommandService
    from bot.config import load_bot_config
    from bot.ingest.envelope import Ingest
    from bot.metrics import BotMetrics
    from bot.shared import BotState
    from bot.store.sqlite import Store
    from msmon.contract.wire import ActionResult, Envelope

    cfg = load_bot_config({"bot": {"port": 0, "state_path": str(tmp_path / "s.sqlite"), "commands": {
        "allow": [{"project": "default", "users": ["cli:carol"]}]}}})
    state = BotState(cfg, Store(cfg.state_path), BotMetrics(), lambda: 1000.0)
    ingest, service = Ingest(state), CommandService(state)
    ingest.envelope(Envelope(run_id="r", device="0", sent_at=0.0, samples=[sample(100, 1.0)]))
    carol = Origin(source="cli", user="cli:carol")
    answer = service.submit("loosen-threshold r grad_norm 30", carol)
    assert answer.ok, answer.text
    (cmd,) = state.store.commands.open_for("r")
    effect_text = "over the last 100 samples (steps 1-100): 0 alerts at 15 / 30 instead of 9 alerts (9 ERROR) at 5 / 10"
    ingest.envelope(Envelope(run_id="r", device="0", sent_at=0.0, actions=[
        ActionResult(run_id="r", device="0", step=cmd["apply_step"], time=1000.0, action="loosen_threshold", ok=True,
                     detail=f"grad_norm WARNING 5 -> 15, ERROR 10 -> 30; {effect_text}",
                     params={"rule": "grad_norm", "value": 30.0}, source=f"command {cmd['id']}",
                     command_id=cmd["id"]),
        ActionResult(run_id="r", device="0", step=150, time=1001.0, action="set_threshold", ok=True,
                     detail="grad_norm error level 30.0 -> 40; over the last 100 samples (steps 51-150): 0 alerts at "
                            "20 / 40 instead of 0 alerts at 15 / 30", params={"rule": "grad_norm", "value": 40.0},
                     source="code")]))
    (row_code, row_cmd) = state.store.commands.level_changes("r")
    assert (row_cmd["who"], row_cmd["why"], row_cmd["rule"]) == ("cli:carol", "loosen-threshold r grad_norm 30",
                                                                 "grad_norm")
    assert (row_code["who"], row_code["step"]) == ("code", 150)
    text = service.submit("status r", carol).text
    assert "level change at step 150 by code (`code`): grad_norm error level 30.0 -> 40; over the last 100" in text
    assert (f"level change at step {cmd['apply_step']:,} by cli:carol (`loosen-threshold r grad_norm 30`): grad_norm "
            f"WARNING 5 -> 15, ERROR 10 -> 30; {effect_text}") in text
    state.store.close()
