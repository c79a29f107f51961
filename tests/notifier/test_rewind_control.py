"""JobControl's rewind and clip-grad (notifier/control/) with a pure-Python backend: which checkpoint, what the
answer says, refusals that change nothing, the budget's escalation, a rewind asked in an abandoned attempt, and the
monitor's state: after a rewind its rules raise the same alerts as a run that never went past the checkpoint.
The dispatch table is checked against the one action table. Real MindSpore: tests/notifier/mindspore/test_rewind.py."""

from __future__ import annotations

import json
import math
import os
import random
from pathlib import Path
from typing import Any

import pytest

from msmon.contract.actions import ACTIONS
from msmon.contract.wire import Command
from notifier import Monitor
from notifier.control import HANDLERS, ORDER_ACTIONS, ActionError, JobControl
from tests.fakes.helpers import FakeClock, config, healthy


class ToyBackend:
    """A "model" of one number and a data cursor: what a RewindBackend does, with files in `tmp`."""

    def __init__(self) -> None:
        self.weight = 0.0
        self.data = 0  # batches read
        self.clip = 0.0
        self.loads = 0
        self.fail_restore = False
        self.saved: list[str] = []

    def save_checkpoint(self, step: int, name: str, directory: str | None = None) -> str:
        path = os.path.join(directory or ".", f"{name}.json")
        with open(path, "w") as f:
            json.dump({"weight": self.weight, "step": step}, f)
        self.saved.append(path)
        return path

    def read_checkpoint(self, path: str) -> dict[str, Any]:
        try:
            with open(path) as f:
                return dict(json.load(f))
        except (OSError, ValueError) as exc:
            raise ActionError(f"{path} does not load: {exc}") from exc

    def restore(self, loaded: dict[str, Any]) -> str:
        if self.fail_restore:
            raise RuntimeError("device lost half-way")
        self.weight = loaded["weight"]
        self.loads += 1
        return "weight restored"

    def data_position(self, run_context: Any) -> int:
        return self.data

    def seek_data(self, position: int, run_context: Any) -> str:
        self.data = position
        return f"data at {position}"

    def delete_checkpoint(self, path: str) -> None:
        os.remove(path)

    def clip_grad(self, max_norm: float) -> str:
        self.clip = max_norm
        return f"clip {max_norm:g}"

    def scale_lr(self, factor: float) -> str:
        return "lr"

    def stop(self, run_context: Any) -> None:
        self.stopped = True


def test_every_action_has_a_handler_or_is_the_order_s_own():
    assert set(HANDLERS) | set(ORDER_ACTIONS) == set(ACTIONS)
    assert not set(HANDLERS) & set(ORDER_ACTIONS)
    assert "rewind" in HANDLERS and "clip_grad" in HANDLERS


class Job:
    """A Monitor, a JobControl with the toy backend, a fake clock; `train(n)` runs n healthy steps (`bad` makes the
    loss explode), each step's metrics from a seeded generator of its own."""

    def __init__(self, tmp: Path, **over: Any) -> None:
        over.setdefault("checkpoint_ring", {"enable": True, "every_steps": 50, "keep": 4,
                                            "dir": str(tmp / "ring"), "confirm_steps": 30, "suspect_steps": 10})
        over.setdefault("metrics", ["loss", "learning_rate", "grad_norm"])
        self.clock = FakeClock()
        self.mon = Monitor(config(**over), run_id="toy")
        self.backend = ToyBackend()
        self.ctl = JobControl(self.mon, self.backend, clock=self.clock)
        self.step = 0
        self.results: list[Any] = []
        self.ctl.on_result = self.results.append
        self.events: list[Any] = []

    def train(self, n: int, bad: bool = False) -> None:
        for _ in range(n):
            self.step += 1
            self.backend.data += 1
            self.backend.weight += 1.0
            self.clock.advance(1.0)
            m = healthy(self.step, random.Random(self.step))
            if bad:
                m["loss"] *= 50.0
                m["grad_norm"] *= 50.0
            evs = self.mon.step(self.step, loss=m["loss"], lr=m["lr"], grad_norm=m["grad_norm"],
                                time=self.clock.t)
            self.events += evs
            for e in evs:
                self.ctl.take_event(e)
            self.ctl.step_end(self.step)
            if self.ctl.has_pending:
                self.ctl.apply(self.step)
            rewound_to = self.ctl.take_rewound_to()
            if rewound_to is not None:
                self.step = rewound_to
                return  # the trouble (`bad`) was in the batches skipped


def test_a_rule_rewinds_to_the_newest_healthy_checkpoint_before_the_alert_and_skips(tmp_path):
    job = Job(tmp_path, actions=[{"rule": "loss_spike", "severity": "ERROR", "action": "rewind", "skip": 40}],
              alert={"baseline_steps": 100, "rules": {"loss_spike": {"consecutive": 1}}})
    job.train(310)
    assert job.ctl.attempt == 0
    job.train(5, bad=True)
    r = next(r for r in job.results if r.action == "rewind")
    assert r.ok and r.applied and r.source == "rule loss_spike ERROR", r.detail
    assert "rewound from step 311 to the checkpoint of step 300" in r.detail
    assert "batches 300-339 skipped (40, never read again)" in r.detail
    assert "closed as rewound: loss_spike" in r.detail
    assert job.ctl.attempt == 1 and job.backend.data == 340 and job.backend.weight == 300.0
    assert r.path.endswith("-a0-step300.json")
    assert all(e.step <= 300 for e in job.ctl.ring.entries)


def test_an_operators_rewind_before_any_healthy_checkpoint_is_refused_and_changes_nothing(tmp_path):
    job = Job(tmp_path)
    job.train(60)  # the checkpoint of step 50 is still pending
    job.ctl.request("rewind", "command c1 from @ops")
    job.train(1)
    r = job.results[-1]
    assert not r.ok and "no healthy checkpoint" in r.detail and "50 pending" in r.detail, r.detail
    assert "Nothing was changed" in r.detail
    assert job.backend.loads == 0 and job.ctl.attempt == 0 and job.step == 61


def test_without_a_ring_the_answer_says_how_to_get_one(tmp_path):
    job = Job(tmp_path, checkpoint_ring={"enable": False})
    job.train(3)
    job.ctl.request("rewind", "command c1 from @ops")
    job.train(1)
    assert not job.results[-1].ok and "checkpoint_ring.enable: true" in job.results[-1].detail


def test_to_a_step_and_forward_is_refused(tmp_path):
    job = Job(tmp_path)
    job.train(200)
    job.ctl.request("rewind", "command c1 from @ops", to=120)
    job.train(1)
    assert job.results[-1].ok and "to the checkpoint of step 100" in job.results[-1].detail
    job.ctl.request("rewind", "command c2 from @ops", to=10_000)
    job.train(1)
    assert not job.results[-1].ok and "cannot rewind forward" in job.results[-1].detail


def test_a_damaged_checkpoint_is_refused_before_anything_moves(tmp_path):
    job = Job(tmp_path)
    job.train(200)
    good = job.ctl.ring.choose()
    Path(good.path).write_text("{not json")
    data = job.backend.data
    job.ctl.request("rewind", "command c1 from @ops", skip=5)
    job.train(1)
    assert not job.results[-1].ok and "does not load" in job.results[-1].detail
    assert job.backend.data == data + 1 and job.ctl.attempt == 0


def test_a_load_failing_half_way_stops_the_job_rather_than_train_on_it(tmp_path):
    job = Job(tmp_path)
    job.train(200)
    job.backend.fail_restore = True
    job.ctl.request("rewind", "command c1 from @ops")
    job.train(1)
    r = job.results[-1]
    assert not r.ok and "half-way" in r.detail and job.ctl.stop_requested and job.backend.stopped


def test_the_budget_escalates_a_rules_rewind_to_a_pause(tmp_path):
    job = Job(tmp_path, rewind={"max_rewinds": 1, "min_steps_between": 0})
    job.train(200)
    job.ctl.request("rewind", "rule loss_spike ERROR")
    job.train(1)
    assert job.results[-1].ok
    job.train(100)
    job.ctl.request("rewind", "rule loss_spike ERROR")
    job.ctl.pause_timeout = 0.0  # the escalation's pause ends at once here
    job.train(2)
    refused = next(r for r in job.results if r.action == "rewind" and not r.ok)
    assert "rewind refused: the run made its 1 rewinds" in refused.detail and "pause queued" in refused.detail
    assert any(r.action == "pause" and r.applied for r in job.results)
    # a person may still rewind, and the answer says it is over the budget
    job.ctl.request("rewind", "command c9 from @ops")
    job.train(1)
    assert job.results[-1].ok and "over the budget" in job.results[-1].detail


def test_a_rewind_asked_in_an_attempt_already_rewound_is_moot(tmp_path):
    job = Job(tmp_path)
    job.train(200)
    job.ctl.request("rewind", "command c1 from rule loss_spike on rank 1", before=190, alert="loss_spike", attempt=0)
    job.ctl.request("rewind", "command c2 from rule loss_spike on rank 0", before=192, alert="loss_spike", attempt=0)
    job.train(1)
    first, second = [r for r in job.results if r.action == "rewind"]
    assert first.applied and not second.applied and second.ok and "attempt 0" in second.detail
    assert job.ctl.attempt == 1


def test_the_follow_up_compares_the_loss_with_the_pre_fault_curve(tmp_path):
    job = Job(tmp_path, rewind={"report_after": 40})
    job.train(250)
    job.train(3, bad=True)
    job.ctl.request("rewind", "command c1 from @ops", before=250)
    job.train(1)
    job.train(45)
    follow = [r for r in job.results if r.action == "rewind" and "steps after the rewind" in r.detail]
    assert follow and "back on the pre-fault curve" in follow[0].detail, follow
    assert follow[0].source.startswith("follow-up of rewind") and follow[0].step == 240


def test_clip_grad(tmp_path):
    job = Job(tmp_path)
    job.train(2)
    job.ctl.request("clip_grad", "command c1 from @ops", max_norm=1.5)
    job.ctl.request("clip_grad", "command c2 from @ops", max_norm=-1)
    job.ctl.request("clip_grad", "command c3 from @ops", max_norm=1e-50)  # 0 in a float32: clipping off
    job.ctl.request("clip_grad", "command c4 from @ops", max_norm="abc")
    job.train(1)
    ok, *bad = job.results[-4:]
    assert ok.ok and job.backend.clip == 1.5, ok
    assert all(not b.ok and not b.applied and "max_norm must be 0 (no clipping) or a number" in b.detail
               and "nothing was changed" in b.detail for b in bad), bad


def test_after_a_rewind_the_rules_raise_what_a_run_that_never_went_past_the_checkpoint_raises(tmp_path):
    """The monitor's state saved with the checkpoint comes back with it: same alerts, same steps."""
    over = {"alert": {"baseline_steps": 50, "rules": {"loss_spike": {"consecutive": 1}}}}

    def tail(job: Job) -> list[tuple[int, str, str, str]]:
        start = len(job.events)
        job.train(150)
        for s in range(3):  # a spike the rules must see the same way in both runs
            job.train(1, bad=s < 2)
        job.train(60)
        return [(e.step, e.rule, e.severity.value, e.status.value) for e in job.events[start:]]

    straight = Job(tmp_path / "a", **over)
    straight.train(200)
    expected = tail(straight)

    rewound = Job(tmp_path / "b", **over)
    rewound.train(230)
    rewound.train(10, bad=True)  # the trouble, then back to step 200
    rewound.ctl.request("rewind", "command c1 from @ops", to=200)
    rewound.train(1)  # the boundary where the rewind applies: this step is redone
    assert rewound.ctl.attempt == 1 and rewound.step == 200, [r.detail for r in rewound.results]
    got = tail(rewound)
    assert expected and got == expected
    assert any(rule == "loss_spike" for _, rule, _, _ in expected)
    assert math.isfinite(rewound.backend.weight)


@pytest.mark.parametrize("bad", ["x", -3, 1.5, True, [1]])
def test_a_step_parameter_that_is_no_step_is_refused(tmp_path, bad):
    job = Job(tmp_path)
    job.train(120)
    job.ctl.request("rewind", "command c1 from @ops", to=bad)
    job.train(1)
    assert not job.results[-1].ok and "step number" in job.results[-1].detail or "whole number" in \
        job.results[-1].detail


def test_a_commands_follow_up_names_the_command_for_the_bot(tmp_path):
    job = Job(tmp_path, rewind={"report_after": 20})
    job.train(200)
    job.ctl.take_commands([Command(id="c7", run_id="toy", action="rewind", params={"skip": 5}, apply_step=201,
                                   issued_by="@ops")])
    job.train(1)
    job.train(25)
    follow = [r for r in job.results if "steps after the rewind" in r.detail]
    assert follow and follow[0].params["follow_up"] == "c7" and follow[0].command_id is None


def test_the_follow_up_of_a_rewind_far_past_its_checkpoint_still_compares_with_the_pre_fault_curve(tmp_path):
    """issue 36: a rewind ~126 steps after its checkpoint said "not enough samples": the monitor keeps the last 120
    samples, none of them at or before the checkpoint any more. The curve is the one recorded with the checkpoint."""
    job = Job(tmp_path, rewind={"report_after": 40})
    job.train(200)
    job.train(126)
    job.ctl.request("rewind", "command c1 from @ops", to=200)
    job.train(1)
    done = [r for r in job.results if r.action == "rewind" and r.ok]
    assert done and "to the checkpoint of step 200" in done[0].detail, job.results
    job.train(45)
    follow = [r for r in job.results if r.action == "rewind" and "steps after the rewind" in r.detail]
    assert follow and "not enough samples" not in follow[0].detail, follow
    assert "against the pre-fault" in follow[0].detail and "over steps 181-200" in follow[0].detail, follow


def test_a_custom_loop_takes_the_rewinds_step_once_and_the_old_way_still_works(tmp_path: Path) -> None:
    """take_rewound_to() gives a rewind's step once; `control.rewound_to = None` (custom loops written before it)
    clears it too; no caller sets a step there."""
    job = Job(tmp_path)
    job.ctl.rewinder.rewound_to = 300  # as a rewind leaves it
    assert job.ctl.rewound_to == 300 and job.ctl.take_rewound_to() == 300 and job.ctl.take_rewound_to() is None
    job.ctl.rewinder.rewound_to = 200
    job.ctl.rewound_to = None
    assert job.ctl.rewound_to is None
    with pytest.raises(AttributeError, match="take_rewound_to"):
        job.ctl.rewound_to = 100  # type: ignore[assignment]
