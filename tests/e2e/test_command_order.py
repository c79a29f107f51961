"""Commands of one run take effect in the order the bot accepted them, whatever order and however often
they reach a rank: a resume cancels a pending pause, a stop always applies (paused or not), the job never
stays paused after a trailing resume or stop, and time paused on purpose is neither a step stall nor
a throughput drop.

Layers here: `JobControl` with a real Monitor and a real MindSpore network, and one real MindSpore job driven
through the real bot on loopback. The pure `CommandOrder` (table-driven, and a hypothesis property over delivery
interleavings) is tests/notifier/test_command_order.py, the bot's apply steps tests/bot/commands/test_apply_steps.py,
both without MindSpore."""

from __future__ import annotations

import os
import threading
import time

import pytest

ms = pytest.importorskip("mindspore")
pytest.importorskip("aiohttp")

from msmon.contract.wire import Command  # noqa: E402
from notifier import Monitor  # noqa: E402
from notifier.control import JobControl  # noqa: E402
from notifier.mindspore import MindSporeBackend, MonitorCallback  # noqa: E402
from tests.fakes.bot_server import wait_for  # noqa: E402
from tests.fakes.ms_helpers import MLP, dataset, model, regression_data  # noqa: E402

# -- JobControl: the edge, with a real Monitor and a real MindSpore network -------------------------------


def monitor_cfg(**rules):
    return {"monitor_config": {"monitor_on": True, "step_interval": 1, "log_interval": 0,
                               "alert": {"baseline_steps": 20, "rules": rules}}}


def bound_control(tmp_path, run="order", **kw) -> JobControl:
    net = MLP()
    backend = MindSporeBackend(str(tmp_path / "ckpt"))
    backend.bind(net, ms.nn.SGD(net.trainable_params(), 0.01))
    return JobControl(Monitor(monitor_cfg(), run), backend, heartbeat_every=0.05, **kw)


def applying(control: JobControl, step: int) -> tuple[threading.Thread, list]:
    """control.apply(step) on a thread of its own (a pause blocks it); what it returned."""
    done: list = []
    t = threading.Thread(target=lambda: done.append(control.apply(step)), daemon=True)
    t.start()
    return t, done


def cmd(cid: str, action: str, at: int, **params) -> Command:
    return Command(id=cid, run_id="order", action=action, apply_step=at, params=params, issued_by="alice")


def test_pause_and_resume_ms_apart_never_leave_the_job_paused(tmp_path):
    control = bound_control(tmp_path)
    control.take_commands([cmd("c1", "pause", 5)])
    control.take_commands([cmd("c2", "resume", 5)])  # a few ms later, from the other thread
    t, done = applying(control, 5)
    t.join(3.0)
    try:
        assert not t.is_alive(), "the job stayed paused after pause + resume"
        assert not control.paused
        by_id = {r.command_id: r for r in done[0]}
        assert by_id["c1"].ok and "cancels it" in by_id["c1"].detail
        assert by_id["c2"].ok and "nothing to resume" in by_id["c2"].detail
        # what the bot reads, not the texts: neither took effect, and the job is not paused
        assert [(by_id[c].applied, by_id[c].paused) for c in ("c1", "c2")] == [(False, False), (False, False)]
    finally:
        control.request("resume")
        t.join(3.0)


def test_a_stop_while_paused_releases_the_pause_and_stops_at_once(tmp_path):
    control = bound_control(tmp_path)
    control.take_commands([cmd("c1", "pause", 5)])
    t, done = applying(control, 5)
    try:
        assert wait_for(lambda: control.paused, timeout=3)
        control.take_commands([cmd("c2", "stop", 9)])
        t.join(3.0)
        assert not t.is_alive(), "a stop could not apply to a paused job"
        assert control.stop_requested and not control.paused
        stop = next(r for r in done[0] if r.command_id == "c2")
        assert stop.ok and stop.step == 5 and stop.path and stop.path.endswith("step5.ckpt")
        assert ms.load_checkpoint(stop.path)
        late = []
        control.on_result = late.append
        control.take_commands([cmd("c3", "save_checkpoint", 10)])
        assert late and late[0].ok and "the job stopped at step 5 (stop c2)" in late[0].detail
    finally:
        control.request("resume")
        t.join(3.0)


def test_two_delivery_threads_and_the_training_thread_answer_each_command_once(tmp_path):
    """The poll thread and the sender's answers deliver the same commands over and over, in their own
    orders, while the training thread steps: every id is answered once and the job ends running."""
    control = bound_control(tmp_path)
    answered: list = []
    control.on_result = answered.append
    cmds = [cmd("c1", "pause", 3), cmd("c2", "scale_lr", 3, factor=1.0), cmd("c3", "resume", 3),
            cmd("c4", "pause", 6), cmd("c5", "save_checkpoint", 8), cmd("c6", "resume", 8)]

    def deliver(batches):
        for k in range(40):
            control.take_commands(batches[: 1 + k % len(batches)])
            time.sleep(0.002)

    threads = [threading.Thread(target=deliver, args=(cmds,)), threading.Thread(target=deliver, args=(cmds[::-1],))]
    for t in threads:
        t.start()
    try:
        for step in range(1, 14):
            t, _ = applying(control, step)
            t.join(5.0)
            assert not t.is_alive(), f"stuck at step {step}"
            time.sleep(0.005)
    finally:
        for t in threads:
            t.join(5.0)
        control.request("resume")
    ids = [r.command_id for r in answered if r.command_id]
    assert sorted(ids) == [c.id for c in cmds]  # each once
    assert not control.paused and all(r.ok for r in answered)


def test_a_stop_stops_even_when_its_checkpoint_fails(tmp_path):
    control = JobControl(Monitor(monitor_cfg(), "order"), MindSporeBackend(str(tmp_path / "ckpt")))  # no network
    control.request("stop")
    (res,) = control.apply(3)
    assert control.stop_requested and not res.ok
    assert "stopping after step 3, but the checkpoint failed" in res.detail


def test_time_paused_in_a_custom_loop_is_not_a_step_stall(tmp_path):
    """JobControl + Monitor.step, as examples/custom_loop.py: a 0.6 s pause in a job of ~3 ms steps."""
    mon = Monitor(monitor_cfg(step_stall={"min_seconds": 0.2}), "loop")
    control = JobControl(mon, heartbeat_every=0.1)  # no backend: a pause needs none
    events = []
    for step in range(1, 121):
        time.sleep(0.003)
        events += mon.step(step, samples=32)
        if step == 60:
            control.request("pause", timeout=0.6)
        if control.has_pending:
            control.apply(step)
    resumed = [r for r in control.results if r.action == "resume"]
    assert resumed and "after 0.6 s paused" in resumed[0].detail
    assert [e for e in events if e.rule == "step_stall"] == []
    # and a real stall of the same length still is one
    time.sleep(0.6)
    stall = mon.step(121, samples=32)
    assert [e.rule for e in stall] == ["step_stall"]


# -- the bot: apply steps never go backwards for a run, in acceptance order --------------------------------


# the bot and its operator: the same as the apply-step tests' (tests/bot/commands/test_apply_steps.py)
from tests.bot.commands.test_apply_steps import bot, operator  # noqa: E402, F401


class Pace(ms.train.Callback):
    """~100 steps/s, and an end to a run a failed test would leave going."""

    def __init__(self, limit_s: float = 90.0) -> None:
        super().__init__()
        self.deadline = time.monotonic() + limit_s
        self.steps: list[int] = []

    def on_train_step_end(self, run_context):
        self.steps.append(run_context.original_args().cur_step_num)
        time.sleep(0.01)
        if time.monotonic() > self.deadline:
            run_context.request_stop()


@pytest.mark.slow
@pytest.mark.mindspore
def test_a_real_job_takes_pause_resume_ms_apart_and_a_3s_pause_raises_no_stall(bot, tmp_path):  # noqa: F811 - the imported fixture
    x, y = regression_data()
    m, _, _ = model(lr=0.02)
    conf = monitor_cfg()
    conf["monitor_config"]["bot"] = {"url": bot.url, "token_env": "MSMON_TEST_TOKEN", "project": "llm",
                                     "heartbeat_interval": 0.2, "spool_dir": str(tmp_path / "spool")}
    events: list = []
    cb = MonitorCallback(conf, run_id="run-e2e", checkpoint_dir=str(tmp_path / "ckpt"), on_event=events.append)
    pace = Pace()
    trainer = threading.Thread(target=lambda: m.train(1, dataset(x, y, 256, 100_000), callbacks=[pace, cb],
                                                      dataset_sink_mode=False), daemon=True)
    trainer.start()
    try:
        assert wait_for(lambda: ((bot.store.run("run-e2e") or {}).get("last_step") or 0) > 60, timeout=60)

        # 1. pause and resume a few ms apart: both answered, the job never stops stepping
        pause, resume = operator(bot, "pause run-e2e"), operator(bot, "resume run-e2e")
        assert resume["apply_step"] >= pause["apply_step"]
        assert wait_for(lambda: all(bot.store.commands.get(c["id"])["status"] == "done" for c in (pause, resume)),
                        timeout=20), [bot.store.commands.get(c["id"]) for c in (pause, resume)]
        assert wait_for(lambda: pace.steps[-1] > pause["apply_step"] + 100, timeout=10), \
            f"paused at step {pace.steps[-1]} for good (pause applies at {pause['apply_step']})"
        assert not bot.store.run("run-e2e")["paused"]

        # 2. a 3 s pause: heartbeats say paused, no step moves; after the resume no step_stall
        pause = operator(bot, "pause run-e2e")
        assert wait_for(lambda: bot.store.commands.get(pause["id"])["status"] == "done", timeout=20)
        held = pace.steps[-1]
        time.sleep(3.0)
        assert pace.steps[-1] == held
        resume = operator(bot, "resume run-e2e")
        assert wait_for(lambda: bot.store.commands.get(resume["id"])["status"] == "done", timeout=20)
        detail = bot.store.commands.get(resume["id"])["results"]["0"]["detail"]
        assert "resumed at step" in detail
        assert wait_for(lambda: pace.steps[-1] > held + 150, timeout=20)
        stalls = [e for e in events if e.rule in ("step_stall", "throughput_drop")]
        assert stalls == [], [e.message for e in stalls]
        assert not [a for a in bot.store.alerts("run-e2e") if a["rule"] == "step_stall"]

        # 3. pause, then stop: the stop releases the pause and ends the training
        pause = operator(bot, "pause run-e2e")
        assert wait_for(lambda: bot.store.commands.get(pause["id"])["status"] == "done", timeout=20)
        stop = operator(bot, "stop run-e2e confirm")
        trainer.join(20)
        assert not trainer.is_alive(), "a stop could not end a paused job"
        assert wait_for(lambda: bot.store.commands.get(stop["id"])["status"] == "done", timeout=20)
        assert "stopping after step" in bot.store.commands.get(stop["id"])["results"]["0"]["detail"]
    finally:
        cb.control.request("resume")
        cb.control.request("stop")
        trainer.join(30)


@pytest.mark.parametrize("run", ["../../escape", "a/b", "<!channel>", "r" * 256])
def test_a_checkpoint_named_after_a_hostile_run_id_stays_in_its_folder(tmp_path, run):
    control = bound_control(tmp_path, run=run)
    _, path = control.save_checkpoint(7)
    folder = str(tmp_path / "ckpt")
    assert os.path.dirname(path) == folder and os.path.isfile(path) and path.endswith("-step7.ckpt")
    assert len(os.path.basename(path)) <= 255
    assert ms.load_checkpoint(path)  # a real checkpoint, readable back


def test_a_command_for_another_run_is_ignored(tmp_path, caplog):
    """Commands arrive in a peer's answers: one addressed to another run is not ours to apply."""
    control = bound_control(tmp_path, run="mine")
    control.take_commands([Command(id="c1", run_id="theirs", action="stop", apply_step=1)])
    assert control.apply(1) == [] and not control.has_pending
    assert "ignores command c1 for another run (theirs)" in caplog.text
