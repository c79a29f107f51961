"""The delivery worker's step for a group (bot/delivery/plan.py): pure, so every case is checked here and
the worker only carries it out (tests/bot/delivery/test_faults.py and the receivers' tests drive it)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bot.delivery.plan import Known, Op, Step, step

CASES = [
    # kind, known, step
    ("alert", Known(), Step(Op.POST, as_root=True)),  # the run's first message in the channel
    ("alert", Known(root="r1"), Step(Op.POST)),  # an ERROR: its own post, the run already has a root
    ("alert", Known(root="r1", thread=True), Step(Op.REPLY, "r1", keep_reply=True)),  # a WARNING: in the thread
    ("alert", Known(thread=True), Step(Op.POST, as_root=True)),  # a WARNING with no thread yet starts one
    ("alert", Known(own="m1", root="r1", thread=True), Step(Op.UPDATE, "m1")),  # more devices joined
    ("alert", Known(posted="m2", own="m1"), Step(Op.ATTACH, "m2")),  # the text went out: its chart is left
    ("repeat", Known(), Step(Op.POST)),
    ("repeat", Known(own="m1"), Step(Op.REPLY, "m1")),
    ("repeat", Known(posted="m2", own="m1"), Step(Op.ATTACH, "m2")),
    ("resolve", Known(), Step(Op.NOTHING)),  # nothing was posted for the episode
    ("resolve", Known(firing="f1"), Step(Op.REPLY, "f1")),  # one device of several resolved
    ("resolve", Known(firing="f1", all_resolved=True), Step(Op.REPLY, "f1", close="f1")),
    ("resolve", Known(firing="f1", all_resolved=True, posted="f1"), Step(Op.NOTHING, close="f1")),  # a retry
]


@pytest.mark.parametrize(("kind", "known", "expected"), CASES)
def test_each_case_of_the_table(kind: str, known: Known, expected: Step) -> None:
    assert step(kind, known) == expected


refs = st.one_of(st.none(), st.sampled_from(["a", "b", "c"]))


@given(st.sampled_from(["alert", "repeat", "resolve"]),
       st.builds(Known, posted=refs, own=refs, root=refs, thread=st.booleans(), firing=refs,
                 all_resolved=st.booleans()))
def test_any_state_gives_one_step_naming_a_message_the_store_knows(kind: str, known: Known) -> None:
    s = step(kind, known)
    known_refs = {known.posted, known.own, known.root, known.firing} - {None}
    if s.op in (Op.REPLY, Op.UPDATE, Op.ATTACH):
        assert s.ref in known_refs  # never a reply to or a rewrite of a message that is not there
    else:
        assert s.ref is None
    if known.posted is not None and kind != "resolve":
        assert s.op is Op.ATTACH  # a message that went out is never posted twice
    if kind == "resolve":
        assert s.op in (Op.REPLY, Op.NOTHING) and (s.close is None or s.close == known.firing)
        assert (s.close is not None) == (known.firing is not None and known.all_resolved)
