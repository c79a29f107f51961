"""Jobs' envelopes from NATS JetStream: the same ingest as HTTP, for fleets too large for one HTTP edge.

    job ─► JetStream <prefix>.<project>.<run>.env / .hb (stream bot.nats.stream, work queue)
        ─► the durable pull consumer bot.nats.durable, shared by every replica (each message to one)
        ─► Msmon-Token checked like the bearer token, the subject against the envelope's project and run,
           the wire codec ─► `Ingest.envelope` (its transaction; an envelope without events: its run's update held)
        ─► the batch's held updates in one transaction (bot/ingest/commit.py) ─► ack

    rank's Poll on <prefix>.<project>.<run>.poll (queue group: one replica answers)
        ─► `jobs.long_poll` ─► PollAnswer on <prefix>.<project>.<run>.cmd.<device>
    rank's ActionRequest on <prefix>.<project>.<run>.act (request/reply, queue group)
        ─► `jobs.rule_request` ─► the answer of HTTP's POST /v1/actions/request

A message is acked only after the ingest committed, so a replica that dies with messages in hand has
them redelivered to another after `ack_wait`; a job's retry carries the same Nats-Msg-Id and is stored
once, and a redelivered envelope's events meet the pipeline's dedup, so an alert is not sent twice.
A message that cannot ever be ingested (not JSON, not the schema, an unknown token, another project's
run, the wrong subject) is terminated at once, counted by reason (msmon_nats_messages_total) and
logged; one that fails for another reason (the store, a bug) is retried with backoff up to
`max_deliver` times and then terminated and logged as a dead letter. Nothing loops forever.

The consumer survives NATS restarts: nats-py reconnects, and the fetch loop sets the stream and the
consumer up again after any error (a NATS restarted without its store has neither).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import msgspec
import nats
import nats.errors
import nats.js.errors
from nats.js import api
from prometheus_client import Counter

from bot.commands import jobs
from bot.commands.service import view
from bot.config import NatsConfig
from bot.ingest.auth import JobAuth
from bot.ingest.envelope import Ingest
from bot.ingest.overload import errors_first
from bot.ingest.runs import alias_problem, events_problem, keyed
from bot.runs.devices import TooManyDevices
from bot.shared import BotState
from bot.store.rows import RunRow
from msmon.contract.subjects import (
    ACTION,
    COMMANDS,
    ENVELOPE,
    HEARTBEAT,
    POLL,
    STATUS_HEADER,
    TOKEN_HEADER,
    subject,
)
from msmon.contract.wire import ActionRequest, Envelope, Heartbeat, Poll, PollAnswer, decode, encode, tag_nonfinite

log = logging.getLogger("msmon.bot")

ApplyStep = Callable[[RunRow, float], int]  # the command service's
_STATUS = {"token": 401, "project": 403, "json": 400}  # a refusal's HTTP status in an answer (else 422)



def _stored(msg: Any, now: float) -> float:
    """When JetStream stored the message (its metadata), or `now` when it does not say."""
    try:
        return float(msg.metadata.timestamp.timestamp())
    except Exception:  # noqa: BLE001 - not a JetStream message, or no timestamp: it waits from now
        return now

class Poison(Exception):
    """A message that can never be ingested: `reason` is the counter's label, the text what to do."""

    def __init__(self, reason: str, text: str) -> None:
        super().__init__(text)
        self.reason = reason


class NatsIngest:
    """One replica's share of the durable consumer, and its answers to the jobs' command polls."""

    def __init__(self, cfg: NatsConfig, state: BotState, ingest: Ingest, auth: JobAuth, apply_step: ApplyStep, *,
                 backoff: tuple[float, float] = (0.2, 5.0)) -> None:
        """`auth`: the tokens and the runs' owners, as HTTP's (bot/ingest/auth.py); `apply_step`: the command
        service's, for a configured action's command."""
        self.cfg, self.state, self.ingest, self.auth, self._apply_step = cfg, state, ingest, auth, apply_step
        self._backoff = backoff
        self.messages = Counter("msmon_nats_messages_total", "messages from NATS, by outcome (ingested, retried, "
                                "dead, or why it was refused)", ["outcome"], registry=state.metrics.registry)
        self._nc: Any = None
        self._task: asyncio.Task[None] | None = None
        self._polls: set[asyncio.Task[None]] = set()
        self._stop = asyncio.Event()
        self._logged: dict[str, float] = {}  # reason -> when it was last logged
        self.ready = asyncio.Event()  # set once the stream and the consumer are there (tests, bench)

    # -- start and stop ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect and consume in the background; a NATS that is not there yet is retried, HTTP serves on."""
        self._task = asyncio.create_task(self._run(), name="msmon-nats-ingest")

    async def stop(self) -> None:
        self._stop.set()
        for t in list(self._polls):
            t.cancel()
        if self._task is not None and not self.ready.is_set():
            self._task.cancel()  # still connecting (NATS unreachable): nothing taken to finish, no 10 s wait
        if self._task is not None:
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(self._task, 10)
        if self._nc is not None and not self._nc.is_closed:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._nc.close(), 5)

    async def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                if self._nc is None or self._nc.is_closed:
                    self._nc = await self._connect()
                sub = await self._setup(self._nc)
                failures = 0
                await self._consume(sub)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - NATS down, a stream deleted, a bug: set up again, later
                failures += 1
                self.ready.clear()
                self._say("setup", f"msmon bot: NATS ingest from {self.cfg.url}: {type(exc).__name__}: {exc}; "
                                   "HTTP ingest goes on, NATS is tried again (jobs spool meanwhile)", warn=True)
                lo, hi = self._backoff
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), min(hi, lo * 2 ** min(failures, 16)))

    async def _connect(self) -> Any:
        async def quiet(exc: Exception) -> None:  # said once a minute while NATS is not there; else debug
            if self.ready.is_set():
                log.debug("msmon bot: NATS: %s: %s", type(exc).__name__, exc)
            else:
                self._say("connect", f"msmon bot: cannot reach NATS at {self.cfg.url} ({type(exc).__name__}: {exc});"
                                     " HTTP ingest goes on, NATS is tried again (jobs sending over NATS spool "
                                     "meanwhile): check bot.nats.url and that nats-server runs", warn=True)

        async def reconnected() -> None:
            log.info("msmon bot: NATS at %s is back; the consumer goes on", self.cfg.url)

        nc = await nats.connect([u.strip() for u in (self.cfg.url or "").split(",")], name="msmon bot",
                                allow_reconnect=True, max_reconnect_attempts=-1, reconnect_time_wait=0.5,
                                connect_timeout=2, error_cb=quiet, reconnected_cb=reconnected)
        await nc.subscribe(f"{self.cfg.prefix}.*.*.{POLL}", queue=self.cfg.durable, cb=self._on_poll)
        await nc.subscribe(f"{self.cfg.prefix}.*.*.{ACTION}", queue=self.cfg.durable, cb=self._on_action)
        return nc

    async def _setup(self, nc: Any) -> Any:
        """The stream and the durable consumer, created or brought to the config; the pull subscription."""
        c = self.cfg
        js = nc.jetstream(timeout=5)
        stream = api.StreamConfig(
            name=c.stream, subjects=[f"{c.prefix}.*.*.{ENVELOPE}", f"{c.prefix}.*.*.{HEARTBEAT}"],
            retention=api.RetentionPolicy.WORK_QUEUE, discard=api.DiscardPolicy.NEW, max_age=c.max_age,
            max_bytes=int(c.max_mb * (1 << 20)), duplicate_window=c.duplicate_window,
            storage=api.StorageType.MEMORY if c.memory else api.StorageType.FILE)
        try:
            await js.stream_info(c.stream)
            await js.update_stream(stream)
        except nats.js.errors.NotFoundError:
            await js.add_stream(stream)
        await js.add_consumer(c.stream, api.ConsumerConfig(
            durable_name=c.durable, ack_policy=api.AckPolicy.EXPLICIT, ack_wait=c.ack_wait,
            max_deliver=c.max_deliver + 1, max_ack_pending=c.max_ack_pending))  # +1: the last one is ours to end
        sub = await js.pull_subscribe_bind(durable=c.durable, stream=c.stream)
        log.info("msmon bot: consuming NATS JetStream stream %s (subjects %s.*.*.%s/%s) as durable %s", c.stream,
                 c.prefix, ENVELOPE, HEARTBEAT, c.durable)
        self.ready.set()
        return sub

    async def _consume(self, sub: Any) -> None:
        while not self._stop.is_set():
            try:  # the first message as soon as there is one (a fetch of a batch would wait for all of it)
                msgs = await sub.fetch(1, timeout=1.0)
            except (asyncio.TimeoutError, nats.errors.TimeoutError):
                if self._nc.is_closed:
                    raise nats.errors.ConnectionClosedError from None
                continue
            if self.cfg.batch > 1:  # then what is there already, without waiting
                with contextlib.suppress(asyncio.TimeoutError, nats.errors.TimeoutError):
                    msgs += await sub.fetch(self.cfg.batch - 1, timeout=0.05)
            waiting = self.ingest.overload.backlogs["nats"]  # since JetStream stored them: the overload's signal
            now = self.ingest.overload.clock()
            tokens = [waiting.enter(_stored(m, now)) for m in msgs]
            try:
                held = []  # ingested, their runs' updates held for one commit (bot/ingest/commit.py), then acked
                for msg in errors_first(msgs, lambda m: m.subject.rpartition(".")[0], lambda m: m.data):
                    if await self._one(msg):  # ERRORs first (overload.py): a page waits behind no other run's samples
                        held.append(msg)
                await self._commit(held)
            finally:
                for token in tokens:
                    waiting.leave(token)

    # -- one message ---------------------------------------------------------------------------------

    async def _one(self, msg: Any) -> bool:
        """Ingest one message: True when it is to be acked after the batch's commit (`_commit`); refused or failed
        ones are settled here."""
        try:
            try:
                self._ingest(msg)
            except TooManyDevices as exc:  # never ingested, whenever it comes again
                raise Poison("devices", str(exc)) from None
        except Poison as exc:
            self.messages.labels(exc.reason).inc()
            self._say(exc.reason, f"msmon bot: REFUSED a NATS message on {msg.subject} ({exc.reason}): {exc}; "
                                  "dropped, never redelivered", warn=True)
            await self._settle(msg.term)
            return False
        except Exception as exc:  # noqa: BLE001 - the store or a bug: again later, then a dead letter
            await self._failed(msg, exc)
            return False
        return True

    async def _commit(self, held: list[Any]) -> None:
        """The runs' updates the batch's envelopes left held, in one transaction; then each message acked (after the
        commit: a crash before this redelivers, dedup keeps it single), or each failed when the commit failed."""
        if not held:
            return
        try:
            self.state.store.flush_runs(self.state.clock())
        except Exception as exc:  # noqa: BLE001 - the store: each message again later, then a dead letter
            for msg in held:
                await self._failed(msg, exc)
            return
        self.messages.labels("ingested").inc(len(held))
        for msg in held:
            await self._settle(msg.ack)

    async def _failed(self, msg: Any, exc: Exception) -> None:
        tries = _delivered(msg)
        if tries >= self.cfg.max_deliver:
            self.messages.labels("dead").inc()
            log.error("msmon bot: a NATS message on %s failed %d times (last: %s: %s); given up as a dead letter "
                      "(it stays countable in msmon_nats_messages_total{outcome=\"dead\"}). See the errors above.",
                      msg.subject, tries, type(exc).__name__, exc)
            await self._settle(msg.term)
        else:
            self.messages.labels("retried").inc()
            self._say("retry", f"msmon bot: ingesting a NATS message on {msg.subject} failed ({type(exc).__name__}:"
                               f" {exc}); redelivered later (try {tries} of {self.cfg.max_deliver})", warn=True)
            lo, hi = self._backoff
            await self._settle(lambda: msg.nak(delay=min(hi * 6, lo * 2 ** tries)))

    def _ingest(self, msg: Any) -> None:
        """One envelope or heartbeat through the ingest, or `Poison`. Synchronous, like the HTTP route: no
        await between the ownership check and the commit."""
        parts = msg.subject.split(".")
        kind = parts[-1]
        project = self._authorize(msg.headers)
        if kind == ENVELOPE:
            env = self._decode(msg.data, Envelope)
            self._check(msg.subject, kind, env.project, env.run_id)
            carried = [e.run_id for e in env.events] + [s.run_id for s in env.samples] + \
                [a.run_id for a in env.actions] + [h.run_id for h in env.heartbeats]
            if any(r != env.run_id for r in carried):
                raise Poison("schema", "every event, sample, action and heartbeat must carry the envelope's run_id")
            problem = events_problem(env.events)
            if problem is not None:
                raise Poison("schema", problem)
            _, key = self._own(project, env.run_id, env.project)
            # another project's run has this id: this project's is kept under its own key (JobAuth.run_owner)
            self.ingest.envelope(env if key == env.run_id else keyed(env, key), defer=True)
            self.ingest.runs.ended(env.heartbeats)  # a final heartbeat: as HTTP's (bot/ingest/runs.py)
        elif kind == HEARTBEAT:
            hb = self._decode(msg.data, Heartbeat)
            owner, key = self._own(project, hb.run_id, hb.project)
            if owner is None:  # a new run, and neither the token nor the heartbeat says its project
                return  # its envelopes create it (they name their project; so does the subject)
            self._check(msg.subject, kind, owner, hb.run_id)
            self.ingest.heartbeat(msgspec.structs.replace(hb, run_id=key), owner)
            self.ingest.runs.ended([hb])
        else:
            raise Poison("subject", f"no msmon message kind {kind!r}")

    def _authorize(self, headers: dict[str, str] | None) -> str:
        """The project of the message's job token; `Poison` for none, an unknown one or an operator's."""
        given = (headers or {}).get(TOKEN_HEADER, "")
        who = self.auth.token_holder(given.encode("utf-8", "replace")) if given else None
        if who is None:
            raise Poison("token", f"missing or unknown job token (header {TOKEN_HEADER}): check the job's "
                                  "bot.token_env and bot.yaml tokens")
        if who[1]:
            raise Poison("token", "an operator's token (commands.operators) on a job's subject; jobs use a job token")
        return who[0]

    def _own(self, project: str, run_id: str, claimed: str | None) -> tuple[str | None, str]:
        """(the project, the bot's key) of the job's run (`JobAuth.run_owner`); `Poison` when refused."""
        problem = alias_problem(run_id)
        if problem is not None:
            raise Poison("schema", problem)
        owner, key, refusal = self.auth.run_owner(project, run_id, claimed)
        if refusal is not None:
            raise Poison("project", refusal)
        return owner, key

    def _known(self, project: str, run_id: str, claimed: str | None) -> tuple[str, str]:
        """`_own` for a poll or an action request; a run not created yet by its job's first message, with a
        token of every project and no project said: `Poison` (the job asks again)."""
        owner, key = self._own(project, run_id, claimed)
        if owner is None:
            raise Poison("project", f"run {run_id!r} has not reported yet (its first envelope says its project)")
        return owner, key

    def _check(self, got: str, kind: str, project: str, run_id: str) -> None:
        want = subject(self.cfg.prefix, project, run_id, kind)
        if got != want:
            raise Poison("subject", f"sent on {got} but it says project {project!r}, run {run_id!r} (subject {want})")

    @staticmethod
    def _decode(data: bytes, type_: Any) -> Any:
        try:
            return decode(data, type_)
        except msgspec.ValidationError as exc:
            raise Poison("schema", f"does not match the schema: {exc}") from None
        except msgspec.DecodeError as exc:
            raise Poison("json", f"not valid JSON: {exc}") from None

    async def _settle(self, how: Callable[[], Any]) -> None:
        """ack / nak / term; a lost one only means a redelivery, which the dedup absorbs."""
        try:
            await how()
        except Exception as exc:  # noqa: BLE001 - NATS went away between fetch and ack
            self._say("ack", f"msmon bot: could not settle a NATS message ({type(exc).__name__}: {exc}); it comes "
                             "again after bot.nats.ack_wait and is deduplicated")

    # -- command polls ---------------------------------------------------------------------------------

    async def _on_poll(self, msg: Any) -> None:
        """A rank's long poll: answered from its own task (a held poll must not hold the others)."""
        if len(self._polls) >= 100_000:
            await self._reply(msg, 429, {"error": "too many command polls held by this bot replica"})
            return
        t = asyncio.create_task(self._poll(msg))
        self._polls.add(t)
        t.add_done_callback(self._polls.discard)

    async def _poll(self, msg: Any) -> None:
        try:
            poll = self._decode(msg.data, Poll)
            project = self._authorize(msg.headers)
            owner, key = self._known(project, poll.run_id, poll.project)
            want = subject(self.cfg.prefix, owner, poll.run_id, POLL)
            if msg.subject != want or msg.reply != subject(self.cfg.prefix, owner, poll.run_id, COMMANDS, poll.device):
                raise Poison("subject", f"a poll for run {poll.run_id!r} device {poll.device!r} must come on {want}, "
                                        "with its rank's command subject to reply to")
        except Poison as exc:
            self.messages.labels(f"poll-{exc.reason}").inc()
            self._say(f"poll-{exc.reason}", f"msmon bot: REFUSED a command poll on {msg.subject}: {exc}", warn=True)
            if self._command_subject(msg.reply):  # never an answer to a subject outside msmon's commands
                await self._reply(msg, _STATUS.get(exc.reason, 422), {"error": str(exc)})
            return
        wait = min(max(poll.wait, 0.0), self.state.cfg.commands.long_poll)
        cmds, cursor = await jobs.long_poll(self.state, key, poll.device, poll.after, wait)
        cmds = [msgspec.structs.replace(c, run_id=poll.run_id) for c in cmds]  # the job's own name for its run
        await self._reply(msg, 200, PollAnswer(commands=cmds, cursor=cursor))

    def _command_subject(self, reply: str | None) -> bool:
        head = f"{self.cfg.prefix}."
        parts = (reply or "")[len(head):].split(".")
        return bool(reply) and str(reply).startswith(head) and len(parts) == 4 and parts[2] == COMMANDS

    async def _on_action(self, msg: Any) -> None:
        """A rank's configured action for its whole run: queued as one command, answered like HTTP's route."""
        try:
            req = self._decode(msg.data, ActionRequest)
            owner, key = self._known(self._authorize(msg.headers), req.run_id, req.project)
            if msg.subject != subject(self.cfg.prefix, owner, req.run_id, ACTION):
                raise Poison("subject", f"an action request for run {req.run_id!r} must come on "
                                        f"{subject(self.cfg.prefix, owner, req.run_id, ACTION)}")
            cmd, new = jobs.rule_request(self.state, self._apply_step, msgspec.structs.replace(req, run_id=key), owner)
        except Poison as exc:
            self.messages.labels(f"action-{exc.reason}").inc()
            self._say(f"action-{exc.reason}", f"msmon bot: REFUSED an action request on {msg.subject}: {exc}",
                      warn=True)
            await self._reply(msg, _STATUS.get(exc.reason, 422), {"error": str(exc)})
            return
        except jobs.RuleRequestError as exc:
            # the exception's own hint, as over HTTP: a 409 "not reported yet" is asked again after a second
            await self._reply(msg, exc.status, {"error": exc.reason}, retry_after="1" if exc.retry else None)
            return
        if new:
            log.warning("msmon bot: run %s: %s asks for %s: queued as %s, every rank applies it at step %d",
                        req.run_id, cmd["source"], req.action, cmd["id"], cmd["apply_step"])
        await self._reply(msg, 202 if new else 200, {"command": tag_nonfinite(view(cmd)), "new": new})

    async def _reply(self, msg: Any, status: int, answer: Any, retry_after: str | None = None) -> None:
        if not msg.reply or self._nc is None:
            return
        headers = {STATUS_HEADER: str(status)}
        if retry_after is not None:
            headers["Retry-After"] = retry_after
        with contextlib.suppress(Exception):  # the job asks again when no answer comes
            await self._nc.publish(msg.reply, encode(answer), headers=headers)

    # -- logs for the person on call: each reason at most once a minute ----------------------------------

    def _say(self, reason: str, text: str, warn: bool = False) -> None:
        now = time.monotonic()
        if now - self._logged.get(reason, -1e9) >= 60.0:
            self._logged[reason] = now
            (log.warning if warn else log.info)("%s", text)


def _delivered(msg: Any) -> int:
    try:
        return int(msg.metadata.num_delivered)
    except Exception:  # noqa: BLE001 - not a JetStream message: its first try
        return 1


__all__ = ["NatsIngest", "Poison"]
