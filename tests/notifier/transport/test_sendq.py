"""The job's send queue (notifier/sendq/), a pure state machine: every delivery failure the issue
"Delivery you can trust" reports is a table row here, then a property suite drives it with any mix
of enqueues, answers, malformed answers, refusals, partial acceptance, time and restarts."""

from __future__ import annotations

import email.utils
import itertools
import random
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from msmon.common.retry import retry_after
from msmon.contract.wire import ActionResult, Event, Sample, Severity, Status
from notifier.sendq import Batch, Fault, Limits, SendQueue, Tier, classify, judge
from notifier.transport import Spool

_ids = itertools.count(1)


def event(sev: Severity = Severity.ERROR, status: Status = Status.FIRING, rule: str = "grad_norm",
          message: str = "m") -> Event:
    n = next(_ids)
    return Event(run_id="r", device="0", step=n, time=float(n), rule=rule, severity=sev, status=status,
                 value=1.0, threshold=1.0, message=message)


def sample() -> Sample:
    n = next(_ids)
    return Sample(run_id="r", device="0", step=n, time=float(n), loss=1.0)


def action() -> ActionResult:
    n = next(_ids)
    return ActionResult(run_id="r", device="0", step=n, time=float(n), action="save_checkpoint", ok=True, detail="d")


def queue(**kw) -> SendQueue:
    kw.setdefault("flush_interval", 0.0)
    kw.setdefault("backoff", (1.0, 30.0))
    return SendQueue(Limits(**kw), random.Random(7))


def drain(q: SendQueue, now: float = 1000.0) -> list:
    """Accept every batch until the queue is empty; returns the items in delivery order."""
    out = []
    for _ in range(10_000):
        due = q.next_due(now)
        if due is None:
            return out
        now = max(now, due)
        b = q.take(now)
        assert b is not None, "due but nothing to take"
        out.extend(b.items)
        q.accepted(b, now)
    raise AssertionError("the queue never drained")


# -- the edge's pure helpers ----------------------------------------------------------------------

NOW = 1_700_000_000.0


@pytest.mark.parametrize(("header", "expected"), [
    (None, None), ("", None), ("  ", None),
    ("5", 5.0), ("0.25", 0.25), (" 7 ", 7.0),
    ("inf", 30.0), ("Infinity", 30.0), ("1e999", 30.0),  # bounded, never an endless sleep
    ("-5", 0.0), ("-inf", 0.0),  # negative: at once
    ("nan", None), ("soon, maybe", None), ("Tue, 99 Foo 2026", None), ("\x00", None),  # garbage: usual backoff
    (email.utils.formatdate(NOW + 12, usegmt=True), 12.0),  # an HTTP date
    (email.utils.formatdate(NOW - 600, usegmt=True), 0.0),  # in the past
    (email.utils.formatdate(NOW + 86_400 * 365, usegmt=True), 30.0),  # far away: bounded
    ("Tue, 01 Dec 2026 10:00:00", None),  # a date without a zone is not an HTTP date
])
def test_retry_after_is_bounded_whatever_the_header_says(header, expected):
    got = retry_after(header, NOW, cap=30.0)
    assert got == (pytest.approx(expected, abs=1.0) if expected is not None else None)


@pytest.mark.parametrize(("status", "body", "fault"), [
    (200, b"{}", None), (202, b'{"accepted": {"events": 1}, "commands": []}', None),
    (200, b'{"accepted": tru', Fault.BAD_ANSWER),  # garbage JSON
    (200, b'{"a": [}', Fault.BAD_ANSWER), (200, b"<html>captive portal</html>", Fault.BAD_ANSWER),
    (200, b"[1, 2]", Fault.BAD_ANSWER), (200, b"", Fault.BAD_ANSWER),
    (401, b"", Fault.AUTH), (403, b"{}", Fault.AUTH), (413, b"", Fault.TOO_LARGE),
    (429, b"", Fault.RATE_LIMITED), (400, b"", Fault.REJECTED), (422, b"{}", Fault.REJECTED),
    (500, b"<html>oops</html>", Fault.SERVER), (503, b"", Fault.SERVER), (302, b"", Fault.SERVER),
])
def test_an_answer_is_judged_by_status_and_body(status, body, fault):
    assert judge(status, body) is fault


@pytest.mark.parametrize(("item", "cls", "tier"), [
    (event(Severity.ERROR), "errors", Tier.HIGH),
    (event(Severity.ERROR, Status.RESOLVED), "resolutions", Tier.HIGH),
    (event(Severity.WARNING), "warnings", Tier.MID),
    (event(Severity.WARNING, Status.RESOLVED), "resolutions", Tier.MID),
    (sample(), "samples", Tier.LOW),
    (action(), "actions", Tier.HIGH),
])
def test_classes(item, cls, tier):
    assert classify(item) == (cls, tier)


# -- each failure of the issue, as a row ------------------------------------------------------------

RETRYABLE = [f for f in Fault if not f.refuses_data]


@pytest.mark.parametrize("fault", RETRYABLE)
def test_a_failed_batch_goes_back_in_place(fault):
    q = queue()
    items = [event(), sample(), event(Severity.WARNING), action()]
    for x in items:
        q.enqueue(x, 0.0, 10)
    b = q.take(0.0)
    assert b is not None and len(b.entries) == 4
    out = q.failed(b, 0.0, fault)
    assert out.first_of_kind and q.pending() == 4 and q.connected is False
    assert not q.failed(q.take(100.0) or b, 100.0, fault).first_of_kind  # logged once, not per retry
    assert drain(q) == [items[3], items[0], items[2], items[1]]  # actions, events, samples: each once
    assert q.dropped == {} and q.delivered == 4


def test_1200_items_first_post_accepted_next_ones_fail_nothing_lost_nothing_twice():
    q = queue(batch_max=500)
    items = [event(Severity.ERROR if i % 3 == 0 else Severity.WARNING) for i in range(1200)]
    for x in items:
        q.enqueue(x, 0.0, 100)
    delivered = []
    b = q.take(0.0)
    assert b is not None
    delivered += b.items
    q.accepted(b, 0.0)
    now = 0.0
    for _ in range(3):
        now = q.next_due(now) or now
        b = q.take(now)
        assert b is not None
        q.failed(b, now, Fault.SERVER)
    delivered += drain(q, now)
    assert delivered == items
    assert q.dropped == {}


def test_after_an_outage_episodes_keep_their_order_and_resolutions_outlive_their_firings():
    q = queue(max_queue=30)
    raised = []
    for i in range(40):
        for status in (Status.FIRING, Status.RESOLVED):
            sev = Severity.ERROR if i % 4 == 0 else Severity.WARNING
            e = event(sev, status, rule=f"r{i % 5}")
            raised.append(e)
            q.enqueue(e, 0.0, 50)
        for _ in range(5):
            q.enqueue(sample(), 0.0, 20)
    b = q.take(0.0)
    assert b is not None
    q.failed(b, 0.0, Fault.UNREACHABLE)
    got = [x for x in drain(q) if isinstance(x, Event)]
    assert got == [e for e in raised if e in got]  # the order they were raised in
    ids = {id(e) for e in got}
    for e in raised:
        if e.severity is Severity.ERROR:
            assert id(e) in ids  # every ERROR episode, whole
    pairs = list(zip(raised[::2], raised[1::2], strict=True))
    assert all(id(r) in ids for f, r in pairs if id(f) in ids)  # a kept firing keeps its resolution
    assert q.dropped["samples"] == 200 and q.dropped.get("errors", 0) == 0


def test_the_spool_bound_holds_errors_too_samples_and_warnings_make_room_first():
    """max_bytes (spool_max_mb) bounds every tier: samples, then warnings make room for an ERROR; an ERROR
    that would not fit even so is refused at once (counted, reported), and one taken is never dropped."""
    q = queue(max_queue=10, max_bytes=10_000)
    for _ in range(20):
        q.enqueue(sample(), 0.0, 100)
    for _ in range(5):
        q.enqueue(event(Severity.WARNING), 0.0, 100)
    assert q.dropped == {"samples": 15}  # max_queue: 10 items
    took = [q.enqueue(event(Severity.ERROR), 0.0, 4000) for _ in range(3)]
    assert took == [True, True, False] and q.refused == {"errors": 1}
    assert q.enqueue(event(Severity.ERROR), 0.0, 1500)  # fits once the samples go
    assert q.stats()["bytes"] <= 10_000 and q.stats()["high"] == 3
    assert q.dropped == {"samples": 20, "errors": 1}
    assert q.unreported() == q.dropped  # reported in the next envelope


def test_samples_in_flight_never_refuse_an_error_and_the_spool_file_holds_the_bound_all_the_same():
    """A batch of samples is in flight when ERRORs come: the ERRORs are taken (the samples in flight do not count
    against them), the queue passes the bound by those samples until the request settles, and the spool file written
    meanwhile holds the bound: it leaves out the samples in flight that do not fit, never an ERROR. When the request
    fails, the samples come back and are evicted first; nothing is lost uncounted."""
    q = queue(max_queue=100, max_bytes=1_000, batch_max=50)
    for _ in range(8):
        q.enqueue(sample(), 0.0, 100)
    batch = q.take(1000.0)
    assert batch is not None and len(batch.entries) == 8  # 800 bytes of samples in flight
    errors = [event(Severity.ERROR) for _ in range(3)]
    assert all(q.enqueue(e, 0.0, 300) for e in errors)  # 900 bytes of ERRORs: taken
    assert q.stats()["bytes"] == 1_700  # the queue passes the bound by the samples in flight
    kept = q.spool_entries()
    assert sum(e.size for e in kept) <= 1_000
    assert [e.item for e in kept if e.tier is Tier.HIGH] == errors  # every ERROR in the file
    # (sizes here are nominal; the file's real bytes under the real transport: tests/bot/runs/test_job_drops.py)
    q.failed(batch, 1001.0, Fault.UNREACHABLE)
    assert q.stats()["bytes"] <= 1_000 and q.stats()["high"] == 3  # back, and the samples evicted first
    assert q.dropped == {"samples": 7} and q.refused == {}  # 700 bytes over: 7 of them
    assert sum(e.size for e in q.spool_entries()) <= 1_000


def test_the_error_cap_refuses_counts_and_reports_when_reached():
    q = queue(max_high=5)
    assert all(q.enqueue(event(), 0.0, 10) for _ in range(5))
    assert not q.cap_reached
    assert not q.enqueue(event(), 0.0, 10)
    assert not q.enqueue(action(), 0.0, 10)
    assert q.enqueue(event(status=Status.RESOLVED), 0.0, 10)  # a resolution is still taken
    assert q.cap_reached and q.refused == {"errors": 1, "actions": 1} and q.dropped == q.refused


def test_drop_counts_go_out_once_and_only_when_accepted():
    q = queue(max_queue=1)
    q.enqueue(sample(), 0.0, 1)
    q.enqueue(sample(), 0.0, 1)
    b = q.take(0.0)
    assert b is not None and b.dropped == {"samples": 1}
    q.failed(b, 0.0, Fault.TIMEOUT)
    assert q.unreported() == {"samples": 1}
    b = q.take(100.0)
    assert b is not None
    out = q.accepted(b, 100.0)
    assert out.reported == {"samples": 1} and out.recovered and q.unreported() == {}
    assert q.take(200.0) is None


def test_an_error_rings_the_sender_out_of_its_backoff_with_a_small_probe():
    q = queue(backoff=(1.0, 30.0), probe_interval=0.5, probe_max=2)
    for _ in range(100):
        q.enqueue(sample(), 0.0, 10)
    now = 0.0
    for _ in range(6):  # the backoff grows to ~30 s
        now = q.next_due(now) or now
        b = q.take(now)
        assert b is not None
        q.failed(b, now, Fault.UNREACHABLE, wait=None)
    assert q.next_due(now) - now > 10
    q.enqueue(event(), now + 1.0, 10)
    assert q.next_due(now) <= now + 1.5  # within the probe interval of the enqueue
    b = q.take(now + 1.5)
    assert b is not None and b.probe and len(b.entries) == 1  # no samples in a probe
    q.accepted(b, now + 1.5)
    assert q.next_due(now + 1.5) <= now + 1.5  # the bot is back: the rest at once


@pytest.mark.parametrize("wait", [None, 0.0, 1e9, 30.0, 5.0])
def test_backoff_is_jittered_exponential_and_bounded(wait):
    q = queue(backoff=(0.5, 8.0))
    q.enqueue(sample(), 0.0, 10)
    now, delays = 0.0, []
    for _ in range(10):
        now = q.next_due(now) or now
        b = q.take(now)
        assert b is not None
        delays.append(q.failed(b, now, Fault.SERVER, wait).delay)
    assert all(0.0 <= d <= 8.0 for d in delays)
    if wait is None:
        assert 0.25 <= delays[0] <= 0.5 and delays[-1] >= 4.0 and len(set(delays)) == 10
    else:
        assert delays == [min(wait, 8.0)] * 10


def test_partial_acceptance_puts_the_rest_back_first():
    q = queue(batch_max=5)
    items = [event() for _ in range(8)]
    for x in items:
        q.enqueue(x, 0.0, 10)
    b = q.take(0.0)
    assert b is not None
    q.accepted(b, 0.0, count=2)
    assert drain(q) == items[2:]


def test_a_refused_item_is_isolated_and_dead_lettered_alone():
    q = queue(batch_max=8)
    items = [event(message="poison" if i == 5 else "m") for i in range(20)]
    for x in items:
        q.enqueue(x, 0.0, 10)
    delivered, dead, now = [], [], 0.0
    for _ in range(200):
        due = q.next_due(now)
        if due is None:
            break
        b = q.take(max(now, due))
        assert b is not None
        if any(x.message == "poison" for x in b.items):
            dead += q.failed(b, now, Fault.REJECTED).dead
        else:
            delivered += b.items
            q.accepted(b, now)
    assert delivered == [x for x in items if x.message != "poison"]
    assert [d.item for d in dead] == [items[5]] and q.dead == {"errors": 1} and q.dropped == {}


def test_one_batch_in_flight_and_a_stale_answer_is_refused():
    q = queue()
    q.enqueue(event(), 0.0, 10)
    b = q.take(0.0)
    assert b is not None and q.take(0.0) is None
    q.accepted(b, 0.0)
    with pytest.raises(ValueError, match="not the one in flight"):
        q.accepted(b, 0.0)


def test_a_restart_sends_the_spool_first_in_order():
    q = queue()
    old = [event(), sample(), event(Severity.WARNING)]
    for x in old:
        q.enqueue(x, 0.0, 10)
    b = q.take(0.0)
    assert b is not None
    q.failed(b, 0.0, Fault.UNREACHABLE)
    assert q.persist_due(0.0)
    spooled = q.snapshot()
    q.persisted(0.0, len(spooled))
    again = queue()
    new = event()
    again.enqueue(new, 0.0, 10)
    again.restore([(x, bytes(10)) for x in spooled], 0.0)
    assert drain(again) == [old[0], old[2], new, old[1]]
    assert again.persist_due(5000.0)  # the spool holds what the bot has now: rewrite it


def test_persisting_follows_the_bot():
    q = queue(persist_interval=1.0)
    q.enqueue(sample(), 0.0, 10)
    assert not q.persist_due(0.0)  # connected (or untried) and nothing spooled: memory is enough
    b = q.take(0.0)
    assert b is not None
    q.failed(b, 0.0, Fault.UNREACHABLE)
    assert q.persist_due(0.0)
    q.persisted(0.0, 1)
    q.enqueue(sample(), 0.5, 10)
    assert not q.persist_due(0.5) and q.persist_due(1.0)  # at most every persist_interval


# -- properties ---------------------------------------------------------------------------------

KINDS = ["error", "warning", "resolve-error", "resolve-warning", "sample", "action", "poison"]
ANSWERS = ["accept", "partial", "refuse-if-poison", *[f.value for f in RETRYABLE]]

OPS = ["enqueue"] * 8 + ["send"] * 4 + ["begin"] * 2 + ["tick"] * 2 + ["restart", "hurry"]
ops = st.lists(st.tuples(  # (op, kind, answer, n, size, dt): each op reads what it needs
    st.sampled_from(OPS), st.sampled_from(KINDS), st.sampled_from(ANSWERS + ["accept", "partial"] * 3),
    st.integers(0, 6), st.integers(20, 120), st.floats(0.0, 40.0)), min_size=10, max_size=200)


def make(kind: str, rule: int) -> object:
    r = f"r{rule}"
    return {
        "error": lambda: event(Severity.ERROR, rule=r), "warning": lambda: event(Severity.WARNING, rule=r),
        "resolve-error": lambda: event(Severity.ERROR, Status.RESOLVED, rule=r),
        "resolve-warning": lambda: event(Severity.WARNING, Status.RESOLVED, rule=r),
        "sample": sample, "action": action, "poison": lambda: event(Severity.ERROR, rule=r, message="poison"),
    }[kind]()


@dataclass
class World:
    """The job's view across processes: what each process delivered, what the job accepted."""

    q: SendQueue
    now: float = 0.0
    taken: dict[int, object] = field(default_factory=dict)  # high items the job accepted, by step
    delivered: list[list[object]] = field(default_factory=lambda: [[]])  # per process
    dead: list[object] = field(default_factory=list)
    reported: dict[str, int] = field(default_factory=dict)  # drop counts the bot was told (this process)
    restored: int = 0
    flying: Batch | None = None  # a batch sent and not answered yet
    spool: Spool | None = None  # the real spool file a restart goes through


def begin(w: World) -> Batch | None:
    """Take the next due batch (moving the clock to when it is due)."""
    due = w.q.next_due(w.now)
    if due is None:
        return None
    w.now = max(w.now, due)
    batch = w.q.take(w.now)
    assert batch is not None, "due, yet nothing to send: the sender would spin"
    return batch


def limits() -> Limits:
    return Limits(max_queue=5, max_bytes=240, max_high=5, batch_max=4, batch_max_bytes=400, flush_interval=1.0,
                  backoff=(0.5, 20.0), probe_interval=1.0, probe_max=2, persist_interval=0.0)


def queued_steps(q: SendQueue) -> list[int]:
    return [x.step for x in q.snapshot()]  # type: ignore[union-attr]


def check_drop(before: dict[int, object], q: SendQueue, delivered: set[int], dead: set[int]) -> None:
    """Items that left the queue by this op without being delivered or dead-lettered were dropped:
    never a high one, never a resolution whose alert still has a firing event queued."""
    now = {x.step: x for x in q.snapshot()}  # type: ignore[union-attr]
    firing = {x.fingerprint for x in now.values() if isinstance(x, Event) and x.status is Status.FIRING}
    for step, x in before.items():
        if step in now or step in delivered or step in dead:
            continue
        cls, tier = classify(x)  # type: ignore[arg-type]
        if replaced(x, now.values()):
            continue
        assert tier is not Tier.HIGH, f"a high item was dropped: {x}"
        if cls == "resolutions":
            assert x.fingerprint not in firing, "a resolution dropped while its firing event is queued"  # type: ignore[union-attr]


def replaced(x: object, others: object) -> bool:
    """An ERROR's resolution replaced by a newer one of its alert (the queue at its byte bound): not a loss."""
    return isinstance(x, Event) and x.status is Status.RESOLVED and x.severity is Severity.ERROR and any(
        isinstance(y, Event) and y.status is Status.RESOLVED and y.fingerprint == x.fingerprint and y.step > x.step
        for y in others)  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def spool_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("spool"))


@settings(max_examples=300)
@given(ops)
def test_no_accepted_error_is_lost_none_twice_order_kept_drops_counted(spool_dir, program):
    w = World(SendQueue(limits(), random.Random(1)), spool=Spool(spool_dir, "r", "0"))
    w.spool.write([])  # each example starts without one
    for op, kind, answer, n_, size, dt in program:
        before = {x.step: x for x in w.q.snapshot()}  # type: ignore[union-attr]
        delivered_now: set[int] = set()
        dead_now: set[int] = set()
        if op == "enqueue":
            x = make(kind, n_ % 4)
            took = w.q.enqueue(x, w.now, size)  # type: ignore[arg-type]
            if classify(x)[1] is Tier.HIGH and took:  # type: ignore[arg-type]
                w.taken[x.step] = x  # type: ignore[union-attr]
            if took or classify(x)[1] is not Tier.HIGH:  # type: ignore[arg-type]
                before[x.step] = x  # type: ignore[union-attr]  (refused at the cap: never the queue's)
        elif op == "tick":
            w.now += dt
        elif op == "hurry":
            w.q.hurry(w.now)
        elif op == "restart":  # a clean exit writes the spool file; the next process starts from it
            assert w.spool is not None
            w.spool.write(w.q.snapshot())  # the batch in flight included: its fate is unknown
            spool = w.spool.load()
            w.flying = None
            w.q = SendQueue(limits(), random.Random(2))
            w.q.restore([(x, bytes(50)) for x in spool], w.now)
            w.delivered.append([])
            w.reported = {}
            w.restored = len(spool)
            before = {x.step: x for x in w.q.snapshot()}  # type: ignore[union-attr]
        elif op == "begin" and w.flying is None:
            w.flying = begin(w)
        elif op == "send":  # the batch in flight, or the next due one, meets this answer
            batch = w.flying or begin(w)
            w.flying = None
            if batch is None:
                continue
            poisoned = any(getattr(x, "message", "") == "poison" for x in batch.items)
            if poisoned or answer == "refuse-if-poison":
                if poisoned:
                    out = w.q.failed(batch, w.now, Fault.REJECTED)
                    w.dead += [d.item for d in out.dead]
                    dead_now = {d.item.step for d in out.dead}
                    assert all(d.item.message == "poison" for d in out.dead)  # type: ignore[union-attr]
                else:
                    out = w.q.accepted(batch, w.now)
                    delivered_now = {x.step for x in batch.items}
                    w.delivered[-1] += batch.items
            elif answer in ("accept", "partial"):
                n = n_ % len(batch.entries) if answer == "partial" and batch.entries else None  # strictly fewer
                out = w.q.accepted(batch, w.now, n)
                got = batch.items[:n] if n is not None else batch.items
                delivered_now = {x.step for x in got}
                w.delivered[-1] += got
            else:
                out = w.q.failed(batch, w.now, Fault(answer), wait=float(n_) if n_ % 2 else None)
                assert 0.0 <= out.delay <= 20.0
            for k, v in out.reported.items():
                w.reported[k] = w.reported.get(k, 0) + v
        check_drop(before, w.q, delivered_now, dead_now)
        # every drop counted by class: what the bot was told + what it will be told == all drops
        told = {k: w.reported.get(k, 0) + w.q.unreported().get(k, 0) for k in set(w.reported) | set(w.q.dropped)}
        assert {k: v for k, v in told.items() if v} == {k: v for k, v in w.q.dropped.items() if v}
        # a high item the job accepted is never counted as dropped: only the ones the cap refused
        for cls in ("errors", "actions"):
            assert w.q.dropped.get(cls, 0) == w.q.refused.get(cls, 0)
    if w.flying is not None:  # the last answer: none came
        w.q.failed(w.flying, w.now, Fault.TIMEOUT)
    queued = set(queued_steps(w.q))
    delivered_all = {x.step for proc in w.delivered for x in proc}  # type: ignore[attr-defined]
    dead = {x.step for x in w.dead}  # type: ignore[attr-defined]
    left = [*w.q.snapshot(), *(x for proc in w.delivered for x in proc)]
    for step, x in w.taken.items():  # no accepted ERROR or action result is lost
        assert step in delivered_all or step in queued or (step in dead and x.message == "poison") or \
            replaced(x, left), x  # type: ignore[attr-defined]
    for proc in w.delivered:  # none twice by one process, events in the order queued
        steps = [x.step for x in proc]  # type: ignore[attr-defined]
        assert len(steps) == len(set(steps))
        ev_steps = [x.step for x in proc if isinstance(x, Event)]
        assert ev_steps == sorted(ev_steps)
    assert drain(w.q, w.now + 1000) is not None  # and what is left still goes out


def test_an_envelope_spliced_from_the_queued_bytes_equals_the_envelope_encoded_whole(tmp_path):
    """Each item is encoded once, when queued: the envelope's body (its fields encoded around empty lists, the
    items' bytes spliced in), the batch key and the spool's lines are those bytes, and equal what encoding
    the whole envelope (or each spool record) gives: NaN and Inf tagged, labels that look like the lists."""
    import math

    from msmon.contract.wire import Envelope, decode, encode
    from notifier.transport import SpoolRecord, batch_key, envelope_body

    q = queue()
    items = [sample(), event(), action(), event(Severity.WARNING), sample()]
    items[0].loss = math.nan
    items[1].value, items[1].threshold = math.inf, -math.inf
    items[3].message = '"events":[],"samples":[],"heartbeats":[],"actions":[],'
    for x in items:
        data = encode(x)
        assert q.enqueue(x, 0.0, len(data), data)
    batch = q.take(1000.0)
    assert batch is not None and len(batch.entries) == len(items)
    labels = {"events": '"events":[],"samples":[],"heartbeats":[],"actions":[],', "k": "\\"}
    head = Envelope(run_id="r", device="0", sent_at=1.5, labels=labels, dropped={"samples": 3})
    whole = Envelope(run_id="r", device="0", sent_at=1.5, labels=labels, dropped={"samples": 3},
                     events=[e.item for e in batch.entries if isinstance(e.item, Event)],
                     samples=[e.item for e in batch.entries if isinstance(e.item, Sample)],
                     actions=[e.item for e in batch.entries if isinstance(e.item, ActionResult)])
    body = envelope_body(head, batch.entries)
    assert body == encode(whole)
    assert b'"loss":"NaN"' in body and decode(body, Envelope).labels == labels
    spool = Spool(str(tmp_path), "r", "0")
    spool.write(batch.entries)
    assert (tmp_path / "r@0.spool.jsonl").read_bytes() == b"".join(
        encode(SpoolRecord.of(e.item)) + b"\n" for e in batch.entries)
    bare = Batch(batch.id, [type(e)(e.seq, e.item, e.cls, e.tier, e.size, e.since) for e in batch.entries],
                 batch.dropped)  # the same items without their bytes: encoded afresh, the same key
    assert batch_key("r", "0", batch) == batch_key("r", "0", bare)


def test_a_batch_of_drop_counts_only_accepted_while_isolating_a_refused_item_keeps_the_sender_going():
    """Found by the property test above: the batch size halved to isolate a refused item, then a batch of drop counts
    only (no entries) accepted, made the size 0: due, yet nothing to take (the sender would spin)."""
    q = queue(max_queue=1)
    q.enqueue(sample(), 0.0, 1)
    q.enqueue(sample(), 0.0, 1)  # the first is dropped: a count to report
    b = q.take(0.0)
    assert b is not None
    q.failed(b, 0.0, Fault.REJECTED)  # the one entry is a dead letter; one at a time from now
    b = q.take(0.0)
    assert b is not None and b.entries == [] and b.dropped == {"samples": 1}
    q.accepted(b, 0.0)
    q.enqueue(event(), 1.0, 10)
    due = q.next_due(1.0)
    assert due is not None and q.take(max(due, 1.0)) is not None
