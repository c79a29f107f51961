"""The run and rank lifecycles (bot/runs/lifecycle.py): the tables, and hypothesis state machines over any
interleaving and reordering of heartbeats, envelopes and final heartbeats, restarts of the job (a new
process for every rank: a new attempt) and of the bot (everything it held in memory gone)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from bot.runs.lifecycle import (
    RANK_TABLE,
    RUN_TABLE,
    LifecycleError,
    RankInput,
    RankLife,
    RankPhase,
    RunInput,
    RunPhase,
    all_ended,
    end_input,
    ended_phase,
    new_attempt,
    on_message,
    run_step,
    silence,
    step,
    tick,
)

MISSING_AFTER = 30.0


def test_every_phase_takes_every_message_and_tick_input_or_says_why():
    for phase in RankPhase:
        for inp in (RankInput.RESTART, RankInput.STALE, RankInput.QUIET, RankInput.SILENT):
            assert (phase, inp) in RANK_TABLE
    with pytest.raises(LifecycleError):  # an ended process's message is classified STALE before it gets here
        step(RankLife(phase=RankPhase.ENDED), RankInput.REPORT)
    for phase in RunPhase:
        for inp in (RunInput.ALL_FINAL, RunInput.NEW_ATTEMPT, RunInput.NO_HEARTBEAT, RunInput.PROGRESS):
            assert (phase, inp) in RUN_TABLE
    assert run_step(RunPhase.GONE, RunInput.BOT_RESTART) is RunPhase.RUNNING


def test_a_heartbeat_overtaken_by_the_final_one_moves_nothing():
    life = RankLife()
    on_message(life, 1.0, proc="p", seq=41)
    assert on_message(life, 2.0, proc="p", seq=43, final=True) == [RankInput.FINAL]
    assert on_message(life, 3.0, proc="p", seq=42) == [RankInput.STALE]  # in flight while the final one went
    assert on_message(life, 4.0, proc="p") == [RankInput.STALE]  # an envelope retried after the final one
    assert life.phase is RankPhase.ENDED and life.last_seen == 2.0


def test_a_new_process_of_the_rank_restarts_it_and_the_old_ones_stay_stale():
    life = RankLife()
    on_message(life, 1.0, proc="a", seq=5, final=True)
    assert on_message(life, 2.0, proc="b", seq=1) == [RankInput.RESTART, RankInput.REPORT]
    assert life.phase is RankPhase.REPORTING and life.seq == 1
    assert on_message(life, 3.0, proc="a", seq=9) == [RankInput.STALE]


def test_a_missing_rank_stays_missing_when_the_others_finish():
    ranks = [RankLife() for _ in range(3)]
    for r in ranks:
        on_message(r, 0.0, proc=str(id(r)), seq=1)
    on_message(ranks[1], 40.0, proc=str(id(ranks[1])), seq=2)
    on_message(ranks[2], 40.0, proc=str(id(ranks[2])), seq=2)
    tick(ranks, 40.0, MISSING_AFTER / 2, MISSING_AFTER)
    assert ranks[0].phase is RankPhase.MISSING
    on_message(ranks[1], 41.0, proc=str(id(ranks[1])), seq=3, final=True)
    on_message(ranks[2], 41.0, proc=str(id(ranks[2])), seq=3, final=True)
    tick(ranks, 500.0, MISSING_AFTER / 2, MISSING_AFTER)
    assert ranks[0].phase is RankPhase.MISSING  # silent: never "back to normal" because the others finished
    assert not all_ended(ranks, None)


def test_a_rank_killed_just_before_the_others_finished_is_missing_not_late_for_ever():
    ranks = [RankLife() for _ in range(3)]
    for i, r in enumerate(ranks):
        on_message(r, 10.0, proc=f"p{i}", seq=1)  # rank 0's last word
    for r in ranks[1:]:
        on_message(r, 12.0, proc=r.proc, seq=2, final=True)  # the others finish after it fell silent
    tick(ranks, 20.0, MISSING_AFTER / 2, MISSING_AFTER)
    assert ranks[0].phase is RankPhase.REPORTING  # not silent for long yet
    tick(ranks, 10.0 + MISSING_AFTER + 1, MISSING_AFTER / 2, MISSING_AFTER)
    assert ranks[0].phase is RankPhase.MISSING
    early = [RankLife() for _ in range(2)]  # a rank that finished before the other fell silent outlived nothing
    on_message(early[0], 5.0, proc="a", seq=1, final=True)
    on_message(early[1], 10.0, proc="b", seq=1)
    tick(early, 100.0, MISSING_AFTER / 2, MISSING_AFTER)
    assert early[1].phase is RankPhase.LATE


def test_the_whole_run_falling_silent_at_once_makes_no_rank_missing():
    ranks = [RankLife() for _ in range(4)]
    for i, r in enumerate(ranks):
        on_message(r, 10.0, proc=f"p{i}", seq=1)
    tick(ranks, 100.0, MISSING_AFTER / 2, MISSING_AFTER)
    assert {r.phase for r in ranks} == {RankPhase.LATE}  # the watchdog's job_gone, not 4 missing ranks


def test_a_run_is_silent_only_from_the_bots_start():
    assert silence(100.0, 100.0, False, 1000.0, 60, 600) is RunInput.NO_HEARTBEAT
    assert silence(100.0, 100.0, False, 1000.0, 60, 600, since=990.0) is None  # the bot was down: a grace
    assert silence(100.0, 100.0, False, 1051.0, 60, 600, since=990.0) is RunInput.NO_HEARTBEAT
    assert silence(1000.0, 100.0, True, 1001.0, 60, 600) is None  # paused on purpose


def test_what_starts_a_new_attempt():
    assert new_attempt(RunPhase.ENDED, frozenset({"a"}), "b", False)
    assert new_attempt(RunPhase.GONE, frozenset({"a"}), "b", False)
    assert not new_attempt(RunPhase.GONE, frozenset({"a"}), "a", False)  # the same process, back
    assert not new_attempt(RunPhase.RUNNING, frozenset({"a"}), "b", False)  # another rank joining
    assert new_attempt(RunPhase.RUNNING, frozenset({"a"}), "b", True)  # a rank's process replaced
    assert not new_attempt(RunPhase.RUNNING, frozenset(), "", False)


@dataclasses.dataclass
class _Proc:
    rank: int
    proc: str
    seq: int = 0
    finished: bool = False


@dataclasses.dataclass
class _Msg:
    rank: int
    proc: str
    seq: int | None  # None: an envelope
    final: bool


class RanksMachine(RuleBasedStateMachine):
    """A job of a few ranks; its messages fly in any order; the job restarts; the bot restarts."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.attempt = 0
        self.n = 3
        self.procs: list[_Proc] = []
        self.flight: list[_Msg] = []
        self.lives: dict[int, RankLife] = {}
        self.final_seen: dict[int, str] = {}  # rank -> the process whose final heartbeat the bot took
        self.was_missing: dict[int, float] = {}  # rank -> its last_seen when it went missing
        self._start()

    def _start(self) -> None:
        self.attempt += 1
        self.procs = [_Proc(r, f"a{self.attempt}r{r}") for r in range(self.n)]

    @rule(r=st.integers(0, 2), final=st.booleans(), envelope=st.booleans())
    def send(self, r: int, final: bool, envelope: bool) -> None:
        p = self.procs[r]
        if p.finished:
            return
        if envelope and not final:
            self.flight.append(_Msg(r, p.proc, None, False))
            return
        p.seq += 1
        p.finished = final
        self.flight.append(_Msg(r, p.proc, p.seq, final))

    @precondition(lambda self: bool(self.flight))
    @rule(i=st.integers(0, 50))
    def deliver(self, i: int) -> None:
        msg = self.flight.pop(i % len(self.flight))
        life = self.lives.setdefault(msg.rank, RankLife())
        before = (life.phase, life.proc)
        inputs = on_message(life, self.now, proc=msg.proc, seq=msg.seq, final=msg.final)
        if inputs[-1] is RankInput.STALE:
            assert (life.phase, life.proc) == before
        elif msg.final:
            self.final_seen[msg.rank] = msg.proc
        if before[0] is RankPhase.ENDED and before[1] == msg.proc:
            assert life.phase is RankPhase.ENDED  # a late message of a process that said final moves nothing

    @rule(dt=st.sampled_from([1.0, 10.0, 31.0, 100.0]))
    def wait(self, dt: float) -> None:
        self.now += dt
        tick(self.lives.values(), self.now, MISSING_AFTER / 2, MISSING_AFTER)
        for r, life in self.lives.items():
            if life.phase is RankPhase.MISSING:
                self.was_missing.setdefault(r, life.last_seen)

    @rule()
    def job_restarts(self) -> None:
        self._start()

    @rule()
    def bot_restarts(self) -> None:
        self.lives.clear()
        self.final_seen.clear()
        self.was_missing.clear()

    @invariant()
    def no_rank_missing_that_said_it_finished(self) -> None:
        for r, proc in self.final_seen.items():
            life = self.lives[r]
            if life.proc == proc:
                assert life.phase is RankPhase.ENDED

    @invariant()
    def none_resolved_while_silent(self) -> None:
        for r, seen in list(self.was_missing.items()):
            life = self.lives[r]
            if life.last_seen == seen:
                assert life.phase is RankPhase.MISSING  # nothing new from it: still missing
            else:
                del self.was_missing[r]  # it spoke (or a new process of it did): may be back


TestRanks = RanksMachine.TestCase
TestRanks.settings = settings(max_examples=300, stateful_step_count=40, deadline=None,
                              suppress_health_check=[HealthCheck.too_slow])


# -- the view across ranks (bot/ranks/view.py, missing.py) over the lifecycle ---------------------------


def _views():
    from bot.ranks.view import RankViews

    return RankViews(10, 1000, 8)


def _check(now: float):
    from bot.config import RanksConfig
    from bot.ranks.rule import Check

    return Check(now, RanksConfig(missing_after=MISSING_AFTER))


@settings(max_examples=200, deadline=None)
@given(st.integers(2, 12), st.randoms(use_true_random=False))
def test_ranks_closing_together_in_any_order_are_ended_and_never_missing(n, rnd):
    """Each rank's heartbeats, envelopes and final heartbeat, delivered in any order within a second (a
    regular heartbeat overtaken by the final one included): every rank ends, none is ever missing."""
    from bot.ranks import missing
    from msmon.contract.wire import Envelope, Heartbeat, Sample

    msgs = []
    for r in range(n):
        proc = f"p{r}"
        for k in range(1, 4):
            msgs.append(Heartbeat(run_id="r", device=str(r), time=0.0, step=k, rank=r, world=n, proc=proc, seq=k))
            msgs.append(Envelope(run_id="r", device=str(r), sent_at=0.0, rank=r, proc=proc, samples=[
                Sample(run_id="r", device=str(r), step=k, time=0.0, loss=1.0)]))
        msgs.append(Heartbeat(run_id="r", device=str(r), time=0.0, step=3, rank=r, world=n, proc=proc, seq=4,
                              final=True))
    rnd.shuffle(msgs)
    views = _views()
    for i, m in enumerate(msgs):
        now = 100.0 + i / len(msgs)
        if isinstance(m, Heartbeat):
            views.heartbeat(m, now)
        else:
            views.envelope(m, now)
    run = views.runs["r"]
    assert run.ended(n)
    for later in (101.0, 120.0, 200.0, 10_000.0):
        assert missing.judge(_check(later), run) == []


def test_a_process_reporting_several_devices_ends_them_all_with_its_final_heartbeat():
    from msmon.contract.wire import Envelope, Heartbeat, Sample

    views = _views()
    views.envelope(Envelope(run_id="r", device="0", sent_at=0.0, proc="p", samples=[
        Sample(run_id="r", device=str(d), step=1, time=0.0) for d in range(4)]), 1.0)
    views.heartbeat(Heartbeat(run_id="r", device="0", time=0.0, step=1, proc="p", seq=9, final=True), 2.0)
    assert views.runs["r"].ended()


def test_the_run_table_is_total_and_only_a_new_attempt_leaves_ended():
    assert set(RUN_TABLE) == {(p, i) for p in RunPhase for i in RunInput}
    for done in (RunPhase.ENDED, RunPhase.FAILED):
        assert {i for (p, i), to in RUN_TABLE.items() if p is done and to is not done} == {RunInput.NEW_ATTEMPT}
    assert {p for (p, i), to in RUN_TABLE.items() if i is RunInput.NO_HEARTBEAT} == set(RunPhase)
    live = set(RunPhase) - {RunPhase.ENDED, RunPhase.FAILED}
    assert {p for p in live if RUN_TABLE[(p, RunInput.DIED)] is RunPhase.FAILED} == live  # a dying run fails
    assert RUN_TABLE[(RunPhase.ENDED, RunInput.DIED)] is RunPhase.ENDED  # a second end moves nothing
    assert RUN_TABLE[(RunPhase.PAUSED, RunInput.NO_PROGRESS)] is RunPhase.PAUSED  # paused on purpose: no stall


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(list(RunInput)), max_size=40))
def test_any_sequence_of_run_inputs_moves_by_the_table(inputs):
    phase = RunPhase.RUNNING
    for inp in inputs:
        before, phase = phase, run_step(phase, inp)
        if before in (RunPhase.ENDED, RunPhase.FAILED) and inp is not RunInput.NEW_ATTEMPT:
            assert phase is before  # a late message, a tick or a bot restart never revives an ended run


@given(st.integers(0, 64), st.integers(0, 64), st.integers(0, 64), st.none() | st.integers(1, 128), st.booleans())
def test_a_run_ends_when_every_rank_ended_or_is_missing_and_fails_when_it_dies(ended, missing, extra, world, error):
    ranks = ended + missing + extra  # `extra`: ranks still reporting (or late)
    inp = end_input(ended, missing, ranks, world, error)
    if extra or ended == 0 or ended + missing < (world or 0):
        assert inp is None  # some rank goes on, none said final, or the job's world is not all here
    elif missing or error:
        assert inp is RunInput.DIED  # ended while an ERROR fired or with a rank missing: it died
    else:
        assert inp is RunInput.ALL_FINAL


def test_an_ended_attempts_phase_is_read_from_its_end_reason():
    assert ended_phase("failed: while ERRORs fired: loss_nan on device 0 since step 9") is RunPhase.FAILED
    for reason in ("ended normally", "gone", "replaced by attempt 2", None):
        assert ended_phase(reason) is RunPhase.ENDED
