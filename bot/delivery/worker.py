"""The delivery worker: takes due outbox rows, sends each group as one message through its
receiver within the rate limits, and marks the rows delivered only after the receiver said OK.

Rows stay in SQLite until then, so a crash, a restart or a Slack outage loses nothing. This is the
I/O edge of the delivery pipeline: the policy is pure, in `bot.delivery.Scheduler` (which groups are
due, when to try again, when to give up) and the DELIVERY stages of bot/pipeline (the rows of a group
that go together, the rate limits). The worker reads typed rows, runs each due group through the
stages, decodes each payload once per attempt, calls the receiver, turns whatever happened into an
outcome and writes the scheduler's verdict back. Whatever a receiver raises stays with its row group:
counted, retried with backoff, dead-lettered after a bound, never a hot loop, never in the way of
the other rows. Each destination (receiver and channel) is a lane with a task of its own, as
Alertmanager has a queue per integration: a receiver that hangs until its timeout holds its own lane
and no other. A new message's reference is stored the moment it is posted, before its chart is
attached, so a retry attaches the chart without posting the text again. A message is re-sent only
if the process dies between the receiver's OK and the SQLite write right after it.

With several replicas on one PostgreSQL (bot/store/postgres.py) each group is claimed before it is
sent (`store.claim`: all its rows, for this replica, for bot.store.lease seconds); a replica that dies
while delivering leaves its claim to run out, and the replica that takes the rows over finds a posted
message's reference on them, so it only does what was left (the chart).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import functools
import importlib
import logging
import random
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import msgspec

import bot.charts as charts
from bot.delivery.payload import Payload
from bot.delivery.plan import Known, Op, Step, step
from bot.delivery.trace import Trace
from bot.metrics import BotMetrics
from bot.pipeline import DELIVERY, flow
from bot.pipeline.group import firing_key
from bot.pipeline.ratelimit import RateLimiter
from bot.pipeline.schedule import (
    Deferred,
    Failed,
    FailureKind,
    GroupKey,
    OutboxRow,
    Outcome,
    Plan,
    Policy,
    Scheduler,
    Sent,
    Verdict,
)
from bot.receivers import DeliveryError, Held, Mail, Mailer, Message, Note, PartlyRefused, Receiver, decode_note
from bot.shared import Doorbell
from bot.store.sqlite import OutboxEntry, Store
from msmon.contract.wire import Event, Severity, Status, decode

log = logging.getLogger("msmon.bot")

CHARTS_KEPT = 16  # drawn charts kept for the retries of their group (about 100 kB each)
OVERLOADED = "the bot is overloaded and sheds samples, ERRORs go first (bot.overload)"
CHART_WAIT = 1.0  # seconds a new alert's text waits for its chart (chart_in_post receivers) before it goes without
Drawn = tuple[bytes | None, str | None]  # a chart's PNG, or why it could not be drawn
# Set by a lane for the send it runs: _post resolves it once the text is posted, so the lane takes its next message
# while this one's chart is still being drawn and attached (the follow-up goes on in its own task)
_TEXT_POSTED: contextvars.ContextVar[asyncio.Future[None] | None] = contextvars.ContextVar("_TEXT_POSTED",
                                                                                            default=None)


def _events(payloads: list[Payload]) -> list[Event]:
    """Latest event per device, in order of arrival."""
    by_device: dict[str, Event] = {}
    for p in payloads:
        by_device[p.event.device] = p.event
    return list(by_device.values())


def _message(key: str, payloads: list[Payload], repeat: bool = False) -> Message:
    events = _events(payloads)
    lead = events[0]
    return Message(key=key, run_id=lead.run_id, project=payloads[0].project, rule=lead.rule,
                   severity=lead.severity, status=lead.status, events=events, repeat=repeat,
                   ranks={p.event.device: p.rank for p in payloads if p.rank is not None},
                   known_ranks=max(p.ranks for p in payloads))


def _first_line(exc: BaseException) -> str:
    """`ValueError: ...` on one line (matplotlib's mathtext errors start with a newline)."""
    line = next((s.strip() for s in str(exc).splitlines() if s.strip()), "")
    return f"{type(exc).__name__}: {line}"[:300] if line else type(exc).__name__


@dataclasses.dataclass
class _Try:
    """One attempt at a group: its rows and their payloads (decoded once), and the message's
    reference once it is out."""

    receiver: Receiver
    rows: list[OutboxRow]
    plan: Plan
    payloads: list[Payload] = dataclasses.field(default_factory=list)
    notes: list[Note] = dataclasses.field(default_factory=list)
    mails: list[Mail] = dataclasses.field(default_factory=list)
    posted: str | None = None

    @property
    def head(self) -> OutboxRow:
        return self.rows[0]

    @property
    def ids(self) -> list[int]:
        return [r.id for r in self.rows]

    def what(self) -> str:
        """For log lines: which message of which run, to where."""
        h = self.head
        return f"{h.kind} {h.key!r} of run {h.run_id!r} to {h.receiver} {h.channel}"


@dataclasses.dataclass(frozen=True)
class Lane:
    """Which rows a worker takes: those of `receiver` (only) or of every other receiver (not only).
    The bot runs one worker for email and one for the rest: SMTP never holds a chat message."""

    receiver: str
    only: bool

    def due(self, store: Store, now: float) -> list[OutboxRow]:
        return store.due_lane(now, self.receiver, self.only)

    def next_due_at(self, store: Store) -> float | None:
        return store.next_due_lane(self.receiver, self.only)


class Outbox:
    def __init__(self, store: Store, receivers: dict[str, Receiver], limiter: RateLimiter, metrics: BotMetrics,
                 clock: Callable[[], float] = time.time, policy: Policy | None = None,
                 rand: Callable[[], float] = random.random, lane: Lane | None = None, *, bell: Doorbell | None = None,
                 link: Callable[[str], str] | None = None, given_up: Callable[[list[OutboxRow]], object] | None = None,
                 shedding: Callable[[], bool] = lambda: False,
                 chart_waits: Callable[[], Callable[[], None]] = lambda: lambda: None) -> None:
        """`bell`: the doorbell it joins (BotState.wake_outbox). `link`: a run's console page. `given_up`: a dead
        letter's rows (nflog.py). `shedding`: no chart while the ingest sheds. `chart_waits`: the overload's backlog."""
        self.store, self.receivers, self.metrics, self.clock, self.lane = store, receivers, metrics, clock, lane
        self.link, self.given_up, self.shedding, self.chart_waits = link, given_up, shedding, chart_waits
        self.scheduler = Scheduler(policy, rand)
        self.doorbell = asyncio.Event()
        # Row id -> the reference of its posted message, until the row's verdict is written: a post is
        # never repeated by this process even when SQLite fails to record it.
        self._posted: dict[int, str] = {}
        # Row id -> a verdict SQLite refused to record (a full disk, a lock): written again before each
        # round; the row is not tried meanwhile, so a delivered message is not delivered again.
        self._unwritten: dict[int, tuple[Verdict, float]] = {}
        self._charts: OrderedDict[tuple[str, tuple[int, ...]], Drawn] = OrderedDict()
        self._drawing: dict[tuple[str, tuple[int, ...]], asyncio.Task[Drawn]] = {}  # a group's chart being drawn
        self._round = flow.Round(self.scheduler, limiter, self._posted, self._unwritten,
                                 frozenset(n for n, r in receivers.items() if getattr(r, "self_paced", False)))
        self._busy: dict[tuple[str, str], asyncio.Task[int]] = {}  # lane (receiver, channel) -> its task sending
        # A posted message whose chart is still being drawn or attached -> its rows' ids: a lane goes on past it, and
        # no round takes those rows again until it settles them; nor its group's new rows (more devices joining:
        # the message is rewritten with every device once the first rows are delivered)
        self._following: dict[asyncio.Task[bool], frozenset[int]] = {}
        self._following_groups: dict[asyncio.Task[bool], GroupKey] = {}
        self.trace = Trace.from_env()  # each message's time per stage, for bench/bench_error_latency.py (trace.py)
        self._loop: asyncio.AbstractEventLoop | None = None  # while run delivers: a ring starts a round (wake)
        self._soon = False  # a round is to start at the loop's next step
        if bell is not None:
            bell.join(self.wake)

    def wake(self) -> None:
        """Rows were queued (the ingest rings after its commit). While `run` delivers, their round starts at the
        loop's next step: waking `run` takes three (the doorbell, the wait around it, the task), and on a loop the
        ingest keeps busy each step waits behind hundreds of envelopes (0.5 s p50 in bench_error_latency.py)."""
        self.trace.rang = time.monotonic()
        self.doorbell.set()
        if self._loop is not None and not self._soon:
            try:
                here = asyncio.get_running_loop()
            except RuntimeError:  # another thread: the doorbell only
                return
            if here is self._loop:
                self._soon = True
                here.call_soon(self._round_now)

    def _round_now(self) -> None:
        self._soon = False
        self.trace.resumed()
        with contextlib.suppress(Exception):  # the store's trouble: run's own round (the doorbell rang) logs it
            self._start_lanes()

    def _message(self, key: str, payloads: list[Payload], repeat: bool = False) -> Message:
        msg = _message(key, payloads, repeat)
        msg.link = self.link(msg.run_id) if self.link is not None else None
        return msg

    async def run(self, stop: asyncio.Event) -> None:
        try:
            self._loop = asyncio.get_running_loop()
            await self._run(stop)
        finally:
            self._loop = None

    async def _run(self, stop: asyncio.Event) -> None:
        if any(r.charts for r in self.receivers.values()):  # matplotlib's import takes seconds: not on the loop
            asyncio.get_running_loop().run_in_executor(None, importlib.import_module, "bot.charts.draw")
        waiting = self.store.depth()
        if waiting:
            self.store.due_now(self.clock())
            log.info("msmon bot: %d undelivered messages in the outbox from before; delivering them now", waiting)
        dead = self.store.dead_count()
        if dead:
            log.warning("msmon bot: %d dead letters in the outbox (never delivered; GET /v1/outbox/dead lists them)",
                        dead)
        while not stop.is_set():
            try:
                self._start_lanes()  # each lane's task sends on its own: this loop never waits on a receiver
                self._gauges()
            except Exception:  # noqa: BLE001 - SQLite trouble; every row's own failure is handled in _send
                log.exception("msmon bot: delivery round failed; retrying in 1 s")
                await asyncio.sleep(1.0)
            nxt = self.store.next_due_at() if self.lane is None else self.lane.next_due_at(self.store)
            wait = 1.0 if nxt is None or self._unwritten else min(max(nxt - self.clock(), 0.01), 1.0)
            if self._busy:  # rows due on a lane still sending are its task's: no spinning on them
                wait = max(wait, 0.25)
            self.doorbell.clear()
            stop_task = asyncio.ensure_future(stop.wait())
            bell_task = asyncio.ensure_future(self.doorbell.wait())
            await asyncio.wait({stop_task, bell_task}, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
            self.trace.resumed()
            for t in (stop_task, bell_task):
                t.cancel()
        await self.close()

    async def close(self, grace: float = 2.0) -> None:
        """Stopping: the lanes' sends in flight get `grace` seconds, then are cancelled (their rows stay
        pending and go after the restart)."""
        busy = [*self._busy.values(), *self._following]
        if busy:
            _, late = await asyncio.wait(busy, timeout=grace)
            for t in late:
                t.cancel()
            await asyncio.gather(*busy, return_exceptions=True)

    async def deliver_due(self) -> int:
        """One round, waited for: every lane with due groups that is not already sending gets its task
        (`_start_lanes`), and this returns when they are done; how many messages went out. The worker's
        own loop (`run`) starts the lanes and does not wait: a hanging receiver holds its lane only."""
        tasks = self._start_lanes()
        sent = sum(await asyncio.gather(*tasks)) if tasks else 0
        following = list(self._following)
        sent += sum(await asyncio.gather(*following)) if following else 0
        self._gauges()
        return sent

    def _gauges(self) -> None:
        self.metrics.outbox_depth.set(self.store.depth())
        self.metrics.outbox_dead.set(self.store.dead_count())

    def _start_lanes(self) -> list[asyncio.Task[int]]:
        """Per destination (receiver and channel, as Alertmanager has one queue per integration): a task
        that sends the lane's due groups in turn, oldest first, each through the DELIVERY stages at its
        turn (a 429 earlier in the lane paces the rest of it). A lane whose task is still sending (a
        receiver that hangs until its timeout) is left to it; the others go at once."""
        self._write_unwritten()
        now = self.clock()
        rows = self.store.due(now) if self.lane is None else self.lane.due(self.store, now)
        lanes: dict[tuple[str, str], list[GroupKey]] = {}
        if self._following:  # rows of a posted message whose chart is still on its way are its task's
            following = frozenset().union(*self._following.values())
            held = frozenset(self._following_groups.values())
            rows = [r for r in rows if r.id not in following and r.group not in held]
        for gk in self.scheduler.groups(rows, now):
            if (gk[0], gk[1]) not in self._busy:
                lanes.setdefault((gk[0], gk[1]), []).append(gk)
        tasks = []
        if self.trace.on:
            self.trace.picked(r.id for r in rows if (r.receiver, r.channel) in lanes)
        for lane, groups in lanes.items():
            task = asyncio.create_task(self._send_lane(lane, groups))
            self._busy[lane] = task
            task.add_done_callback(functools.partial(self._lane_done, lane))
            tasks.append(task)
        return tasks

    def _lane_done(self, lane: tuple[str, str], task: asyncio.Task[int]) -> None:
        if self._busy.get(lane) is task:
            del self._busy[lane]
        self.doorbell.set()  # what came due for this lane meanwhile goes now

    async def _send_lane(self, lane: tuple[str, str], groups: list[GroupKey]) -> int:
        sent = 0
        for gk in groups:
            try:
                if gk in self._following_groups.values():  # its first rows' chart is on its way: after it
                    continue
                claimed = self.store.claim(gk, self.clock())  # none: another replica is delivering this group
                if not claimed:
                    continue
                ids = [r.id for r in claimed]
                self.trace.mark(ids, "turn")
                due, dropped_by = flow.run_stages(DELIVERY, self._round, flow.Due(claimed, self.clock()))
                if dropped_by is not None:
                    continue
                if due.wait > 0.0:
                    self.trace.deferred(ids)
                    self._settle(due.rows, Deferred(due.wait), due.rows[0].receiver)
                    continue
                self.trace.mark(ids, "planned")
                if await self._send_in_turn(due.rows):
                    sent += 1
            except Exception:  # noqa: BLE001 - store trouble; a row's own failure is handled in _send
                log.exception("msmon bot: delivery to %s %s failed in the store; the lane retries next round", *lane)
                break
        return sent

    async def _send_in_turn(self, rows: list[OutboxRow]) -> bool:
        """`_send`, for the lane: it waits until the message is settled, or only until its text is posted when its
        chart is still being drawn (the chart's follow-up then goes on in its own task, which settles the rows):
        an ERROR's text never waits for the charts of the messages before it. False when the follow-up goes on."""
        posted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        token = _TEXT_POSTED.set(posted)
        try:
            task = asyncio.ensure_future(self._send(rows))  # the task runs in a copy of this context
        finally:
            _TEXT_POSTED.reset(token)
        either: set[asyncio.Future[Any]] = {task, posted}
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        self._following[task] = frozenset(r.id for r in rows)
        self._following_groups[task] = rows[0].group
        task.add_done_callback(self._followed)
        return False

    def _followed(self, task: asyncio.Task[bool]) -> None:
        self._following.pop(task, None)
        self._following_groups.pop(task, None)
        if not task.cancelled() and task.exception() is not None:
            log.error("msmon bot: a chart's follow-up failed: %s", task.exception())
        self.doorbell.set()

    def _write_unwritten(self) -> None:
        for i, (verdict, at) in list(self._unwritten.items()):
            try:
                self.store.settle([i], verdict, at)
            except self.store.Error:
                return  # still refused: next round
            del self._unwritten[i]
            self._posted.pop(i, None)

    async def _send(self, rows: list[OutboxRow]) -> bool:
        receiver = self.receivers.get(rows[0].receiver) or self.receivers["console"]
        attempt = self._decode(receiver, rows)
        if attempt is None:
            return False
        try:
            await self._deliver(attempt)
            outcome: Outcome = Sent()
        except Held as exc:  # a robot keeping its platform's rate (bot/chat/robot.py): not a failed try
            outcome = Deferred(exc.wait)
        except DeliveryError as exc:
            kind: FailureKind = "permanent" if exc.permanent else "rate_limited" if exc.retry_after else "transient"
            outcome = Failed(kind, str(exc), exc.retry_after, attempt.posted)
        except Exception as exc:  # noqa: BLE001 - a receiver bug or data it cannot take: this row's problem only
            if max(r.attempts for r in attempt.rows) == 0:
                log.warning("msmon bot: %s raised an unexpected error; retrying with backoff", attempt.what(),
                            exc_info=True)
            outcome = Failed("error", _first_line(exc), None, attempt.posted)
        verdict = self._settle(attempt.rows, outcome, receiver.name, attempt)
        return verdict.state == "delivered"

    def _decode(self, receiver: Receiver, rows: list[OutboxRow]) -> _Try | None:
        """The group's attempt with its payloads decoded; a row that does not decode is a dead letter alone."""
        attempt = _Try(receiver, [], self.scheduler.plan(rows))
        for r in rows:
            try:
                if r.kind == "note":
                    attempt.notes.append(decode_note(r.payload, r.channel))
                elif r.kind == "mail":
                    attempt.mails.append(decode(r.payload, Mail))
                else:
                    attempt.payloads.append(decode(r.payload, Payload))
            except (msgspec.DecodeError, ValueError, TypeError) as exc:
                self._settle([r], Failed("undecodable", f"payload does not decode: {exc}"), receiver.name)
                continue
            attempt.rows.append(r)
        return attempt if attempt.rows else None

    def _settle(self, rows: list[OutboxRow], outcome: Outcome, receiver: str, attempt: _Try | None = None) -> Verdict:
        now = self.clock()
        verdict = self.scheduler.after(rows, outcome, now)
        ids = [r.id for r in rows]
        head = rows[0]
        what = attempt.what() if attempt else f"{head.kind} {head.key!r} of run {head.run_id!r} to {receiver} " \
                                                f"{head.channel}"
        try:
            self.store.settle(ids, verdict, now)
        except self.store.Error as exc:
            log.error("msmon bot: the store refused to record that %s is %s (%s); kept in memory and written again "
                      "before each round; check the disk or the database at %s", what, verdict.state, exc,
                      self.store.where)
            self._unwritten.update(dict.fromkeys(ids, (verdict, now)))
        else:
            for i in ids:
                self._posted.pop(i, None)
            if verdict.state in ("delivered", "dead"):
                self._charts.pop((head.key, tuple(ids)), None)
            self._after(rows, verdict, now)
            if self.trace.on:
                self.trace.settled(ids, head.run_id, head.kind, verdict.state,
                                   attempt.payloads[0].received_at if attempt and attempt.payloads else None)
        m = self.metrics
        if verdict.state == "delivered":
            m.sent.labels(receiver, head.kind).inc()
            if verdict.error:
                log.warning("msmon bot: %s is posted but its follow-up (the chart) never went: %s", what, verdict.error)
            if attempt is not None and head.kind == "alert":
                for p in attempt.payloads:
                    if p.event.severity is Severity.ERROR and p.received_at is not None:
                        m.error_latency.observe(max(now - p.received_at, 0.0))
        if attempt is not None and attempt.mails and verdict.state in ("retry", "dead") and \
                (verdict.state == "dead" or verdict.attempts == 1):
            self._report_mail(attempt.mails, verdict)
        if verdict.state == "retry":
            m.delivery_errors.labels(receiver).inc()
            held = verdict.attempts == max(r.attempts for r in rows)  # the channel is down: not counted
            n = verdict.attempts
            # Tries 1, 2, 4, 8 ... at WARNING (an outage of hours is a few lines per message), the rest at DEBUG.
            log.log(logging.WARNING if not held and n & (n - 1) == 0 else logging.DEBUG,
                    "msmon bot: delivery of %s failed (attempt %d of %d%s; next try in %.3g s): %s", what, n,
                    self.scheduler.policy.limit(_kind(outcome)),
                    ", held: the channel looks down" if held else "", verdict.delay, verdict.error)
        elif verdict.state == "dead":
            m.delivery_errors.labels(receiver).inc()
            m.dead_letters.labels(receiver).inc()
            log.error("msmon bot: dead letter: %s given up after %d tries; last error: %s. It stays in the outbox "
                      "(GET /v1/outbox/dead, /healthz dead_letters); fix the cause (the receiver's token, channel or "
                      "outage) and look at the run's alerts with GET /v1/runs/%s", what, verdict.attempts,
                      verdict.error, head.run_id)
        return verdict

    def _after(self, rows: list[OutboxRow], verdict: Verdict, now: float) -> None:
        """What a written verdict means for the rest: a lane back up has its waiting rows due now; a dead
        letter's alerts are not notified (bot/delivery/nflog.py)."""
        head = rows[0]
        try:
            if verdict.reopened and self.store.due_now_lane(head.receiver, head.channel, now):
                log.info("msmon bot: %s %s delivers again; the messages waiting for it go now", head.receiver,
                         head.channel)
                self.doorbell.set()
            if verdict.state == "dead" and self.given_up is not None:
                self.given_up(rows)
        except Exception:  # noqa: BLE001 - the store's trouble: the rows' own verdict is written
            log.exception("msmon bot: could not record what the delivery of %s %s changed", head.receiver,
                          head.channel)

    def _report_mail(self, mails: list[Mail], verdict: Verdict) -> None:
        """An escalation mail that failed (its first try, and when given up): said in the alert's channel."""
        now = self.clock()
        then = "given up: a dead letter (GET /v1/outbox/dead)" if verdict.state == "dead" else \
            f"retrying with backoff (next try in {verdict.delay:.0f} s)"
        entries = [OutboxEntry(now, m.report_via, m.report_to.channel, "note", f"mailfail|{m.message_id}|{now!r}",
                               None, msgspec.json.encode(Note(
                                   text=f"msmon could not email {', '.join(m.to)} ({m.subject}): {verdict.error}; "
                                        f"{then}", reply_to=m.report_to)).decode(), now)
                   for m in mails if m.report_via]
        if not entries:
            return
        try:
            self.store.enqueue_many(entries)
        except self.store.Error as exc:
            log.error("msmon bot: could not queue the report of a failed mail (%s)", exc)

    async def _deliver(self, t: _Try) -> None:
        kind = t.head.kind
        if kind == "note":
            for note in t.notes:
                await t.receiver.note(note)
        elif kind == "mail":
            if not isinstance(t.receiver, Mailer):
                raise TypeError(f"receiver {t.receiver.name} cannot send mail")
            for row, mail in zip(t.rows, t.mails, strict=True):
                try:
                    await t.receiver.mail(mail)
                except PartlyRefused as exc:  # sent to the others: the row keeps only the refused, retried
                    mail.to = [to for to in mail.to if to in exc.refused] or mail.to
                    self.store.set_payload(row.id, msgspec.json.encode(mail).decode())
                    raise
        else:  # alert, repeat, resolve: what the store knows, the pure step (bot/delivery/plan.py), carried out
            msg = self._message(t.head.key, t.payloads, repeat=kind == "repeat")
            known, seen = self._known(t, msg)
            await self._carry_out(t, msg, step(kind, known), seen)

    def _chart(self, t: _Try, msg: Message) -> asyncio.Task[Drawn] | None:
        """The drawing of the firing ERROR's chart (`_draw`: one per group at a time, which a retry of the group
        shares while it is under way), or None when no chart is to be drawn. What is known at once is filled in
        `msg` before its text goes: the chart drawn on an earlier try (a few are kept), or why none is drawn (the
        bot sheds)."""
        if not t.receiver.charts or msg.severity is not Severity.ERROR or msg.status is not Status.FIRING:
            return None
        room = getattr(t.receiver, "has_room", None)  # a group robot in a storm posts no chart: none is drawn
        if room is not None and not room():
            return None
        key = (t.head.key, tuple(t.ids))
        if key in self._charts:
            msg.chart, msg.chart_problem = self._charts[key]
            return None
        if self.shedding():  # a chart is a picture of samples, shed too: the page goes now, the text says why
            msg.chart_problem = OVERLOADED
            return None
        drawing = self._drawing.get(key)
        if drawing is None:
            drawing = self._drawing[key] = asyncio.ensure_future(self._draw(key, msg, t.ids))
        return drawing

    async def _draw(self, key: tuple[str, tuple[int, ...]], msg: Message, ids: list[int]) -> Drawn:
        """The chart's PNG, drawn in a thread, or why it could not be drawn; kept for the group's retries."""
        chart, problem = None, None
        done = self.chart_waits()
        try:
            self.trace.mark(ids, "chart_queued")
            chart = await charts.render_chart_off_loop(msg.lead, timed=self._chart_timer(ids))
            self.trace.mark(ids, "chart_back")
        except Exception as exc:  # noqa: BLE001 - any failure to draw: the alert goes out without it
            problem = _first_line(exc)
            log.warning("msmon bot: the chart of %s for run %r step %d could not be drawn (%s); the alert is sent "
                        "without it", msg.rule, msg.run_id, msg.lead.step, problem)
        finally:
            done()
            self._drawing.pop(key, None)
        self._charts[key] = (chart, problem)
        while len(self._charts) > CHARTS_KEPT:
            self._charts.popitem(last=False)
        return chart, problem

    def _chart_timer(self, ids: list[int]) -> Callable[[str], None] | None:
        """For the drawing thread: marks chart_start and chart_end of the rows (tracing only)."""
        return functools.partial(self.trace.mark, ids) if self.trace.on else None

    async def _post(self, t: _Try, msg: Message, root_key: str | None = None) -> None:
        """Post a new message, store its reference at once, then attach its chart (the follow-up). A receiver
        that sends the chart with the text (`chart_in_post`, the default) has the text wait for it at most
        CHART_WAIT seconds (a busy bot draws slowly): a chart not drawn by then follows the text. One that
        attaches it on its own (Slack: an upload in the message's thread) posts the text at once. Once the
        text is posted the lane goes on (the chart's follow-up is this task's, in the background): an ERROR's
        text never waits for the drawing or the upload of the chart of the one before it. A chart that could
        not be drawn after its text went rewrites the text to say why."""
        drawing = self._chart(t, msg)
        follows = not getattr(t.receiver, "chart_in_post", True)
        if drawing is not None and not follows:
            await asyncio.wait({drawing}, timeout=CHART_WAIT)
            if drawing.done():
                msg.chart, msg.chart_problem = drawing.result()
        channel, key = t.head.channel, t.head.key
        if t.plan.post:
            self.trace.mark(t.ids, "post_start")
            t.posted = await t.receiver.post(channel, msg)
            self.trace.mark(t.ids, "post_end")
            self._posted.update(dict.fromkeys(t.ids, t.posted))
            with self.store.tx():
                now = self.clock()
                self.store.save_message(key, t.receiver.name, channel, t.posted, now)
                if root_key is not None:
                    self.store.save_message(root_key, t.receiver.name, channel, t.posted, now)
                self.store.mark_posted(t.ids, t.posted)
            self._reached(t.rows, now)
        ref = t.posted or t.plan.ref
        assert ref is not None
        posted = _TEXT_POSTED.get()
        if posted is not None and not posted.done():
            posted.set_result(None)  # the lane goes on; this task draws and attaches the chart
        if drawing is not None:
            msg.chart, msg.chart_problem = await asyncio.shield(drawing)  # shared with a retry of the group
        if follows and msg.chart is None and msg.chart_problem not in (None, OVERLOADED) and \
                (drawing is not None or not t.plan.post):  # drawn after the text went (this try or one before)
            await t.receiver.update(channel, ref, msg)  # the drawing failed: the text says so now
        else:
            await t.receiver.attach(channel, ref, msg)

    def _reached(self, rows: list[OutboxRow], now: float) -> None:
        """The text got through while the rows' follow-up (the chart) goes on: the lane is up from now, as the
        scheduler learns from a delivered group (its outage rule: another message's failures count again; a lane
        that was failing delivers its waiting rows now). The rows' own verdict comes when they are settled."""
        self._after(rows, self.scheduler.after(rows, Sent(), now), now)

    def _payloads(self, rows: list[OutboxRow]) -> list[Payload]:
        """Payloads of rows delivered before (a row that does not decode is left out)."""
        out = []
        for r in rows:
            try:
                out.append(decode(r.payload, Payload))
            except (msgspec.DecodeError, ValueError, TypeError):
                log.warning("msmon bot: outbox row %d does not decode; left out of the message", r.id)
        return out

    def _known(self, t: _Try, msg: Message) -> tuple[Known, _Seen]:
        """What the store knows about the group, for `step`; and what carrying the step out needs again."""
        kind, channel, key, name = t.head.kind, t.head.channel, t.head.key, t.receiver.name
        posted = None if t.plan.post else t.plan.ref
        if kind == "resolve":
            fkey = firing_key(msg.lead)
            ref = self.store.message(fkey)
            if ref is None:
                return Known(posted=posted), _Seen()
            fired = self._payloads(self.store.delivered_since(name, channel, fkey, "alert", ref["created_at"]))
            firing_devices = {e.device for e in _events(fired)} if fired else set(msg.devices)
            before = self._payloads(self.store.delivered_since(name, channel, key, "resolve", ref["created_at"]))
            resolved = {e.device for e in _events(before + t.payloads)}
            return (Known(posted=posted, firing=ref["ts"], all_resolved=firing_devices <= resolved),
                    _Seen(fkey=fkey, fired=fired))
        if posted is not None:
            return Known(posted=posted), _Seen()
        own = self.store.message(key)
        root_key = f"{msg.run_id}|root|{name}|{channel}"
        root = self.store.message(root_key) if kind == "alert" and own is None else None
        return (Known(own=None if own is None else own["ts"], root=None if root is None else root["ts"],
                      thread=t.payloads[0].thread), _Seen(own=own, root_key=root_key))

    async def _carry_out(self, t: _Try, msg: Message, s: Step, seen: _Seen) -> None:
        channel, key, name = t.head.channel, t.head.key, t.receiver.name
        if s.op in (Op.POST, Op.ATTACH):  # _post attaches only, to t.plan.ref, when the text went out before
            await self._post(t, msg, seen.root_key if s.as_root else None)
        elif s.op is Op.REPLY:
            assert s.ref is not None
            await t.receiver.reply(channel, s.ref, msg)
            if s.keep_reply:  # a WARNING in the run's thread: the thread stands for it from now on
                self.store.save_message(key, name, channel, s.ref, self.clock())
            if t.head.kind == "resolve":
                t.posted = s.ref
                self._posted.update(dict.fromkeys(t.ids, t.posted))
                self.store.mark_posted(t.ids, s.ref)
        elif s.op is Op.UPDATE:  # more devices joined the group: rewrite the message with all of them
            assert s.ref is not None and seen.own is not None
            earlier = self._payloads(self.store.delivered_since(name, channel, key, "alert", seen.own["created_at"]))
            await t.receiver.update(channel, s.ref, self._message(key, earlier + t.payloads))
        if s.close is not None:
            view = self._message(seen.fkey, seen.fired or t.payloads)
            view.status, view.resolution = Status.RESOLVED, msg.lead.message  # the post says why it closed
            await t.receiver.update(channel, s.close, view)
            self.store.retire_message(seen.fkey, self.clock())


@dataclasses.dataclass
class _Seen:
    """What `_known` read that carrying out a step needs again."""

    own: dict[str, Any] | None = None  # the group's stored message
    root_key: str = ""  # where the run's root message in this channel is stored
    fkey: str = ""  # resolves: the episode's firing key ...
    fired: list[Payload] = dataclasses.field(default_factory=list)  # ... and what was delivered for it


def _kind(outcome: Outcome) -> FailureKind:
    return outcome.kind if isinstance(outcome, Failed) else "transient"
