"""The bot's view of a run across its ranks: the latest of each rank, and their spread.

Fed by the ingest (bot/ingest/envelope.py) with what each rank's envelope carries, read by the cross-rank rules
(bot/ranks/__init__.py) and by `status`. Nothing here asks a job for anything: the ranks' own reports,
aggregated in the bot, are the whole input, so monitoring adds no collective and no work to a job.

Bounded: `max_runs` runs (the least recently seen forgotten first), `max_ranks` ranks a run (a rank
beyond that is counted in `refused`, not kept), `history` recent step times a rank. Time is the bot's
clock (when a rank was last heard from), passed in; the job's clock is only shown.
"""

from __future__ import annotations

import dataclasses
import math
from collections import OrderedDict, deque
from collections.abc import Iterable

from bot.ranks.stats import Spread, median_of_sorted
from bot.runs.lifecycle import RankInput, RankLife, RankPhase, all_ended, on_message
from msmon.contract.wire import Envelope, Heartbeat, Sample, Severity

TYPICAL_FROM = 3  # samples a rank needs before its typical loss and norm are compared


def member_key(rank: int | None, device: str) -> str:
    """How the bot names one rank of a run: its rank in the job's world when the job says it, else its
    device (a single process reporting several devices, or a notifier that does not send its rank)."""
    return str(rank) if rank is not None else device


@dataclasses.dataclass
class RankState:
    """The latest report of one rank (None: not reported), and its own recent step times."""

    key: str
    rank: int | None
    device: str
    host: str = ""
    step: int | None = None  # the newest step it reported (a sample's or a heartbeat's)
    sample_step: int | None = None  # the step of its latest sample, whose metrics these are
    loss: float | None = None
    grad_norm: float | None = None  # the reduced gradient's norm, as the job reports it
    local_grad_norm: float | None = None  # this rank's own norm, before the all-reduce
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    step_time: float | None = None
    data_time: float | None = None  # its own mean input wait per step (the step time is the slowest rank's)
    time: float | None = None  # the job's clock at its latest sample
    # its lifecycle (bot/runs/lifecycle.py): phase, process, newest heartbeat number, when last heard (bot's clock)
    life: RankLife = dataclasses.field(default_factory=RankLife)
    history: deque[float] = dataclasses.field(default_factory=deque)  # recent step times (or 1/throughput)
    losses: deque[float] = dataclasses.field(default_factory=deque)  # recent finite losses
    norms: deque[float] = dataclasses.field(default_factory=deque)  # recent finite own grad norms
    waits: deque[float] = dataclasses.field(default_factory=deque)  # recent input waits (data_time)

    @property
    def last_seen(self) -> float:
        """The bot's clock at its latest message of its current process."""
        return self.life.last_seen

    @property
    def ended(self) -> bool:
        """Its final heartbeat came: it finished normally."""
        return self.life.phase is RankPhase.ENDED

    @property
    def missing(self) -> bool:
        return self.life.phase is RankPhase.MISSING

    @property
    def paused(self) -> bool:
        return self.life.paused

    def name(self) -> str:
        """"rank 3 (device 3 on node-2)": how a message names it (job data: the receiver escapes it)."""
        where = [f"device {self.device}"] if self.rank is None or self.device != str(self.rank) else []
        if self.host:
            where.append(f"on {self.host}")
        who = f"rank {self.rank}" if self.rank is not None else f"device {self.device}"
        if self.rank is None:
            where = where[1:]
        return f"{who} ({' '.join(where)})" if where else who

    def seconds_per_step(self) -> float | None:
        """Its step time, or the inverse of its throughput when that is all it reports."""
        if self.step_time is not None and self.step_time > 0 and math.isfinite(self.step_time):
            return self.step_time
        return None

    def pace(self) -> float | None:
        """The median of its recent step times: its own usual pace, which one slow step (a checkpoint, a
        compile) does not move."""
        xs = sorted(self.history)
        return median_of_sorted(xs) if xs else None

    def usual_wait(self) -> float | None:
        """The median of its recent input waits: how long it usually waits for its input each step."""
        xs = sorted(self.waits)
        return median_of_sorted(xs) if xs else None

    def typical(self, what: str) -> float | None:
        """The median of its recent losses ("loss") or own grad norms ("norm"): what it keeps at, which one
        noisy batch does not move."""
        ring = self.losses if what == "loss" else self.norms
        if len(ring) < min(TYPICAL_FROM, ring.maxlen or 1):
            return None  # a median of one or two says no more than the values themselves
        return median_of_sorted(sorted(ring))

    def norm(self) -> float | None:
        """The grad norm to compare across ranks: its own (local) norm when reported; the reduced norm is
        the same on every rank of a data-parallel job and says nothing about one rank."""
        return self.local_grad_norm if self.local_grad_norm is not None else self.grad_norm


@dataclasses.dataclass
class Firing:
    """What the rules last said about one rank (the tracker's memory): how many checks in a row a rule's
    condition held (for the rules that judge samples: on a new sample each), the severity it is firing at
    (None: not firing), and the step of the sample last counted."""

    streak: int = 0
    severity: Severity | None = None
    counted: int | None = None


class RunRanks:
    """One run's ranks, and the rules' memory for it."""

    def __init__(self, run_id: str, max_ranks: int, history: int, heard_ids: set[str] | None = None) -> None:
        self.run_id, self.max_ranks, self.history = run_id, max_ranks, history
        self._heard_ids = heard_ids if heard_ids is not None else set()  # its views' (RankViews.heard_ids)
        self.members: dict[str, RankState] = {}
        self.refused = 0  # samples of ranks past max_ranks
        self.world: int | None = None  # the job's world size, as its heartbeats say it (RANK_SIZE)
        self.retired: frozenset[str] = frozenset()  # processes of the run's earlier attempts: their messages are stale
        self.firing: dict[tuple[str, str], Firing] = {}  # (rule, rank key) -> its state
        # (host, device) -> rank key: a heartbeat posted on its own names its device and host, not its rank
        # (device ids repeat across hosts); (None, device) for the first rank seen with that device
        self.by_device: dict[tuple[str | None, str], str] = {}
        self._heard = float("-inf")

    @property
    def heard(self) -> float:
        """When one of its ranks was last heard from: a check passes over a quiet run."""
        return self._heard

    @heard.setter
    def heard(self, now: float) -> None:
        self._heard = now
        self._heard_ids.add(self.run_id)  # the next check looks at it, without looking at every run

    def procs(self) -> frozenset[str]:
        """Every process this run's view has seen (its ranks' current and earlier ones, earlier attempts')."""
        return self.retired.union(*({m.life.proc, *m.life.past} for m in self.members.values())) - {""}

    def member(self, rank: int | None, device: str, host: str) -> RankState | None:
        key = member_key(rank, device)
        m = self.members.get(key)
        if m is None:
            if len(self.members) >= self.max_ranks:
                self.refused += 1
                return None
            m = self.members[key] = RankState(key, rank, device, host, history=deque(maxlen=self.history),
                                              losses=deque(maxlen=self.history), norms=deque(maxlen=self.history),
                                              waits=deque(maxlen=self.history))
            self.by_device.setdefault((host, device), key)
            self.by_device.setdefault((None, device), key)
        else:
            if host and m.host != host:
                m.host = host
            if rank is not None and m.rank is None:  # first heard of by a heartbeat of its own, which has no rank
                m.rank = rank
        return m

    def add(self, m: RankState, s: Sample) -> None:
        if m.sample_step is not None and s.step < m.sample_step:
            return  # an older sample (a retried envelope arriving late): the latest stays
        m.sample_step, m.time = s.step, s.time
        m.step = s.step if m.step is None else max(m.step, s.step)
        m.loss, m.grad_norm, m.local_grad_norm = s.loss, s.grad_norm, s.local_grad_norm
        m.samples_per_s, m.tokens_per_s, m.step_time = s.samples_per_s, s.tokens_per_s, s.step_time
        m.data_time = s.data_time
        spp = m.seconds_per_step()
        if spp is not None:
            m.history.append(spp)
        if s.data_time is not None and 0.0 <= s.data_time < math.inf:
            m.waits.append(s.data_time)
        if m.loss is not None and m.loss - m.loss == 0.0:
            m.losses.append(m.loss)
        norm = m.norm()
        if norm is not None and norm - norm == 0.0:
            m.norms.append(norm)

    def ended(self, world: int | None = None) -> bool:
        """Every rank of the run said final (and as many as the job's world, when it said its size)."""
        return all_ended((m.life for m in self.members.values()), world)

    def live(self) -> list[RankState]:
        """The ranks that are part of the run now: every one but those that finished normally."""
        return [m for m in self.members.values() if not m.ended]

    def spread(self, what: str) -> Spread | None:
        """The spread across live ranks of one of: step, loss, norm (the ranks' own grad norms), grad_norm
        (the reduced one), step_time, data_time, tokens_per_s, samples_per_s."""
        return Spread.of(_value(m, what) for m in self.live())

    def mean_local_norm(self) -> float | None:
        """The mean of the ranks' own grad norms: the global view's "grad norm, one way" (the other is the
        reduced gradient's norm, `spread('grad_norm')`, where the job reports it)."""
        xs = [m.local_grad_norm for m in self.live() if m.local_grad_norm is not None
              and math.isfinite(m.local_grad_norm)]
        return sum(xs) / len(xs) if xs else None


def _value(m: RankState, what: str) -> float | None:
    if what == "norm":
        return m.norm()
    if what == "step":
        return None if m.step is None else float(m.step)
    v = getattr(m, what)
    return None if v is None else float(v)


class RankViews:
    """Every run's ranks (bot/shared.py's `BotState.ranks`)."""

    def __init__(self, max_runs: int, max_ranks: int, history: int) -> None:
        self.max_runs, self.max_ranks, self.history = max_runs, max_ranks, history
        self.runs: OrderedDict[str, RunRanks] = OrderedDict()
        # What a check with `since` looks at, so that it costs the runs that reported, not every run kept: the runs
        # heard from since the previous check (a run's `heard` set adds it), and those whose rules held a streak or
        # an alert at it (bot/ranks/__init__.py's check keeps both)
        self.heard_ids: set[str] = set()
        self.alerting: set[str] = set()

    def run(self, run_id: str, create: bool = False) -> RunRanks | None:
        r = self.runs.get(run_id)
        if r is None and create:
            r = self.runs[run_id] = RunRanks(run_id, self.max_ranks, self.history, self.heard_ids)
            while len(self.runs) > self.max_runs:
                self.runs.popitem(last=False)
        elif r is not None:
            self.runs.move_to_end(run_id)
        return r

    def envelope(self, env: Envelope, now: float) -> None:
        """What one envelope says of its ranks: its samples (each device of it a rank; the envelope's own
        device is the rank it names), heartbeats, and that they were heard from now."""
        run = self.run(env.run_id, create=True)
        assert run is not None
        if env.proc and env.proc in run.retired:
            return  # late, from a process of an earlier attempt
        run.heard = now
        for s in env.samples:
            m = run.member(env.rank if s.device == env.device else None, s.device, env.host)
            if m is not None and on_message(m.life, now, proc=env.proc)[-1] is not RankInput.STALE:
                run.add(m, s)
        self._beats(run, env.rank, env.device, env.host, env.heartbeats, now)
        if env.events or env.actions:
            m = run.member(env.rank, env.device, env.host)
            if m is not None:
                on_message(m.life, now, proc=env.proc)

    def heartbeat(self, hb: Heartbeat, now: float) -> None:
        """A heartbeat posted on its own (POST /v1/heartbeat): liveness of its rank (the rank it names; an
        older notifier's names none: the rank of that host and device)."""
        run = self.run(hb.run_id, create=True)
        assert run is not None
        if hb.proc and hb.proc in run.retired:
            return  # late, from a process of an earlier attempt
        run.heard = now
        run.world = hb.world or run.world
        if hb.rank is not None:
            m = run.member(hb.rank, hb.device, hb.host)
        else:
            key = run.by_device.get((hb.host, hb.device)) or \
                (None if hb.host else run.by_device.get((None, hb.device)))
            m = run.members.get(key) if key is not None else run.member(None, hb.device, hb.host)
        if m is not None:
            self._beat(run, m, hb, now)

    def _beats(self, run: RunRanks, rank: int | None, device: str, host: str, hbs: Iterable[Heartbeat],
               now: float) -> None:
        for hb in hbs:
            run.world = hb.world or run.world
            m = run.member(hb.rank if hb.rank is not None else rank if hb.device == device else None,
                           hb.device, hb.host or host)
            if m is not None:
                self._beat(run, m, hb, now)

    @staticmethod
    def _beat(run: RunRanks, m: RankState, hb: Heartbeat, now: float) -> None:
        """A heartbeat, in the job's own order: one older than what was seen of its process moves nothing. A
        final one ends every rank its process reported for (a process reporting several devices)."""
        if on_message(m.life, now, proc=hb.proc, seq=hb.seq, final=hb.final, paused=hb.paused)[-1] \
                is RankInput.STALE:
            return
        if hb.step is not None and (m.step is None or hb.step > m.step):
            m.step = hb.step
        if hb.final and hb.proc:
            for other in run.members.values():
                if other is not m and other.life.proc == hb.proc and not other.ended:
                    on_message(other.life, now, proc=hb.proc, final=True)

    def known(self, run_id: str) -> int:
        """How many ranks the bot knows in a run (0: none)."""
        r = self.runs.get(run_id)
        return len(r.members) if r is not None else 0

    def rank_of(self, run_id: str, device: str) -> int | None:
        r = self.runs.get(run_id)
        if r is None:
            return None
        m = r.members.get(device)
        if m is None:
            key = r.by_device.get((None, device))
            m = r.members.get(key) if key is not None else None
        return None if m is None else m.rank
