"""Scheduled digests, one per channel on a cron expression (bot.digests): the channel's active runs
with progress, loss trend and ETA; the alerts raised and acknowledged since the last digest; the
WARNINGs that routes with `receiver: digest` held for it instead of posting them.

`compose` is the text (from the store and the metric windows, at a given time); `Digests.send` queues
it as a note through the durable outbox and moves the channel's mark, in one transaction; the cron
jobs are apscheduler's (bot/escalation/scheduler.py's `AsyncIOScheduler`, shared).
`DigestReceiver` is the receiver a `receiver: digest` route delivers to: it only holds the alert.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from bot.commands.parse import format_duration
from bot.config import Digest
from bot.pipeline.route import route_for
from bot.receivers import Message, Note, ReplyTo
from bot.receivers.render import num
from bot.shared import BotState
from bot.store.rows import RunRow
from bot.store.sqlite import OutboxEntry, Store
from msmon.contract.wire import Severity, Window, encode
from msmon.core.trend import summarize

log = logging.getLogger("msmon.bot")

MAX_RUNS = 30  # runs listed in one digest
MAX_ITEMS = 20  # alerts and held WARNINGs listed (the rest counted)


def _when(t: float) -> str:
    return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


class Digests:
    def __init__(self, state: BotState, clock: Callable[[], float] = time.time) -> None:
        self.state, self.clock = state, clock

    def start(self, scheduler: Any) -> None:
        """One cron job per configured digest on `scheduler` (an apscheduler scheduler)."""
        from apscheduler.triggers.cron import CronTrigger  # type: ignore[import-untyped]

        for i, d in enumerate(self.state.cfg.digests):
            scheduler.add_job(self._tick, CronTrigger.from_crontab(d.cron, timezone=d.timezone), args=[d],
                              id=f"digest-{i}", max_instances=1, coalesce=True, misfire_grace_time=3600)

    async def _tick(self, digest: Digest) -> None:
        """The cron job, on the event loop (a plain function would run on apscheduler's threads)."""
        try:
            if self.state.owns(f"digest:{digest.channel}"):  # replicas: one sends it (a lease row)
                self.send(digest)
        except Exception:  # noqa: BLE001 - SQLite trouble: said, and the next digest covers the span
            log.exception("msmon bot: the digest for %s failed; the next one covers its span", digest.channel)

    def send(self, digest: Digest) -> None:
        """Queue the digest of `digest.channel` now and mark it sent."""
        store = self.state.store
        now = self.clock()
        with self.state.tx():
            since = store.escalations.digest_since(digest.channel)
            text = self.compose(digest.channel, since, now)
            note = Note(text=text, reply_to=ReplyTo(channel=digest.channel))
            store.enqueue_many([OutboxEntry(now, digest.receiver, digest.channel, "note", f"digest|{digest.channel}|"
                                            f"{now!r}", None, encode(note).decode(), now)])
            store.escalations.mark_digest(digest.channel, now)
        self.state.wake_outbox()
        log.info("msmon bot: digest for %s queued (%d lines)", digest.channel, text.count("\n") + 1)

    def _runs_of(self, channel: str) -> list[RunRow]:
        """Active runs (not gone, not ended) routed to `channel` at either severity."""
        store, routes = self.state.store, self.state.cfg.routes
        ended = store.escalations.ended()
        out = []
        for r in store.runs():
            if r["gone"] or (r["run_id"] in ended and ended[r["run_id"]] >= (r["last_heartbeat"] or 0)):
                continue
            chans = {route_for(r["project"], r["labels"], sev, routes).channel for sev in Severity}
            if channel in chans or not routes:
                out.append(r)
        return out

    def compose(self, channel: str, since: float | None, now: float) -> str:
        """The digest's text for `channel`, covering (`since`, `now`]."""
        start = since if since is not None else 0.0
        span = f"since {_when(since)}" if since is not None else "since the bot started keeping state"
        lines = [f"*msmon digest* for {channel}, {_when(now)} ({span})"]
        runs = self._runs_of(channel)
        lines.append(f"Active runs: {len(runs)}" + (f" (first {MAX_RUNS})" if len(runs) > MAX_RUNS else ""))
        for r in runs[:MAX_RUNS]:
            lines.append("- " + self._run_line(r))
        lines += self._alert_lines({r["run_id"] for r in runs} | self._channel_runs(channel), start)
        held = self.state.store.escalations.held(channel, start)
        if held:
            lines.append(f"WARNINGs held for this digest: {len(held)}")
            lines += [f"- {h['run_id']} {h['rule']}: {h['text']}" for h in held[-MAX_ITEMS:]]
        return "\n".join(lines)

    def _channel_runs(self, channel: str) -> set[str]:
        """Runs whose escalations or held WARNINGs went to `channel` (ended runs included)."""
        store = self.state.store
        return {e["run_id"] for e in store.escalations.of() if e["channel"] == channel} | \
            {h["run_id"] for h in store.escalations.held(channel, 0.0)}

    def _run_line(self, r: RunRow) -> str:
        windows = self.state.windows
        run_id = r["run_id"]
        step = r["last_step"] or 0
        total, target = windows.plans.get(run_id, (None, None))
        parts = [f"{run_id} ({r['project']}): step {step:,}" + (f" of {total:,} ({100 * step / total:.0f}%)"
                                                                  if total else ""),
                 f"{len(r['devices'])} device(s)", "paused" if r["paused"] else "running"]
        devices = sorted(windows.runs.get(run_id, {}))
        hist = windows.history(run_id, devices[0]) if devices else []
        if hist:
            w = Window.of(hist)
            trend = summarize(w.steps, w.loss, total_steps=total, target_loss=target)
            loss = next((v for v in reversed(w.loss) if v is not None), None)
            if loss is not None:
                parts.append(f"loss {num(loss)}")
            if trend is not None:
                parts.append(trend.describe()[0])
        pace = windows.pace(run_id)
        if total is not None and pace is not None and not r["paused"]:
            parts.append(f"ETA {format_duration(max(round(max(total - step, 0) / pace[0]), 1))}")
        return "; ".join(parts)

    def _alert_lines(self, runs: set[str], since: float) -> list[str]:
        store = self.state.store
        alerts = [a for run in sorted(runs) for a in store.alerts(run) if (a["updated_at"] or 0) >= since]
        escs = [e for e in store.escalations.of() if e["run_id"] in runs and (e["started_at"] or 0) >= since]
        acked = [e for e in store.escalations.of() if e["run_id"] in runs and e["state"] == "acked"
                 and (e["closed_at"] or 0) >= since]
        by_sev = {s: sum(1 for a in alerts if a["severity"] == s) for s in ("ERROR", "WARNING")}
        out = [f"Alerts since the last digest: {by_sev['ERROR']} ERROR, {by_sev['WARNING']} WARNING; "
               f"{len(escs)} escalated, {len(acked)} acknowledged"]
        for a in alerts[:MAX_ITEMS]:
            who = f", acknowledged by {a['acked_by']}" if a["acked_by"] else ""
            out.append(f"- {a['severity']} {a['rule']} on {a['run_id']} device {a['device']} ({a['status']}, "
                       f"steps {a['first_step']:,}-{a['last_step']:,}{who})")
        return out


class DigestReceiver:
    """`receiver: digest`: an alert routed here is held for its channel's next digest, not posted."""

    name = "digest"
    charts = False

    def __init__(self, store: Store, clock: Callable[[], float] = time.time) -> None:
        self.store, self.clock = store, clock

    def _hold(self, channel: str, msg: Message) -> None:
        ev = msg.lead
        self.store.escalations.hold_for_digest(channel, self.clock(), msg.run_id, msg.rule, msg.severity.value,
                                               f"{msg.status.value} at step {ev.step:,}: {ev.message}")

    async def post(self, channel: str, msg: Message) -> str:
        self._hold(channel, msg)
        return f"digest-{channel}"

    async def attach(self, channel: str, ref: str, msg: Message) -> None:
        """Nothing: a digest has no charts."""

    async def update(self, channel: str, ref: str, msg: Message) -> None:
        self._hold(channel, msg)

    async def reply(self, channel: str, ref: str, msg: Message) -> None:
        self._hold(channel, msg)

    async def note(self, note: Note) -> None:
        """Nothing: command answers go to chat."""
