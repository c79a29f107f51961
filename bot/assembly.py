"""The bot's parts built once, each given what it needs when it is built, for bot/app.py's `create_app`.

    build        the store, the state, the ingest, the receivers, the delivery workers (`Outbox`, email's own
                 lane beside it), the tokens, the command service, the escalator and the digests (`Parts`)
    Background   what runs for the app's lifetime: the chat platforms' tasks, the NATS ingest, the escalator, the
                 delivery workers and the periodic passes; stopped in that order, then the store flushed and closed
    Drain        shutting down: the jobs' long polls answered at once

Nothing is wired after it is built: a delivery worker joins the state's doorbell and takes its hooks (the console
link, the dead letters' notification log, the overload's shedding and chart backlog) as it is built.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client import Counter

from bot.commands import jobs
from bot.commands.origin import Origin
from bot.commands.service import CommandService
from bot.config import BotConfig
from bot.delivery import nflog
from bot.delivery.digest import DigestReceiver, Digests
from bot.delivery.worker import Lane, Outbox
from bot.escalation.scheduler import AckLinks, Escalator
from bot.ingest.auth import JobAuth, Token, configured_tokens
from bot.ingest.envelope import Ingest
from bot.ingest.overload import Level, Median, Overload
from bot.ingest.watchdog import Watchdog
from bot.integration import Context, Integration, Task
from bot.integrations import chat_integrations
from bot.metrics import BotMetrics
from bot.pipeline.ratelimit import RateLimiter
from bot.pipeline.schedule import Policy
from bot.ranks.missing import RULE as MISSING_RULE
from bot.ranks.watch import RankWatch
from bot.receivers import Receiver
from bot.receivers.alertmanager.receiver import interop_receivers
from bot.receivers.console import ConsoleReceiver
from bot.shared import BotState
from bot.store import open_store
from bot.store.sqlite import Store
from bot.web import console_link
from msmon.contract.wire import Event, Status

if TYPE_CHECKING:  # nats-py is imported only when bot.nats.url is set
    from bot.ingest.nats import NatsIngest

log = logging.getLogger("msmon.bot")


@dataclasses.dataclass(frozen=True)
class Parts:
    """The bot as `build` made it: what the HTTP routes and the background tasks use."""

    cfg: BotConfig
    clock: Callable[[], float]
    state: BotState
    ingest: Ingest
    receivers: dict[str, Receiver]
    outbox: Outbox  # every receiver but email
    mailbox: Outbox | None  # email's own lane (bot.email.host set): SMTP never holds a chat message
    tokens: list[Token]
    auth: JobAuth  # whose a token is and whose a run is, for HTTP and NATS alike
    refused: Counter  # cross-project requests refused, by route
    svc: CommandService
    escalator: Escalator
    digests: Digests
    chat: list[Integration]  # Slack, Matrix, Feishu, DingTalk, WeCom (bot/integrations.py)
    ctx: Context  # what the chat platforms' routes and tasks use
    draining: asyncio.Event  # set on shutdown: jobs' long polls are answered at once


def build(cfg: BotConfig, clock: Callable[[], float] = time.time, receivers: dict[str, Receiver] | None = None,
          delivery: Policy | None = None, escalation_period: float = 1.0) -> Parts:
    """Every part, each after what it needs (and the metrics in the order /metrics has always listed them)."""
    store = open_store(cfg)  # SQLite (bot.state_path) or PostgreSQL (bot.store.url), migrated (bot/store)
    m = BotMetrics()
    state = BotState(cfg, store, m, clock)
    m.watch(state)  # per-run gauges and delivery figures at /metrics
    chat = chat_integrations()
    receivers = _extra_receivers(cfg, receivers or build_receivers(cfg, chat), store, clock)
    ingest = Ingest(state)
    outbox, mailbox = _outboxes(state, receivers, ingest.overload, delivery if delivery is not None else _policy(cfg))
    tokens = configured_tokens(cfg)
    refused = Counter("msmon_cross_project_refused_total", "job requests refused for another project's run, "
                      "by route", ["route"], registry=m.registry)
    svc = CommandService(state)
    escalator = Escalator(state, clock, period=escalation_period, links=ack_links(cfg),  # the job told of an email ack
                          on_ack=lambda run, rule, who, now: svc.tell_job_acked(run, rule, None,
                                                                                Origin(source="email", user=who), now))
    return Parts(cfg, clock, state, ingest, receivers, outbox, mailbox, tokens, JobAuth(tokens, store), refused, svc,
                 escalator, Digests(state, clock), chat, Context(cfg, clock, svc), asyncio.Event())


def _policy(cfg: BotConfig) -> Policy:
    """The retry schedule of bot.yaml's `delivery`."""
    dc = cfg.delivery
    return Policy(base=dc.backoff_base, cap=dc.backoff_max, max_attempts=dc.max_attempts,
                  max_error_attempts=dc.max_error_attempts, max_retry_after=dc.max_retry_after)


def _outboxes(state: BotState, receivers: dict[str, Receiver], overload: Overload, policy: Policy
              ) -> tuple[Outbox, Outbox | None]:
    """The delivery worker of every receiver but email, and email's own (when there is an email receiver); each with
    its own rate limits, each joining the state's doorbell. Each message links to its run's console page (bot/web);
    a dead letter's alerts are not notified (nflog.py); while the ingest sheds, an ERROR's text goes without its
    chart, and a chart waiting for the drawing executor is the bot's backlog too (bot/ingest/overload.py)."""
    cfg, rl, charts_waiting = state.cfg, state.cfg.rate_limit, overload.backlogs["charts"]
    link = console_link(cfg)

    def chart_waits() -> Callable[[], None]:
        token = charts_waiting.enter(overload.clock())
        return lambda: charts_waiting.leave(token)

    outbox = Outbox(state.store, receivers, RateLimiter(rl.per_channel, rl.per_run, rl.global_rate, rl.burst),
                    state.metrics, state.clock, policy=policy, lane=Lane("email", only=False), bell=state.doorbell,
                    link=link, given_up=functools.partial(nflog.given_up, state),
                    shedding=lambda: overload.level > Level.NORMAL, chart_waits=chart_waits)
    mailbox = Outbox(state.store, receivers, RateLimiter(rl.per_channel, rl.per_run, rl.global_rate, rl.burst),
                     state.metrics, state.clock, policy=policy, lane=Lane("email", only=True), bell=state.doorbell,
                     link=link) if "email" in receivers else None
    return outbox, mailbox


def _extra_receivers(cfg: BotConfig, receivers: dict[str, Receiver], store: Store,
                     clock: Callable[[], float]) -> dict[str, Receiver]:
    """`receivers` plus the email receiver (bot.email.host set) and the digest receiver (a route uses it)."""
    out = dict(receivers)
    e = cfg.email
    if e.host and "email" not in out:
        from bot.receivers.email import EmailReceiver

        out["email"] = EmailReceiver(e.host, e.port, e.tls, e.sender, e.timeout, e.username_env, e.password_env,
                                     e.ca_file, clock)
    if any(r.receiver == "digest" for r in cfg.routes) and "digest" not in out:
        out["digest"] = DigestReceiver(store, clock)
    return out


def ack_links(cfg: BotConfig) -> AckLinks | None:
    """The escalation mail's signed acknowledge links, when their key is set."""
    key = os.environ.get(cfg.email.ack_secret_env, "")
    if cfg.email.host and cfg.email.public_url and not key:
        log.warning("msmon bot: escalation mail goes without an acknowledge link: the environment variable %s (the "
                    "key that signs the links) is empty", cfg.email.ack_secret_env)
    return AckLinks(key.encode(), cfg.email.ack_link_ttl) if key else None


def build_receivers(cfg: BotConfig, chat: list[Integration] | None = None,
                    clock: Callable[[], float] = time.time) -> dict[str, Receiver]:
    """The console, each chat platform's receiver its routes use (bot/integrations.py), and the Alertmanager and
    webhook receivers the routes use."""
    receivers: dict[str, Receiver] = {
        "console": ConsoleReceiver(cfg.console.charts_dir if cfg.console.charts else None)}
    ctx = Context(cfg, clock)
    for integration in chat if chat is not None else chat_integrations():
        receiver = integration.receiver(ctx)
        if receiver is not None:
            receivers[integration.name] = receiver
    receivers.update(interop_receivers(cfg))  # alertmanager, alertmanager_api, webhook (the routes that use them)
    return receivers


def prune_old_runs(state: BotState) -> list[str]:
    """The runs past bot.retention forgotten, a batch a pass, by one replica at a time (its lease)."""
    if not state.cfg.retention or not state.owns("retention"):
        return []
    gone = state.store.prune_runs(state.clock() - state.cfg.retention)
    if gone:
        log.info("msmon bot: forgot %d run(s) last seen more than %.0f days ago (bot.retention): %s", len(gone),
                 state.cfg.retention / 86400, ", ".join(gone[:5]) + (" ..." if len(gone) > 5 else ""))
    return gone


async def _every(period: float, fn: Callable[[], object], stop: asyncio.Event) -> None:
    while not stop.is_set():
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), period)
        try:
            fn()
        except Exception:  # noqa: BLE001 - a failed flush is retried next period; the bot keeps serving
            log.exception("msmon bot: %s failed; retrying in %.0f s", getattr(fn, "__name__", fn), period)


LAG_PERIOD = 0.05  # seconds between two samples of the backlog and of the event loop's lag
LAG_SAMPLES = 40  # the signals are the medians of the last 40 (2 s when on time): a backlog that lasts, not a burst


async def watch_lag(ingest: Ingest, metrics: BotMetrics, stop: asyncio.Event, period: float = LAG_PERIOD) -> None:
    """How long the bot's own waiting work waits (and, while some waits, how late the event loop runs a timer) sets
    what the ingest sheds (bot/ingest/overload.py); a change of level is logged once, with what was shed in the last
    minute (never a line per request)."""
    loop = asyncio.get_running_loop()
    overload, lags, waits = ingest.overload, Median(LAG_SAMPLES), Median(LAG_SAMPLES)
    backlogs = overload.backlogs
    while not stop.is_set():
        t0 = loop.time()
        await asyncio.sleep(period)
        lag = lags(max(0.0, loop.time() - t0 - period))
        changed = overload.observe(waits(backlogs.age(overload.clock())), lag, backlogs.depth)
        if changed is not None:
            metrics.overload.set(int(changed))
            (log.warning if changed else log.info)("msmon bot: %s", overload.say())


class Background:
    """The bot's tasks for the app's lifetime (aiohttp's cleanup context, `__call__`). Started: the chat platforms'
    tasks, the NATS ingest, the escalator and the digests, then the delivery workers, the watchdog and the periodic
    passes. Stopped: the chat tasks first, then NATS, the escalator, the rest; then the store flushed and closed."""

    def __init__(self, bot: Parts) -> None:
        self.bot = bot
        self.watchdog = Watchdog(bot.cfg, bot.state.store, bot.ingest, bot.clock)
        state = bot.state
        self.ranks = RankWatch(state.ranks, bot.cfg.ranks, self._rank_event, state.store.run, bot.clock,
                               state.wake_outbox)  # bot/ranks

    def _rank_event(self, ev: Event, project: str, labels: dict[str, str], now: float, rank: int | None = None) -> int:
        queued = self.bot.ingest.event(ev, project, labels, now, rank)
        if ev.rule == MISSING_RULE and ev.status is Status.FIRING:
            self.bot.ingest.runs.settle(ev.run_id)  # the others may have ended: the run died (bot/ingest/runs.py)
        return queued

    async def __call__(self, app: web.Application) -> AsyncIterator[None]:
        bot = self.bot
        chat_tasks = await self._start_chat()
        nats_in = await self._start_nats()
        stop = asyncio.Event()
        bot.escalator.start()
        bot.digests.start(bot.escalator.scheduler)
        tasks = self._tasks(stop)
        yield
        for task in chat_tasks:
            await task.stop()  # first: no command arrives while the rest shuts down
        if nats_in is not None:
            await nats_in.stop()  # what it took and did not commit goes to another replica after ack_wait
        bot.escalator.stop()
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._close()

    async def _start_chat(self) -> list[Task]:
        """Slack's Socket Mode, Matrix's /sync loop: each platform's own task, started."""
        chat_tasks: list[Task] = []
        for integration in self.bot.chat:
            task = integration.task(self.bot.ctx)
            if task is not None:
                await task.start()
                chat_tasks.append(task)
        return chat_tasks

    async def _start_nats(self) -> NatsIngest | None:
        """Jobs' envelopes over NATS JetStream too (bot/ingest/nats.py), when bot.nats.url is set; else None."""
        bot = self.bot
        if not bot.cfg.nats.url:
            return None
        from bot.ingest.nats import NatsIngest

        nats_in = NatsIngest(bot.cfg.nats, bot.state, bot.ingest, bot.auth, bot.svc.apply_step)
        await nats_in.start()
        return nats_in

    def _tasks(self, stop: asyncio.Event) -> list[asyncio.Task[Any]]:
        """The delivery workers, the watchdog and the periodic passes, each running until `stop` is set."""
        bot, state, cfg = self.bot, self.bot.state, self.bot.cfg
        tasks = [asyncio.create_task(bot.outbox.run(stop)), asyncio.create_task(self.watchdog.run(stop)),
                 asyncio.create_task(_every(60.0, lambda: prune_old_runs(state), stop)),
                 asyncio.create_task(_every(1.0, state.flush, stop)),
                 asyncio.create_task(_every(1.0, lambda: state.owns("command-expiry") and jobs.expire(state), stop)),
                 asyncio.create_task(state.store.listen(state.command_queued, stop))]  # other replicas' commands
        if bot.mailbox is not None:
            tasks.append(asyncio.create_task(bot.mailbox.run(stop)))
        if "alertmanager_api" in bot.receivers:  # firing alerts pushed again, as Prometheus does (alertmanager/push.py)
            from bot.receivers.alertmanager.push import AlertmanagerRefresh

            refresh = AlertmanagerRefresh(state, bot.receivers["alertmanager_api"], cfg.alertmanager.resend_interval)
            tasks.append(asyncio.create_task(refresh.run(stop)))
        if cfg.ranks.enable:
            tasks.append(asyncio.create_task(_every(cfg.ranks.period, self.ranks.check, stop)))
        if cfg.overload.enable:
            tasks.append(asyncio.create_task(watch_lag(bot.ingest, state.metrics, stop)))
        return tasks

    def _close(self) -> None:
        """The alerts' held last steps written, then the store closed; a store away at shutdown stops all the same."""
        state, store = self.bot.state, self.bot.state.store
        try:
            state.flush()
        except store.Error as exc:  # the database is away at shutdown: stop all the same
            log.warning("msmon bot: stopping while the state store at %s fails (%s); the alerts' last steps held in "
                        "memory are not written (their jobs' next envelopes write them again)", store.where,
                        str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
        store.close()


class Drain:
    """Shutting down (aiohttp's on_shutdown, `__call__`): the jobs' long polls are answered now with what is there
    (usually nothing) and new ones at once, so the bot stops in about a second instead of after the longest poll; a
    job polls again later (from this bot when it is back)."""

    def __init__(self, state: BotState, draining: asyncio.Event) -> None:
        self.state, self.draining = state, draining

    async def __call__(self, app: web.Application) -> None:
        self.draining.set()
        polls = list(self.state.waiters.events)
        for run_id in polls:
            self.state.waiters.wake(run_id)
        log.info("msmon bot: shutting down; %d job long poll(s) answered", len(polls))
