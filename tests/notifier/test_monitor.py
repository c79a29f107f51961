"""Monitor end to end (pure parts): sampling, throughput, phases, devices, actions, events, bounded memory."""

from __future__ import annotations

import gc
import logging
import math
import random
import tracemalloc

import pytest

from notifier import Monitor, Severity, Status
from tests.fakes.helpers import FakeClock, ListSink, config, healthy, run


def firing(events):
    return [(e.step, e.rule, e.severity) for e in events if e.status is Status.FIRING and not e.repeat]


def test_only_every_nth_step_is_sampled_and_log_steps_too():
    sink = ListSink()
    mon = Monitor(config(step_interval=10, log_interval=25), "r", sinks=[sink], clock=FakeClock())
    for step in range(101):
        mon.step(step, loss=1.0)
    mon.close()
    assert [s.step for s in sink.samples] == [0, 10, 20, 25, 30, 40, 50, 60, 70, 75, 80, 90, 100]


def test_non_sampled_step_returns_no_events_and_allocates_nothing():
    mon = Monitor(config(step_interval=10), "r", sinks=[])
    a = mon.step(1, loss=1.0)
    b = mon.step(2, loss=1.0)
    assert a == [] and a is b  # one shared empty list


def test_throughput_from_tokens_samples_and_seq_length():
    clock = FakeClock()
    sink = ListSink()
    mon = Monitor(config(step_interval=5, training={"seq_length": 128}), "r", sinks=[sink], clock=clock)
    for step in range(11):
        clock.advance(0.5)
        mon.step(step, loss=1.0, samples=8)
    mon.close()
    s = sink.samples[-1]
    assert s.step == 10
    assert s.samples_per_s == pytest.approx(16.0)
    assert s.tokens_per_s == pytest.approx(16.0 * 128)
    assert s.step_time == pytest.approx(0.5)


def test_measured_throughput_and_timestamps_for_replays():
    sink = ListSink()
    mon = Monitor(config(), "r", sinks=[sink])
    mon.step(0, loss=1.0, throughput=1520.0, time=100.0)
    mon.step(1, loss=1.0, throughput=1530.0, time=110.0)
    mon.close()
    assert [s.tokens_per_s for s in sink.samples] == [1520.0, 1530.0]
    assert [s.time for s in sink.samples] == [100.0, 110.0]
    assert sink.samples[1].step_time == pytest.approx(10.0)


def test_metrics_not_listed_are_not_sampled():
    sink = ListSink()
    mon = Monitor(config(metrics=["loss"]), "r", sinks=[sink])
    mon.step(0, loss=1.0, lr=0.1, grad_norm=2.0, tokens=5.0)
    mon.close()
    s = sink.samples[0]
    assert (s.loss, s.learning_rate, s.grad_norm, s.tokens_per_s) == (1.0, None, None, None)


def test_gradient_accumulation_averages_the_micro_step_wave():
    """Micro-batch losses with a period-4 wave: one sample per optimizer step, at the mean, no alarm."""
    sink = ListSink()
    wave = [2.0, 2.6, 1.4, 2.0]
    cfg = config(step_interval=1, training={"grad_accumulation_steps": 4})
    mon = Monitor(cfg, "r", sinks=[sink], clock=FakeClock())
    events = []
    for micro in range(4 * 3000):
        events += mon.step(micro, loss=wave[micro % 4] + 0.001 * ((micro * 7919) % 13 - 6))
    mon.close()
    assert firing(events) == []
    assert [s.step for s in sink.samples[:3]] == [0, 1, 2]
    assert len(sink.samples) == 3000
    assert all(abs(s.loss - 2.0) < 0.01 for s in sink.samples)


def test_clean_100k_steps_all_rules_on_raise_nothing():
    rng = random.Random(1)
    clock = FakeClock()
    cfg = config(alert={"baseline_steps": 500, "grad_norm_threshold": 10.0},
                 training={"total_steps": 200_000, "warmup_steps": 500, "target_loss": 2.2})
    mon = Monitor(cfg, "clean", sinks=[], clock=clock)

    def make(step):
        return healthy(step, rng)

    events = run(mon, range(100_000), make, clock, dt=0.2 * math.exp(rng.gauss(0, 0.01)))
    assert events == []


def test_sustained_loss_jump_errors_after_three_samples_and_resolves():
    rng = random.Random(2)
    mon = Monitor(config(), "r", sinks=[], clock=FakeClock())

    def make(step):
        m = healthy(step, rng)
        if 1000 <= step < 1050:
            m["loss"] += 5.0
        return m

    events = run(mon, range(1200), make)
    assert firing(events) == [(1002, "loss_spike", Severity.ERROR)]
    resolved = [e for e in events if e.status is Status.RESOLVED]
    assert [(e.step, e.rule) for e in resolved] == [(1052, "loss_spike")]


def test_one_step_spikes_do_not_alert():
    rng = random.Random(3)
    mon = Monitor(config(), "r", sinks=[], clock=FakeClock())

    def make(step):
        m = healthy(step, rng)
        if step % 397 == 0 and step > 200:
            m["loss"] += 1.2  # the recurring one-batch data spike of real runs
        return m

    assert firing(run(mon, range(5000), make)) == []


def test_nan_handed_in_at_a_non_sampled_step_errors_at_that_step_even_in_baseline():
    mon = Monitor(config(step_interval=10, alert={"baseline_steps": 10_000}), "r", sinks=[], clock=FakeClock())
    events = []
    for step in range(100):
        events += mon.step(step, loss=float("nan") if step >= 45 else 2.0, grad_norm=1.0)
    assert firing(events)[0] == (45, "nonfinite", Severity.ERROR)  # not at the next sampled step (50)
    e = events[0]
    assert math.isnan(e.value) and "loss is nan" in e.message


def test_event_carries_everything_the_chart_and_the_reader_need():
    rng = random.Random(4)
    cfg = config(alert={"grad_norm_threshold": 10.0},
                 actions=[{"rule": "grad_norm", "severity": "ERROR", "action": "save_checkpoint"},
                          {"rule": "*", "severity": "WARNING", "action": "scale_lr", "factor": 0.5}])
    mon = Monitor(cfg, "run-42", device=3, sinks=[], clock=FakeClock())

    def make(step):
        m = healthy(step, rng)
        if step >= 300:
            m["grad_norm"] = 50.0
        return m

    events = [e for e in run(mon, range(305), make) if e.rule == "grad_norm"]
    e = events[0]
    assert (e.run_id, e.device, e.step, e.severity, e.status) == ("run-42", "3", 301, Severity.ERROR, Status.FIRING)
    assert (e.value, e.threshold) == (50.0, 10.0)
    assert e.message == "grad norm 50 is over the threshold 10"
    assert "Save a checkpoint" in e.hint
    assert e.actions == [{"action": "save_checkpoint"}, {"action": "scale_lr", "factor": 0.5}]
    assert e.window is not None and e.window.steps[-1] == 301 and len(e.window.steps) == 120
    assert e.window.grad_norm[-1] == 50.0 and e.window.loss[-1] is not None
    assert e.time > 0 and e.phase == "default"


def test_phases_have_their_own_levels():
    rng = random.Random(5)
    cfg = config(alert={"phases": [{"name": "warmup", "end_step": 2000, "rules": {"loss_spike": {"warning": 30.0}}}]})
    mon = Monitor(cfg, "r", sinks=[], clock=FakeClock())

    def make(step):
        m = healthy(step, rng)
        if 1000 <= step < 1010 or 3000 <= step < 3010:
            m["loss"] += 0.3  # ~10 sigma: above 3 and 6, below 30
        return m

    got = firing(run(mon, range(4000), make))
    assert got == [(3002, "loss_spike", Severity.ERROR)]


def test_alert_interval_spaces_reminders():
    mon = Monitor(config(alert={"alert_interval": 500, "grad_norm_threshold": 10.0}), "r", sinks=[], clock=FakeClock())
    events = run(mon, range(2000), lambda s: {"loss": 2.0, "grad_norm": 50.0 if s >= 200 else 1.0})
    reminders = [e.step for e in events if e.rule == "grad_norm" and e.repeat]
    first = [e.step for e in events if e.rule == "grad_norm" and not e.repeat]
    assert first == [201]
    assert reminders == [701, 1201, 1701]


def test_per_device_state_and_ignored_devices(caplog):
    mon = Monitor(config(per_device_metrics=True, alert={"grad_norm_threshold": 10.0}), "r", sinks=[],
                  clock=FakeClock())
    events = []
    for step in range(300):
        for dev in range(4):
            g = 50.0 if (dev == 2 and step >= 250) else 1.0
            events += mon.step(step, loss=2.0, grad_norm=g, device=dev)
    assert {(e.device, e.rule) for e in events} == {("2", "grad_norm"), ("2", "grad_norm_spike")}

    with caplog.at_level(logging.INFO, logger="msmon"):
        single = Monitor(config(per_device_metrics=False), "r", sinks=[], clock=FakeClock())
        single.step(0, loss=1.0, device=0)
        assert single.step(0, loss=1.0, device=1) == []
        single.step(1, loss=1.0, device=1)
    assert caplog.text.count("ignoring samples from device 1") == 1


def test_straggler_among_four_devices():
    clock = FakeClock()
    mon = Monitor(config(per_device_metrics=True), "r", sinks=[], clock=lambda: clock.t)
    events = []
    for step in range(400):
        for dev in range(4):
            slow = 2.5 if (dev == 1 and step >= 300) else 1.0
            events += mon.step(step, loss=2.0, time=step * 1.0 * (slow if step >= 300 else 1.0) + dev * 0.0,
                               device=dev)
    got = [(e.step, e.device, e.severity) for e in events if e.rule == "straggler" and e.status is Status.FIRING]
    assert got and got[0][1] == "1" and got[0][0] >= 302 and got[0][2] is Severity.WARNING


def test_stall_between_samples_is_seen():
    clock = FakeClock()
    mon = Monitor(config(step_interval=10), "r", sinks=[], clock=clock)
    events = []
    for step in range(2000):
        clock.advance(30.0 if step == 1503 else 1.0)
        events += mon.step(step, loss=2.0)
    assert firing(events) == [(1510, "step_stall", Severity.WARNING)]
    assert "a step took 30 s, 30x the median step time 1 s" in events[0].message


def test_missing_metric_is_reported_once(caplog):
    with caplog.at_level(logging.INFO, logger="msmon"):
        mon = Monitor(config(), "run-9", sinks=[], clock=FakeClock())
        for step in range(10):
            mon.step(step, loss=2.0, lr=1e-4)
    assert caplog.text.count("grad_norm is in monitor_config.metrics but run run-9 has not reported it") == 1


def test_log_line_format(caplog):
    clock = FakeClock()
    with caplog.at_level(logging.INFO, logger="msmon"):
        mon = Monitor(config(step_interval=10, log_interval=100), "r", sinks=[], clock=clock)
        for step in range(101):
            clock.advance(10.0)
            mon.step(step, loss=2.3414, lr=1.2e-5, grad_norm=1.0213, tokens=15200)
    assert "[step 100] loss: 2.341 | lr: 1.2e-5 | grad_norm: 1.02 | throughput: 1520 tokens/s" in caplog.text


def test_alerts_are_logged_with_run_step_device_and_what_to_do(caplog):
    with caplog.at_level(logging.INFO, logger="msmon"):
        mon = Monitor(config(), "run-42", device=5, sinks=[], clock=FakeClock())
        mon.step(0, loss=float("inf"))
    rec = [r for r in caplog.records if r.levelno == logging.ERROR][0]
    assert rec.getMessage().startswith("[run run-42 step 0 device 5] ERROR nonfinite: loss is inf")
    assert "roll back to the last good checkpoint" in rec.getMessage()


def test_memory_is_bounded_however_long_the_run():
    rng = random.Random(6)
    mon = Monitor(config(), "r", sinks=[], clock=FakeClock())
    make = lambda s: healthy(s, rng)  # noqa: E731
    run(mon, range(20_000), make)
    gc.collect()
    tracemalloc.start()
    run(mon, range(20_000, 40_000), make)
    gc.collect()
    a, _ = tracemalloc.get_traced_memory()
    run(mon, range(40_000, 100_000), make)
    gc.collect()
    b, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert b - a < 64 * 1024, f"memory grew by {b - a} bytes over 60,000 more steps"


def test_a_crashing_rule_is_switched_off_and_training_goes_on(caplog):
    """A bug in one detector must not reach the training loop: logged once, that rule off, the rest on."""
    mon = Monitor(config(alert={"grad_norm_threshold": 10.0}), "run-3", sinks=[], clock=FakeClock())
    mon.step(0, loss=2.0, grad_norm=1.0)
    rules = mon._devices["0"].rules
    victim = next(r for r in rules if r.name == "loss_spike")

    def boom(s, p):
        raise ZeroDivisionError("simulated detector bug")

    victim.update = boom
    events = []
    with caplog.at_level(logging.ERROR, logger="msmon"):
        for step in range(1, 400):
            events += mon.step(step, loss=2.0, grad_norm=50.0 if step > 300 else 1.0)
    assert [r.getMessage() for r in caplog.records if "failed at step" in r.getMessage()] == [
        "msmon: rule loss_spike failed at step 1 on device 0 of run run-3 and is now off for this device; "
        "training and the other rules continue. Please report this with the traceback."]
    assert ("grad_norm", Severity.ERROR) in {(e.rule, e.severity) for e in events}


def test_a_nan_loss_does_not_resolve_a_loss_spike():
    """After a blow-up the loss turns NaN: the loss_spike alert must stay firing, not read 'back to normal'."""
    rng = random.Random(7)
    mon = Monitor(config(), "r", sinks=[], clock=FakeClock())

    def make(step):
        m = healthy(step, rng)
        if step >= 1000:
            m["loss"] = 50.0 if step < 1005 else float("nan")
        return m

    events = run(mon, range(1100), make)
    assert ("loss_spike", Status.FIRING) in {(e.rule, e.status) for e in events}
    assert [e for e in events if e.rule == "loss_spike" and e.status is Status.RESOLVED] == []



def test_loosen_moves_every_phase_in_proportion_from_the_default_levels_and_restores():
    mon = Monitor(config(alert={"grad_norm_threshold": 10.0, "phases": [
        {"name": "warmup", "start_step": 0, "end_step": 100, "rules": {"grad_norm": {"error": 50.0}}}]}), "r",
        sinks=[], clock=FakeClock())
    desc, undo = mon.loosen("grad_norm", value=15.0)  # the default phase's ERROR level 10 -> 15, not warmup's 50
    assert desc == "grad_norm WARNING 5 -> 7.5, ERROR 10 -> 15"
    levels = {name: params.levels for name, params in mon._levels.of("grad_norm")}
    assert levels == {"warmup": (37.5, 75.0), "default": (7.5, 15.0)}
    mon.restore(undo)
    assert {name: params.levels for name, params in mon._levels.of("grad_norm")} == {
        "warmup": (25.0, 50.0), "default": (5.0, 10.0)}
    with pytest.raises(ValueError, match="factor must be a positive number"):
        mon.loosen("grad_norm", factor=0.0)
    bare = Monitor(config(), "r", sinks=[], clock=FakeClock())  # grad_norm has no level without a threshold
    with pytest.raises(ValueError, match="rule grad_norm has no level set"):
        bare.loosen("grad_norm", factor=1.5)


@pytest.mark.parametrize("run_id", ["", "r" * 257])
def test_a_run_id_the_bot_would_refuse_is_refused_at_start(run_id):
    with pytest.raises(ValueError, match="run_id must be 1 to 256 characters"):
        Monitor(config(), run_id)


# -- JobControl without MindSpore: a custom loop's chat commands -----------------------------------------------


class RecordingBackend:
    """A custom loop's own backend: records what JobControl asked of it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    def save_checkpoint(self, step: int, name: str) -> str:
        self.calls.append(("save_checkpoint", name))
        return f"/ckpt/{name}.pt"

    def scale_lr(self, factor: float) -> str:
        self.calls.append(("scale_lr", factor))
        return f"lr 0.1 -> {0.1 * factor:g}"

    def stop(self, run_context: object) -> None:
        self.calls.append(("stop", run_context))


def test_job_control_imports_no_mindspore():
    import subprocess
    import sys

    code = "import sys, notifier.control; print('mindspore' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_job_control_without_a_backend_pauses_resumes_and_moves_thresholds_and_says_what_needs_one():
    from notifier.control import JobControl

    mon = Monitor(config(alert={"grad_norm_threshold": 10.0}), "loop", sinks=[], clock=FakeClock())
    control = JobControl(mon)
    control.request("pause", timeout=0.01)
    control.request("set_threshold", rule="grad_norm", value=20.0, level="error")
    control.request("save_checkpoint")
    control.request("scale_lr", factor=0.5)
    by_action = {r.action: r for r in control.apply(7)}
    assert by_action["pause"].ok and by_action["resume"].ok and not control.paused
    assert by_action["set_threshold"].ok and mon.config.alert.rules.grad_norm.error == 20.0
    for action, what in (("save_checkpoint", "save a checkpoint"), ("scale_lr", "scale the LR")):
        assert not by_action[action].ok and f"no backend to {what} with" in by_action[action].detail
    control.request("stop")
    (stop,) = control.apply(8)
    assert control.stop_requested and not stop.ok and "no backend to save a checkpoint" in stop.detail


def test_job_control_hands_checkpoints_the_lr_and_the_stop_to_its_backend():
    from notifier.control import JobControl

    backend = RecordingBackend()
    control = JobControl(Monitor(config(), "loop", device=3, sinks=[], clock=FakeClock()), backend)
    for action, params in (("save_checkpoint", {}), ("scale_lr", {"factor": 0.5}), ("stop", {})):
        control.request(action, **params)
    done = control.apply(9, run_context="ctx")
    assert [(r.action, r.ok, r.path) for r in done] == [
        ("save_checkpoint", True, "/ckpt/loop-device3-step9.pt"), ("scale_lr", True, None),
        ("stop", True, "/ckpt/loop-device3-step9.pt")]
    assert done[1].detail == "lr 0.1 -> 0.05"
    assert backend.calls == [("save_checkpoint", "loop-device3-step9"), ("scale_lr", 0.5), ("stop", "ctx"),
                             ("save_checkpoint", "loop-device3-step9")]


def _lr_jump_monitor() -> tuple[Monitor, list]:
    mon = Monitor({"monitor_on": True, "step_interval": 1}, "lr", sinks=[], clock=lambda: 0.0)
    events = []
    for step in range(1, 121):
        events += mon.step(step, loss=1.0, lr=0.6 if step > 100 else 0.05, grad_norm=1.0, time=float(step))
    return mon, events


def test_an_unannounced_lr_change_fires_at_its_step_and_holds_until_an_ack():
    """Issue 24: LR 0.05 -> 0.6 at step 101 of a constant-LR run: WARNING at 101, no RESOLVED while it stays; an
    acknowledgement takes it as the new normal, an announced change (scale-lr) is no alert at all."""
    mon, events = _lr_jump_monitor()
    assert [(e.step, e.rule, e.severity, e.status) for e in events] == [
        (101, "lr_schedule", Severity.WARNING, Status.FIRING)]
    assert "lr_schedule: the level now is taken as the new normal" in mon.acknowledge("lr_schedule")
    after = [e for k in range(121, 130) for e in mon.step(k, loss=1.0, lr=0.6, grad_norm=1.0, time=float(k))]
    assert [(e.rule, e.status) for e in after] == [("lr_schedule", Status.RESOLVED)]
    quiet = Monitor({"monitor_on": True, "step_interval": 1}, "lr", sinks=[], clock=lambda: 0.0)
    announced = []
    for step in range(1, 121):
        if step == 101:
            quiet.note_lr_change()  # what JobControl's scale_lr does
        announced += quiet.step(step, loss=1.0, lr=0.6 if step > 100 else 0.05, grad_norm=1.0, time=float(step))
    assert announced == []


def test_a_nan_after_a_resolved_transient_inside_alert_interval_is_sent():
    """Issue 24: a non-finite grad norm at step 100 (fires, resolves at 103) and a NaN loss at step 300, with the
    default alert_interval of 500: two ERRORs."""
    mon = Monitor({"monitor_on": True, "step_interval": 1}, "nan", sinks=[], clock=lambda: 0.0)
    events = []
    for step in range(1, 320):
        loss = math.nan if step == 300 else 1.0
        grad = math.inf if step == 100 else 1.0
        events += mon.step(step, loss=loss, lr=0.01, grad_norm=grad, time=float(step))
    fired = [(e.step, e.rule, e.severity) for e in events if e.status is Status.FIRING]
    assert fired == [(100, "nonfinite", Severity.ERROR), (300, "nonfinite", Severity.ERROR)]
