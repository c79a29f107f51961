"""Commands of one run take effect in the order the bot accepted them, whatever order and however often
they reach a rank: a resume cancels a pending pause, a stop always applies (paused or not), the job never
stays paused after a trailing resume or stop, and time paused on purpose is neither a step stall nor
a throughput drop.

Layers: the pure `CommandOrder` (table-driven, and a hypothesis property over delivery interleavings),
`JobControl` with a real Monitor and a real MindSpore network, the real bot's apply steps, and one
real MindSpore job driven through the real bot on loopback."""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ms = pytest.importorskip("mindspore")
pytest.importorskip("aiohttp")

from msmon.contract.wire import Command, Heartbeat, encode  # noqa: E402
from notifier import Monitor  # noqa: E402
from notifier.control import CommandOrder, JobControl, Outcome, Request, acceptance_order  # noqa: E402
from notifier.mindspore import MindSporeBackend, MonitorCallback  # noqa: E402
from tests.fakes.bot_server import wait_for  # noqa: E402
from tests.fakes.ms_helpers import MLP, dataset, model, regression_data  # noqa: E402

# -- the pure state machine: table-driven ------------------------------------------------------------


def req(cid: str, action: str, at: int | None = None, **params: Any) -> Request:
    return Request(action, params, f"command {cid}", cid, at)


def play(script: list[tuple[Any, ...]], pause_timeout: float | None = None) -> tuple[list[str], CommandOrder]:
    """Run a script of ("offer", Request) and ("step", step, now) against a CommandOrder; what it decided,
    as "kind id" strings ("resume -" for a pause ended by its timeout or by a stop)."""
    order = CommandOrder(pause_timeout=pause_timeout)
    out: list[Outcome] = []
    for item in script:
        if item[0] == "offer":
            order.offer(item[1])
        else:
            out += order.decide(item[1], item[2])
    return [f"{o.kind} {o.req.command_id or '-'}" for o in out], order


TABLE = [
    # name, script, decided, ends paused
    ("resume ms after a pause cancels it before its step",
     [("offer", req("c1", "pause", 10)), ("offer", req("c2", "resume", 10)), ("step", 10, 0.0)],
     ["skip c1", "skip c2"], False),
    ("the resume reaching the rank first changes nothing",
     [("offer", req("c2", "resume", 10)), ("offer", req("c1", "pause", 10)), ("step", 10, 0.0)],
     ["skip c1", "skip c2"], False),
    ("a resume accepted after it releases a pause in effect at once",
     [("offer", req("c1", "pause", 10)), ("step", 10, 0.0), ("offer", req("c2", "resume", 14)), ("step", 10, 1.0)],
     ["pause c1", "resume c2"], False),
    ("pause, pause at the same step: the second is already done",
     [("offer", req("c1", "pause", 10)), ("offer", req("c2", "pause", 10)), ("step", 10, 0.0),
      ("offer", req("c3", "resume", 11)), ("step", 10, 1.0)],
     ["pause c1", "skip c2", "resume c3"], False),
    ("a resume also cancels a pause still waiting for a later step",
     [("offer", req("c1", "pause", 10)), ("step", 10, 0.0), ("offer", req("c2", "pause", 15)),
      ("step", 10, 0.5), ("offer", req("c3", "resume", 15)), ("step", 10, 1.0)],
     ["pause c1", "skip c2", "resume c3"], False),
    ("pause then stop: the stop releases the pause and stops at the paused step",
     [("offer", req("c1", "pause", 10)), ("offer", req("c2", "stop", 10)), ("step", 10, 0.0)],
     ["pause c1", "resume -", "run c2"], False),
    ("a stop arriving while paused applies at once",
     [("offer", req("c1", "pause", 10)), ("step", 10, 0.0), ("offer", req("c2", "stop", 30)), ("step", 10, 2.0),
      ("offer", req("c3", "save_checkpoint", 31)), ("step", 10, 2.1)],
     ["pause c1", "resume -", "run c2", "skip c3"], False),
    ("stop then resume: nothing after a stop applies",
     [("offer", req("c1", "stop", 10)), ("offer", req("c2", "resume", 10)), ("step", 10, 0.0)],
     ["run c1", "skip c2"], False),
    ("resume, resume: the second has nothing to resume",
     [("offer", req("c1", "pause", 10)), ("offer", req("c2", "resume", 10)), ("offer", req("c3", "resume", 11)),
      ("step", 10, 0.0), ("step", 11, 0.1)],
     ["skip c1", "skip c2", "skip c3"], False),
    ("a duplicate delivery is taken once",
     [("offer", req("c1", "save_checkpoint", 5)), ("offer", req("c1", "save_checkpoint", 5)), ("step", 5, 0.0),
      ("offer", req("c1", "save_checkpoint", 5)), ("step", 6, 0.1)],
     ["run c1"], False),
    ("a pause that times out; a resume after it has nothing to do",
     [("offer", req("c1", "pause", 10, timeout=3.0)), ("step", 10, 0.0), ("step", 10, 2.9), ("step", 10, 3.0),
      ("offer", req("c2", "resume", 12)), ("step", 11, 3.1), ("step", 12, 3.2)],
     ["pause c1", "resume -", "skip c2"], False),
    ("a later command never applies before an earlier one",
     [("offer", req("c1", "save_checkpoint", 12)), ("offer", req("c2", "scale_lr", 10, factor=0.5)),
      ("step", 10, 0.0), ("step", 11, 0.1), ("step", 12, 0.2)],
     ["run c1", "run c2"], False),
    ("a request made in the job is not held back by a command waiting for its step",
     [("offer", req("c1", "pause", 10)), ("offer", Request("save_checkpoint", {}, "rule grad_norm ERROR")),
      ("step", 5, 0.0), ("offer", Request("resume", {}, "code")), ("step", 10, 1.0)],
     ["run -", "skip c1", "skip -"], False),
    ("a resume accepted before the pause in effect does not release it",
     [("offer", req("c2", "pause", 10)), ("step", 10, 0.0), ("offer", req("c1", "resume", 9)), ("step", 10, 1.0)],
     ["pause c2", "skip c1"], True),
    ("a pause reaching the rank after a later resume was handled is cancelled",
     [("offer", req("c2", "resume", 10)), ("step", 10, 0.0), ("offer", req("c1", "pause", 10)), ("step", 11, 0.1)],
     ["skip c2", "skip c1"], False),
    ("while paused, a command due at the paused step still applies",
     [("offer", req("c1", "pause", 10)), ("step", 10, 0.0), ("offer", req("c2", "save_checkpoint", 10)),
      ("step", 10, 0.5)],
     ["pause c1", "run c2"], True),
]


@pytest.mark.parametrize(("script", "decided", "ends_paused"), [row[1:] for row in TABLE],
                         ids=[row[0] for row in TABLE])
def test_command_order_table(script, decided, ends_paused):
    got, order = play(script)
    assert got == decided
    assert (order.paused is not None) == ends_paused


def test_the_reasons_say_what_happened_to_each_command():
    order = CommandOrder()
    order.offer(req("c1", "pause", 10))
    order.offer(req("c2", "resume", 10))
    c1, c2 = order.decide(10, 0.0)
    assert c1.detail == "not applied: resume c2, accepted after it, cancels it"
    assert c2.detail == "the job was not paused: nothing to resume (it cancelled pause c1 before that applied)"
    order.offer(req("c3", "pause", 11))
    (c3,) = order.decide(11, 1.0)
    assert c3.kind == "pause" and order.paused_step == 11
    order.offer(req("c4", "stop", 40))
    released, stop = order.decide(11, 3.5)
    assert released.detail == "resumed at step 11 after 2.5 s paused" and released.req.source == "stop c4"
    assert stop.kind == "run" and stop.req.command_id == "c4"
    assert order.offer(req("c5", "save_checkpoint", 41)) and not order.offer(req("c5", "save_checkpoint", 41))
    (late,) = order.decide(11, 3.6)
    assert late.detail == "not applied: the job stopped at step 11 (stop c4)"


def test_acceptance_order_is_the_bots_sequence_number():
    ids = ("c1", "c17", "c0017", None, "x5", "c", "c-1", "c1a", "c²", "c" + "9" * 5000)
    assert [acceptance_order(x) for x in ids] == [1, 17, 17, None, None, None, None, None, None, None]


# -- the pure state machine: any interleaving and duplication of deliveries ----------------------------

ACTIONS = ["pause", "pause", "resume", "resume", "stop", "save_checkpoint", "scale_lr"]


@st.composite
def accepted(draw):
    """A run's accepted commands (apply steps never going backwards, as the bot assigns them), and for each
    delivered copy the tick it reaches the rank: before its apply step (the bot's margin), 1-3 copies each
    (the poll thread and the answers to the job's posts), in any order within a tick."""
    n = draw(st.integers(1, 7))
    steps = sorted(draw(st.lists(st.integers(2, 25), min_size=n, max_size=n)))
    cmds = []
    for i, at in enumerate(steps, start=1):
        action = draw(st.sampled_from(ACTIONS))
        params = {"timeout": draw(st.sampled_from([None, 2.0]))} if action == "pause" else {}
        cmds.append((f"c{i}", action, at, {k: v for k, v in params.items() if v is not None}))
    copies = []
    for cid, _, at, _ in cmds:
        for _ in range(draw(st.integers(1, 3))):
            copies.append((draw(st.integers(0, at - 1)), draw(st.integers(0, 10**6)), cid))
    return cmds, sorted(copies)


def simulate(cmds, copies) -> tuple[list[tuple[str, str, str, int]], CommandOrder]:
    """A rank taking one tick per step boundary: the step moves on only when not paused (a pause lasts
    ticks, not steps); deliveries scheduled for a tick arrive before its boundary. What it decided, and
    at which step."""
    by_id = {cid: (action, at, params) for cid, action, at, params in cmds}
    order = CommandOrder()
    out: list[tuple[str, str, str, int]] = []
    step = 1
    last_tick = max(at for _, _, at, _ in cmds) + 40
    for tick in range(last_tick):
        for t, _, cid in copies:
            if t == tick:
                action, at, params = by_id[cid]
                order.offer(req(cid, action, at, **params))
        out += [(o.kind, o.req.command_id or "-", o.detail, step) for o in order.decide(step, float(tick))]
        if order.paused is None and order.stopped is None:
            step += 1
    return out, order


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(accepted())
def test_any_interleaving_and_duplication_of_deliveries_decides_the_same(case):
    cmds, copies = case
    got, order = simulate(cmds, copies)
    # canonical: each command delivered once, in acceptance order, at the first tick one of its copies arrived
    first = {}
    for t, _, cid in copies:
        first[cid] = min(t, first.get(cid, t))
    canonical = [(first[cid], acceptance_order(cid), cid) for cid in first]
    want, _ = simulate(cmds, sorted(canonical))
    assert got == want  # the same decisions at the same steps: so every rank of a job acts alike
    ids = [cid for _, cid, _, _ in got if cid != "-"]
    assert len(ids) == len(set(ids))  # each id decided at most once
    last = cmds[-1][1]
    if last in ("resume", "stop") or any(a == "stop" for _, a, _, _ in cmds):
        assert order.paused is None  # never ends paused after a trailing resume, or once a stop was accepted
    if order.paused is None:
        assert sorted(ids, key=acceptance_order) == sorted(c[0] for c in cmds)  # every command answered
    applied = [cid for kind, cid, _, _ in got if kind in ("run", "pause")]
    assert applied == sorted(applied, key=acceptance_order)  # effects in acceptance order


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


@pytest.fixture
def bot(tmp_path, monkeypatch, bot_server):
    monkeypatch.setenv("MSMON_TEST_TOKEN", "job-token")
    monkeypatch.setenv("MSMON_OPERATOR", "operator-token")
    b = bot_server({"bot": {
        "port": 0, "state_path": str(tmp_path / "bot.sqlite"),
        "tokens": [{"project": "llm", "env": "MSMON_TEST_TOKEN"}],
        "routes": [{"receiver": "console", "channel": "ops"}],
        "console": {"charts_dir": str(tmp_path / "charts")},
        "commands": {"allow": [{"project": "llm", "users": ["cli:carol"]}],
                     "operators": [{"user": "cli:carol", "env": "MSMON_OPERATOR"}]}}})
    yield b


def operator(bot, text: str) -> dict:
    code, body = bot.request("POST", "/v1/commands", json.dumps({"text": text}).encode(), token="operator-token")
    assert code == 200, body
    command: dict = body["command"]
    return command


def test_apply_steps_never_go_backwards_for_a_run(bot):
    from msmon.contract.wire import Envelope, Sample

    now = time.time()
    samples = [Sample(run_id="run-9", device="0", step=100 + 10 * k, time=now - 3.0 + 0.1 * k, loss=1.0)
               for k in range(10)]  # 100 steps/s, newest report 2.1 s old
    env = Envelope(run_id="run-9", device="0", sent_at=now, project="llm", samples=samples)
    assert bot.request("POST", "/v1/ingest", encode(env))[0] == 202
    pause = operator(bot, "pause run-9")
    # the job says it is paused (a rule's pause): the bot now plans from the last step, without the lag
    hb = Heartbeat(run_id="run-9", device="0", time=time.time(), step=190, paused=True)
    assert bot.request("POST", "/v1/heartbeat", encode(hb))[0] == 202
    assert wait_for(lambda: bot.store.run("run-9")["paused"], timeout=5)
    ckpt = operator(bot, "save-checkpoint run-9")
    resume = operator(bot, "resume run-9")
    assert [c["id"] for c in (pause, ckpt, resume)] == ["c1", "c2", "c3"]
    assert pause["apply_step"] > 190 + 200  # the lag covered
    assert ckpt["apply_step"] >= pause["apply_step"] and resume["apply_step"] >= ckpt["apply_step"]


def test_a_pause_the_job_did_not_apply_does_not_mark_the_run_paused(bot):
    """The bot learns pause/resume from the job's results before the next heartbeat: only a pause that
    really started says the run is paused, not one the job answered "not applied"."""
    from msmon.contract.wire import ActionResult, Envelope, Sample

    now = time.time()
    samples = [Sample(run_id="run-9", device="0", step=100 + k, time=now - 1.0 + 0.1 * k, loss=1.0) for k in range(10)]
    assert bot.request("POST", "/v1/ingest", encode(Envelope(run_id="run-9", device="0", sent_at=now, project="llm",
                                                             samples=samples)))[0] == 202
    pause, resume = operator(bot, "pause run-9"), operator(bot, "resume run-9")
    # the rank got the resume first and the pause after it had handled the resume (CommandOrder's answers)
    order = CommandOrder()
    order.offer(req(resume["id"], "resume", resume["apply_step"]))
    decided = order.decide(resume["apply_step"], 0.0)
    order.offer(req(pause["id"], "pause", pause["apply_step"]))
    decided += order.decide(resume["apply_step"] + 1, 0.1)
    assert [o.req.action for o in decided] == ["resume", "pause"] and decided[1].detail.startswith("not applied")
    for o in decided:
        res = ActionResult(run_id="run-9", device="0", step=resume["apply_step"], time=time.time(),
                           action=o.req.action, ok=True, detail=o.detail, command_id=o.req.command_id,
                           applied=o.kind != "skip", paused=False)  # as JobControl answers them
        env = Envelope(run_id="run-9", device="0", sent_at=time.time(), project="llm", actions=[res])
        assert bot.request("POST", "/v1/ingest", encode(env))[0] == 202
    assert wait_for(lambda: bot.store.commands.get(pause["id"])["status"] == "done", timeout=5)
    assert not bot.store.run("run-9")["paused"]


# -- end to end: a real MindSpore job, the real bot on loopback -----------------------------------------


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
def test_a_real_job_takes_pause_resume_ms_apart_and_a_3s_pause_raises_no_stall(bot, tmp_path):
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
