"""The order commands of one run take effect in, as the pure `CommandOrder` (notifier/control/order.py) decides it:
a resume cancels a pending pause, a stop always applies (paused or not), the job never stays paused after a
trailing resume or stop; table-driven, and a hypothesis property over any interleaving and duplication of
deliveries. No MindSpore here: tests/e2e/test_command_order.py drives JobControl with a real MindSpore network
and a real job through the bot."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from notifier.control import CommandOrder, Outcome, Request, acceptance_order

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
