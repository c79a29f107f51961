"""MonitorCallback, the grad-norm train step and the job actions, on real MindSpore training (CPU)."""

from __future__ import annotations

import logging
import math
import threading
import time

import numpy as np
import pytest

pytest.importorskip("mindspore", reason="MindSpore is not installed (pip install msmon[mindspore])")

import mindspore as ms  # noqa: E402
from mindspore import nn  # noqa: E402
from mindspore.train.callback._callback import InternalCallbackParam, RunContext  # noqa: E402

from notifier import Monitor, Severity, Status  # noqa: E402
from notifier.mindspore import MonitorCallback, ScalableLR, parse_outputs  # noqa: E402
from tests.fakes.helpers import ListSink  # noqa: E402
from tests.fakes.ms_helpers import MLP, dataset, model, regression_data  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.mindspore]

GRAD_RULES = {"grad_norm", "grad_norm_spike", "grad_norm_creep"}


def cfg(**alert):
    return {"monitor_config": {"monitor_on": True, "step_interval": 1, "log_interval": 0,
                               "alert": {"baseline_steps": 100, **alert}}}


class Recorder(ms.train.Callback):
    """Keeps (step, loss, grad norm, time) and, optionally, a copy of the weights at every step."""

    def __init__(self, net=None):
        super().__init__()
        self.rows = []
        self.net = net
        self.weights = {}

    def on_train_step_end(self, run_context):
        c = run_context.original_args()
        loss, _, grad = parse_outputs(c.net_outputs)
        self.rows.append((int(c.cur_step_num), loss, grad, time.monotonic()))
        if self.net is not None:
            self.weights[int(c.cur_step_num)] = {p.name: p.asnumpy().copy() for p in self.net.trainable_params()}


def firing(events):
    return [(e.step, e.rule, e.severity) for e in events if e.status is Status.FIRING and not e.repeat]


def test_clean_run_raises_nothing(tmp_path):
    x, y = regression_data()
    m, _, _ = model(lr=0.05)
    events = []
    sink = ListSink()
    mon = Monitor(cfg(grad_norm_threshold=10.0), "clean", sinks=[sink])
    cb = MonitorCallback(None, monitor=mon, on_event=events.append, checkpoint_dir=str(tmp_path))
    m.train(1, dataset(x, y, 256, 600), callbacks=[cb], dataset_sink_mode=False)
    assert firing(events) == []
    assert [s.step for s in sink.samples] == list(range(1, 601))
    last = sink.samples[-1]
    assert last.loss is not None and last.grad_norm is not None and last.learning_rate == pytest.approx(0.05)
    assert last.samples_per_s and last.samples_per_s > 0


def test_lr_jump_grad_norm_alert_before_the_loss_doubles_and_the_checkpoint_holds_that_step(tmp_path):
    """LR x4 at step 300 (recipe in shared/notes): the grad norm explodes before the loss does."""
    x, y = regression_data()
    m, net, _ = model(lr=[0.05] * 300 + [0.2] * 120)
    events = []
    conf = cfg()
    conf["monitor_config"]["actions"] = [{"rule": "grad_norm_spike", "severity": "ERROR", "action": "save_checkpoint"}]
    cb = MonitorCallback(conf, run_id="lrjump", on_event=events.append, checkpoint_dir=str(tmp_path))
    rec = Recorder(net)
    m.train(1, dataset(x, y, 2048, 420), callbacks=[cb, rec], dataset_sink_mode=False)

    base = float(np.median([loss for _, loss, _, _ in rec.rows[250:300]]))
    doubled = next(step for step, loss, _, _ in rec.rows if step > 300 and not loss < 2 * base)
    grad_alerts = [(s, r, sev) for s, r, sev in firing(events) if r in GRAD_RULES]
    assert grad_alerts, firing(events)
    assert grad_alerts[0][0] < doubled, (grad_alerts, doubled)

    saved = [r for r in cb.control.results if r.action == "save_checkpoint"]
    assert len(saved) == 1 and saved[0].ok and saved[0].source == "rule grad_norm_spike ERROR"
    step = saved[0].step
    assert step == next(s for s, r, sev in grad_alerts if r == "grad_norm_spike" and sev is Severity.ERROR)
    ckpt = ms.load_checkpoint(saved[0].path)
    assert int(ckpt["global_step"].asnumpy()[0]) == step
    for name, value in rec.weights[step].items():
        np.testing.assert_array_equal(ckpt[name].asnumpy(), value)
    assert f"step{step}.ckpt" in saved[0].path


def test_nan_in_the_loss_is_an_error_at_the_first_sampled_step_after_it(tmp_path):
    """Corrupt batches from step 253 make the loss NaN; sampling every 10 steps, the ERROR comes at 260,
    inside the baseline period (NaN always alerts at once)."""
    x, y = regression_data()
    m, _, _ = model(lr=0.05)
    events = []
    conf = cfg()
    conf["monitor_config"]["step_interval"] = 10
    conf["monitor_config"]["alert"]["baseline_steps"] = 1000
    cb = MonitorCallback(conf, run_id="nan", on_event=events.append, checkpoint_dir=str(tmp_path))
    m.train(1, dataset(x, y, 256, 300, nan_steps=tuple(range(253, 301))), callbacks=[cb], dataset_sink_mode=False)
    got = firing(events)
    assert got[0] == (260, "nonfinite", Severity.ERROR), got
    assert "loss is nan" in events[0].message


def _train_weights(lr, steps, actions_at=None, cb_kwargs=None, seed=3):
    x, y = regression_data(seed=5)
    m, net, _ = model(lr=lr, seed=seed)
    cb = MonitorCallback(cfg(), run_id="lr", **(cb_kwargs or {}))

    class Act(ms.train.Callback):
        def on_train_step_end(self, run_context):
            step = run_context.original_args().cur_step_num
            if actions_at and step in actions_at:
                actions_at[step](cb)

    m.train(1, dataset(x, y, 256, steps), callbacks=[Act(), cb], dataset_sink_mode=False)
    return {p.name: p.asnumpy() for p in net.trainable_params()}, cb


@pytest.mark.parametrize("form", ["fixed", "list", "schedule"])
def test_scale_lr_halves_the_lr_the_optimizer_really_uses(form, tmp_path):
    """Scaled at step 50 (applied before step 51) == an LR that was half as large from step 51 on."""
    steps = 80
    if form == "fixed":
        scaled_lr, reference_lr = 0.05, [0.05] * 50 + [0.025] * (steps - 50)
    elif form == "list":
        scaled_lr = [0.05 - 0.0002 * i for i in range(steps)]
        reference_lr = scaled_lr[:50] + [v * 0.5 for v in scaled_lr[50:]]
    else:
        def poly(i):
            return (0.05 - 0.01) * (1 - min(i, 200) / 200) + 0.01

        scaled_lr = ScalableLR(nn.PolynomialDecayLR(0.05, 0.01, 200, power=1.0))
        reference_lr = [poly(i) for i in range(50)] + [poly(i) * 0.5 for i in range(50, steps)]
    got, cb = _train_weights(scaled_lr, steps, {50: lambda c: c.scale_lr(0.5)})
    ref, _ = _train_weights(reference_lr, steps)
    res = [r for r in cb.control.results if r.action == "scale_lr"]
    assert len(res) == 1 and res[0].ok and res[0].step == 50, res
    for name in ref:
        np.testing.assert_allclose(got[name], ref[name], rtol=1e-5, atol=1e-6)
    # and the difference is real: without the scaling the weights end elsewhere
    plain, _ = _train_weights(scaled_lr if form != "schedule" else
                              ScalableLR(nn.PolynomialDecayLR(0.05, 0.01, 200, power=1.0)), steps)
    assert any(not np.allclose(plain[n], ref[n], rtol=1e-4) for n in ref)


def test_scale_lr_on_a_plain_schedule_is_refused_with_the_fix(caplog):
    with caplog.at_level(logging.ERROR, logger="msmon"):
        _, cb = _train_weights(nn.PolynomialDecayLR(0.05, 0.01, 200, power=1.0), 20,
                               {10: lambda c: c.scale_lr(0.5)})
    res = [r for r in cb.control.results if r.action == "scale_lr"][0]
    assert not res.ok and "wrap it as learning_rate=ScalableLR(schedule)" in res.detail
    assert "FAILED" in caplog.text and "Training continues" in caplog.text


@pytest.mark.parametrize("form", ["fixed", "schedule"])
def test_a_scale_lr_that_would_zero_the_lr_is_refused_and_changes_nothing(form):
    """scale-lr 1e-30 is a valid factor, but twice on an LR of 0.05 the float32 LR would be 0 (or a subnormal), and no
    later scale-lr could bring a 0 back: the second is refused on the job, every parameter group left as it was, and
    training goes on exactly as a run that got only the first."""
    def lr():
        return 0.05 if form == "fixed" else ScalableLR(nn.PolynomialDecayLR(0.05, 0.01, 200, power=1.0))

    twice = {10: lambda c: c.scale_lr(1e-30), 20: lambda c: c.scale_lr(1e-30)}
    got, cb = _train_weights(lr(), 30, twice)
    ref, _ = _train_weights(lr(), 30, {10: lambda c: c.scale_lr(1e-30)})
    res = [r for r in cb.control.results if r.action == "scale_lr"]
    assert [r.ok for r in res] == [True, False], res
    assert "leaves float32's range" in res[1].detail and "0 or infinite for good" in res[1].detail, res[1].detail
    for name in ref:
        np.testing.assert_array_equal(got[name], ref[name])


def test_pause_stops_progress_until_resume_and_the_job_still_reports_alive():
    alive = []
    x, y = regression_data()
    m, _, _ = model()
    cb = MonitorCallback(cfg(), run_id="pause")
    cb.control.heartbeat_every = 0.1
    cb.control.on_paused = lambda step, waited: alive.append((step, waited))
    rec = Recorder()

    resumed_at = []

    def resume_later():
        time.sleep(1.0)
        resumed_at.append((time.monotonic(), len(rec.rows)))
        cb.resume()  # from another thread, as a chat command would

    class PauseAt(ms.train.Callback):
        def on_train_step_end(self, run_context):
            if run_context.original_args().cur_step_num == 30:
                cb.pause()
                threading.Thread(target=resume_later, daemon=True).start()

    m.train(1, dataset(x, y, 256, 60), callbacks=[PauseAt(), rec, cb], dataset_sink_mode=False)
    steps = [r[0] for r in rec.rows]
    assert steps == list(range(1, 61))
    t_resume, done_before_resume = resumed_at[0]
    assert done_before_resume == 30  # nothing moved while paused
    gap = rec.rows[30][3] - rec.rows[29][3]
    assert gap >= 0.9
    assert len(alive) >= 5 and all(step == 30 for step, _ in alive)
    paused = [r for r in cb.control.results if r.action == "pause"][0]
    assert paused.ok and paused.step == 30 and "paused at step 30" in paused.detail  # reported when it starts
    resumed = [r for r in cb.control.results if r.action == "resume"][0]
    assert resumed.ok and resumed.step == 30 and "resumed at step 30 after" in resumed.detail


def test_pause_with_timeout_resumes_by_itself():
    x, y = regression_data()
    m, _, _ = model()
    cb = MonitorCallback(cfg(), run_id="pause2", pause_timeout=0.3)

    class PauseAt(ms.train.Callback):
        def on_train_step_end(self, run_context):
            if run_context.original_args().cur_step_num == 5:
                cb.pause()

    m.train(1, dataset(x, y, 256, 10), callbacks=[PauseAt(), cb], dataset_sink_mode=False)
    res = [r for r in cb.control.results if r.action == "resume"][0]
    assert res.source == "its 0 s timeout" and "resumed at step 5 after" in res.detail


def test_stop_writes_a_checkpoint_then_ends_training(tmp_path):
    x, y = regression_data()
    m, net, _ = model()
    cb = MonitorCallback(cfg(), run_id="stop", checkpoint_dir=str(tmp_path))
    rec = Recorder(net)

    class StopAt(ms.train.Callback):
        def on_train_step_end(self, run_context):
            if run_context.original_args().cur_step_num == 40:
                cb.stop()

    m.train(1, dataset(x, y, 256, 100), callbacks=[StopAt(), cb, rec], dataset_sink_mode=False)
    assert rec.rows[-1][0] == 40
    res = [r for r in cb.control.results if r.action == "stop"][0]
    assert res.ok and res.path and res.path.endswith("stop-device0-step40.ckpt")
    ckpt = ms.load_checkpoint(res.path)
    np.testing.assert_array_equal(ckpt["l1.weight"].asnumpy(), rec.weights[40]["l1.weight"])


def test_set_threshold_live():
    # Asked at step 10 (applied at the next boundary), when the rules have samples to judge it on: the first rows
    # wait until the Monitor has read whether the log is per micro-step (msmon.core.accumulation), so at step 1
    # there is nothing yet to say what the change would have done.
    x, y = regression_data()
    m, _, _ = model()
    cb = MonitorCallback(cfg(grad_norm_threshold=10.0), run_id="thr")

    class Ask(ms.train.Callback):
        def on_train_step_end(self, run_context):
            if run_context.original_args().cur_step_num == 10:
                cb.set_threshold("grad_norm", 15.0, level="error")

    m.train(1, dataset(x, y, 256, 14), callbacks=[Ask(), cb], dataset_sink_mode=False)
    assert cb.monitor.config.alert.rules.grad_norm.levels == (7.5, 15.0)
    res = [r for r in cb.control.results if r.action == "set_threshold"][0]
    assert res.ok and res.detail.startswith("grad_norm error level 10.0 -> 15; over the last ")
    assert "alerts at 7.5 / 15 instead of " in res.detail  # the change says what it would have done


@pytest.mark.timing
@pytest.mark.parametrize("sink", [False, True])
def test_step_numbers_and_throughput_in_sink_and_non_sink_mode(sink):
    """On the CPU MindSpore runs sink mode step by step (it logs that it ignores it): either way the
    callback sees every step, numbered across epochs, and samples/s = batch / step time."""
    x, y = regression_data()
    m, _, _ = model()
    sink_ = ListSink()
    cb = MonitorCallback(None, monitor=Monitor(cfg(), "sink", sinks=[sink_]))
    rec = Recorder()
    m.train(2, dataset(x, y, 256, 40), callbacks=[cb, rec], dataset_sink_mode=sink, sink_size=10 if sink else -1)
    cb.monitor.flush()
    assert [s.step for s in sink_.samples] == list(range(1, 81))
    times = {step: t for step, _, _, t in rec.rows}
    later = sink_.samples[5:]
    for s in later:
        assert s.samples_per_s == pytest.approx(256 / s.step_time)
    # The step times are the wall time per step: they add up to what the other callback saw over the same
    # steps. (Compared in sum, not step by step: a step is a few ms here, and the two callbacks read the
    # clock a few hundred us apart, by a varying amount on a loaded 2-core machine.)
    wall = times[later[-1].step] - times[later[0].step - 1]
    assert sum(s.step_time or 0.0 for s in later) == pytest.approx(wall, rel=0.1, abs=0.01)


def drive_callback(batch, calls, seconds_per_call, steps_per_call=1, sink=False):
    """Run a MonitorCallback through MindSpore's own RunContext with a given first batch, `calls` step
    ends `seconds_per_call` apart (a fake clock), `steps_per_call` steps each; returns the samples."""
    sink_ = ListSink()
    clock = [1000.0]
    mon = Monitor(cfg(), "driven", sinks=[sink_], clock=lambda: clock[0])
    cb = MonitorCallback(None, monitor=mon)
    params = InternalCallbackParam()
    params.update(cur_step_num=0, batch_num=steps_per_call, dataset_sink_mode=sink, optimizer=None,
                  train_network=None, train_dataset=None, train_dataset_element=[batch], initial_step=0,
                  net_outputs=ms.Tensor(2.0))
    ctx = RunContext(params)
    cb.on_train_begin(ctx)
    for k in range(1, calls + 1):
        clock[0] += seconds_per_call
        params["cur_step_num"] = steps_per_call * k
        cb.on_train_step_end(ctx)
    mon.close()
    return sink_.samples


def test_real_sink_mode_callbacks_once_per_sink():
    """Where sink mode is real (Ascend/GPU) the callback fires once per sink of `batch_num` steps. Driven
    here through MindSpore's own RunContext: the step counter jumps by the sink size, throughput and
    step time are per step, and the slowest step is estimated per sink."""
    samples = drive_callback(ms.Tensor(np.zeros((32, 8), np.float32)), calls=6, seconds_per_call=50 * 0.2,
                             steps_per_call=50, sink=True)  # 50 steps of 0.2 s per callback
    assert [s.step for s in samples] == [50, 100, 150, 200, 250, 300]
    s = samples[-1]
    assert s.step_time == pytest.approx(0.2)
    assert s.samples_per_s == pytest.approx(32 / 0.2)
    assert s.max_step_time == pytest.approx(0.2)


def test_model_fit_is_covered():
    x, y = regression_data()
    m, _, _ = model()
    sink_ = ListSink()
    cb = MonitorCallback(None, monitor=Monitor(cfg(), "fit", sinks=[sink_]))
    hist = ms.train.History()
    m.fit(2, dataset(x, y, 256, 20), dataset(x, y, 256, 2), callbacks=[cb, hist], dataset_sink_mode=False)
    cb.monitor.flush()
    assert [s.step for s in sink_.samples] == list(range(1, 41))
    assert hist.epoch["epoch"] == [1, 2]
    assert len(hist.history["mse"]) == 2  # evaluation ran after each epoch


def test_loss_scale_train_step_reports_unscaled_grad_norm():
    """With a fixed loss scale of 1024 the reported norm is that of the real gradients."""
    from notifier.mindspore import TrainStepWithGradNorm, TrainStepWithGradNormLossScale

    x, y = regression_data()
    xb, yb = ms.Tensor(x[:256]), ms.Tensor(y[:256])
    norms = []
    for make in (lambda n, o: TrainStepWithGradNorm(n, o),
                 lambda n, o: TrainStepWithGradNormLossScale(n, o, ms.Tensor(1024.0, ms.float32))):
        ms.set_seed(11)
        net = MLP()
        opt = nn.SGD(net.trainable_params(), learning_rate=0.01)
        out = make(nn.WithLossCell(net, nn.MSELoss()), opt)(xb, yb)
        loss, lr, norm = parse_outputs(out)
        assert lr == pytest.approx(0.01)
        norms.append(norm)
    assert norms[0] == pytest.approx(norms[1], rel=1e-4)
    assert math.isfinite(norms[0]) and norms[0] > 0


def test_custom_loop_example_catches_an_lr_jump():
    import subprocess
    import sys

    from tests.conftest import ROOT

    p = subprocess.run([sys.executable, str(ROOT / "examples" / "custom_loop.py"), "--steps", "330",
                        "--lr-jump-at", "300"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    alerts = [line for line in p.stdout.splitlines() if line.startswith("ALERT")]
    assert alerts and any("grad_norm" in a for a in alerts), p.stdout
    # (timing rules may flag a hiccup of this shared machine on 5 ms steps; the training rules may not)
    training = [a for a in alerts if a.split()[4].rstrip(":").startswith(("grad_norm", "loss", "nonfinite"))]
    assert training and all(int(a.split()[2]) > 300 for a in training), alerts
    # issue 24: the LR change itself is flagged at its step, and nothing is "back to normal" while it lasts
    assert any(a.startswith("ALERT step 300 WARNING lr_schedule") for a in alerts), alerts
    assert not [line for line in p.stdout.splitlines() if line.startswith("RESOLVED")], p.stdout
    assert "[step 50] loss:" in p.stderr and "samples/s" in p.stderr


@pytest.mark.parametrize("form", ["fixed", "list", "schedule"])
def test_lr_is_read_from_the_optimizer_when_the_train_cell_does_not_return_it(form):
    """A plain TrainOneStepCell returns the loss only: the LR of each step comes from the optimizer."""
    steps = 30
    if form == "fixed":
        lr, expected = 0.05, [0.05] * steps
    elif form == "list":
        lr = [0.05 - 0.001 * i for i in range(steps)]
        expected = lr
    else:
        lr = nn.PolynomialDecayLR(0.05, 0.01, 20, power=1.0)
        expected = [(0.05 - 0.01) * (1 - min(i, 20) / 20) + 0.01 for i in range(steps)]
    x, y = regression_data()
    m, _, _ = model(lr=lr, grad_norm=False)
    sink_ = ListSink()
    cb = MonitorCallback(None, monitor=Monitor(cfg(), "lr-read", sinks=[sink_]))
    m.train(1, dataset(x, y, 256, steps), callbacks=[cb], dataset_sink_mode=False)
    cb.monitor.flush()
    got = [s.learning_rate for s in sink_.samples]
    assert got == pytest.approx(expected, rel=1e-6)  # step N reports the LR that step N used
    assert all(s.grad_norm is None for s in sink_.samples)


def test_tokens_per_second_from_an_integer_token_batch():
    """Token ids (batch, sequence): tokens/s = samples/s x sequence length, with no config needed."""
    s = drive_callback(ms.Tensor(np.zeros((8, 128), np.int32)), calls=3, seconds_per_call=0.5)[-1]
    assert s.samples_per_s == pytest.approx(16.0)
    assert s.tokens_per_s == pytest.approx(16.0 * 128)


def test_clipping_reports_the_norm_before_clipping_and_updates_with_clipped_gradients():
    from notifier.mindspore import TrainStepWithGradNorm

    x, y = regression_data()
    xb, yb = ms.Tensor(x[:256]), ms.Tensor(y[:256])
    deltas, norms = [], []
    for clip in (None, 0.01):
        ms.set_seed(11)
        net = MLP()
        before = net.l1.weight.asnumpy().copy()
        opt = nn.SGD(net.trainable_params(), learning_rate=0.1)
        out = TrainStepWithGradNorm(nn.WithLossCell(net, nn.MSELoss()), opt, clip_norm=clip)(xb, yb)
        norms.append(parse_outputs(out)[2])
        deltas.append(net.l1.weight.asnumpy() - before)
    assert norms[0] == pytest.approx(norms[1], rel=1e-5) and norms[0] > 0.01
    # float32 weights: the update is rounded where it lands, hence the absolute tolerance
    np.testing.assert_allclose(deltas[1], deltas[0] * (0.01 / norms[0]), rtol=1e-2, atol=2e-8)


def test_a_real_training_reports_to_the_bot(tmp_path, monkeypatch):
    """bot.url set: events, samples, action results and heartbeats reach the bot from a real training."""
    from tests.fakes.recording_bot import RecordingBot

    bot = RecordingBot()
    try:
        monkeypatch.setenv("MSMON_TOKEN", "job-token-1")
        conf = cfg()
        conf["monitor_config"]["bot"] = {"url": bot.url, "spool_dir": str(tmp_path / "spool"),
                                         "heartbeat_interval": 0.1, "project": "llm", "labels": {"team": "a"}}
        conf["monitor_config"]["actions"] = [{"rule": "grad_norm_spike", "severity": "ERROR",
                                              "action": "save_checkpoint"}]
        x, y = regression_data()
        m, _, _ = model(lr=[0.05] * 300 + [0.2] * 60)
        cb = MonitorCallback(conf, run_id="to-bot", checkpoint_dir=str(tmp_path))
        m.train(1, dataset(x, y, 2048, 360), callbacks=[cb], dataset_sink_mode=False)
        assert bot.wait_for(lambda: len(bot.samples()) == 360 and bot.actions(), timeout=15)
        assert [s.step for s in bot.samples()] == list(range(1, 361))
        rules = {(e.rule, e.severity) for e in bot.events()}
        assert ("grad_norm_spike", Severity.ERROR) in rules
        assert bot.actions()[0].action == "save_checkpoint" and bot.actions()[0].ok
        assert bot.heartbeats and max(h.step or 0 for h in bot.heartbeats) > 0
        env = bot.envelopes[-1]
        assert (env.run_id, env.project, env.labels) == ("to-bot", "llm", {"team": "a"})
        assert set(bot.auth) == {"Bearer job-token-1"}
    finally:
        bot.stop()


def test_a_command_delivered_twice_at_once_is_applied_once_at_its_step():
    """At-least-once delivery reaches a job from two threads (the long poll and the answers to its posts):
    JobControl takes each command id once, and holds it until its apply step."""
    from msmon.contract.wire import Command
    from notifier.mindspore import JobControl

    control = JobControl(Monitor(cfg(), "dup"))
    cmds = [Command(id="c1", run_id="dup", action="loosen_threshold", apply_step=5,
                    params={"rule": "grad_norm_spike", "factor": 2.0}, issued_by="alice")]
    threads = [threading.Thread(target=control.take_commands, args=(cmds,)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert control.apply(4) == []  # not yet
    (res,) = control.apply(5)
    assert res.command_id == "c1" and res.ok and "WARNING 4 -> 8, ERROR 10 -> 20" in res.detail
    control.take_commands(cmds)  # delivered again later: already taken
    assert control.apply(6) == [] and not control.has_pending
