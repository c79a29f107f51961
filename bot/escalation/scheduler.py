"""The escalation edge: reads alerts and escalations from SQLite, asks the pure policy what is due,
queues the steps' messages through the durable outbox and writes the new state, in one transaction.

    alerts (firing ERRORs, acks) ─► Escalator.sync ─► policy.decide ─► outbox rows (note, mail) + steps
                                    (apscheduler jobs)                 + escalation row, one commit

Timing is apscheduler's `AsyncIOScheduler`: one job per open escalation at its next step's due time,
rebuilt from the escalations table on start (so a restart neither loses a level nor repeats one: a
step is taken in the transaction that advances `next_step`), plus a short interval job that picks up
new ERRORs, acknowledgements, resolutions and silences.

Ownership (several replicas on one database later): an escalation is acted on only by the instance
holding its lease row (`escalations.owner`, `lease_until`), claimed in the same transaction as the
step; another instance takes over once the lease has run out. One owner per escalation, never two.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import logging
import secrets
import time
from collections.abc import Callable
from typing import Any

import msgspec
from apscheduler.schedulers.asyncio import AsyncIOScheduler  # type: ignore[import-untyped]
from prometheus_client import Counter

from bot.config import EscalationPolicy
from bot.escalation.policy import AlertNow, Escalation, Step, decide
from bot.pipeline.group import firing_key
from bot.pipeline.route import route_for
from bot.receivers import Mail, Note, ReplyTo
from bot.receivers.render import cost_line, escape_console, mention_text, num
from bot.shared import BotState
from bot.store.sqlite import OutboxEntry
from msmon.contract.wire import Event, Severity, decode, encode

log = logging.getLogger("msmon.bot")

WATCHDOG_RULES = ("job_gone", "job_stalled")
LEASE = 30.0  # seconds an owner holds an escalation without acting on it


@dataclasses.dataclass
class Group:
    """The firing alerts of one run's rule, as an escalation sees them."""

    run_id: str
    rule: str
    severity: str
    acked_by: str | None


def subject(ev: Event) -> str:
    """A subject to triage from a phone: `[msmon ERROR] run-42 grad_norm 48.2 > 10 at step 12,400`."""
    head = f"[msmon {ev.severity.value}] {escape_console(ev.run_id)} {escape_console(ev.rule)}"
    if ev.rule in WATCHDOG_RULES:
        return f"{head}: silent {num(ev.value)} s at step {ev.step:,}"
    return f"{head} {num(ev.value)} > {num(ev.threshold)} at step {ev.step:,}"


class AckLinks:
    """Signed, expiring, single-use acknowledge links: `<esc id>.<expires>.<nonce>.<hmac>`."""

    def __init__(self, key: bytes, ttl: float) -> None:
        self.key, self.ttl = key, ttl

    def _sig(self, body: str) -> str:
        return hmac.new(self.key, body.encode(), hashlib.sha256).hexdigest()[:32]

    def make(self, esc_id: int, now: float) -> str:
        body = f"{esc_id}.{int(now + self.ttl)}.{secrets.token_hex(8)}"
        return f"{body}.{self._sig(body)}"

    def check(self, token: str, now: float) -> tuple[int, str] | str:
        """(escalation id, nonce) of a valid token, or why it is refused."""
        parts = token.split(".")
        if len(parts) != 4 or not all(parts):
            return "not an acknowledge link msmon made"
        body, sig = ".".join(parts[:3]), parts[3]
        if not hmac.compare_digest(sig, self._sig(body)):
            return "the link's signature does not match (edited, or made with another key)"
        try:
            esc_id, expires = int(parts[0]), int(parts[1])
        except ValueError:
            return "not an acknowledge link msmon made"
        if now > expires:
            return f"the link expired {int(now - expires)} s ago; acknowledge in chat: `ack RUN/RULE`"
        return esc_id, parts[2]


class Escalator:
    """Runs the escalation policies of `cfg.routes` over the bot's alerts (see the module docstring)."""

    def __init__(self, state: BotState, clock: Callable[[], float] = time.time, owner: str | None = None,
                 period: float = 1.0, links: AckLinks | None = None) -> None:
        self.state, self.cfg, self.clock, self.period, self.links = state, state.cfg, clock, period, links
        # The store's owner: one per SQLite file (a restarted bot holds its escalations' leases at once, so
        # a level falls due on time across a SIGKILL), one per process on PostgreSQL (released at stop).
        self.owner = owner or state.store.owner
        self.scheduler: AsyncIOScheduler | None = None
        # (run, rule, who, now) after an email link acknowledged a firing alert: bot/app.py tells the job
        # through the command service, as for an ack typed in chat
        self.on_ack: Callable[[str, str, str, float], object] | None = None
        # esc id -> (its row's state, its alert's, when its next step falls due) as the last pass left them: a pass
        # passes over an escalation that nothing changed for and nothing fell due (no claim, no read of its event)
        self._settled: dict[int, tuple[Any, ...]] = {}
        self.steps = Counter("msmon_escalation_steps_total", "escalation steps taken, by receiver (and the acks and "
                             "resolutions that closed one)", ["how"], registry=state.metrics.registry)

    @property
    def store(self) -> Any:
        return self.state.store

    # -- apscheduler --------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the scheduler: the reconcile job, and one job per open escalation rebuilt from SQLite."""
        self.scheduler = AsyncIOScheduler(timezone="UTC")
        self.scheduler.add_job(self._tick, "interval", seconds=self.period, id="escalation-sync",
                               max_instances=1, coalesce=True)
        self.scheduler.start()
        opened = self.store.escalations.open()
        for row in opened:
            self._plan(row["id"], self._next_at(row))
        if opened:
            log.info("msmon bot: %d open escalations taken up from %s", len(opened), self.store.path)

    def stop(self) -> None:
        """Stop, and give up this owner's leases (the next process or replica takes over at once)."""
        if self.scheduler is not None and self.scheduler.running:
            self.scheduler.shutdown(wait=False)
        try:
            with self.state.tx():
                self.store.release(self.owner)
                if self.state.store.owner != self.owner:
                    self.store.release(self.state.store.owner)
        except Exception:  # noqa: BLE001 - the store is away: the leases run out by themselves
            log.warning("msmon bot: could not release the escalator's leases; another owner takes over when they "
                        "run out")

    def _plan(self, esc_id: int, at: float | None) -> None:
        """The job of one escalation at its next due time (real time: apscheduler's clock)."""
        if self.scheduler is None or at is None:
            return
        from datetime import datetime, timezone

        when = datetime.fromtimestamp(time.time() + max(at - self.clock(), 0.0), tz=timezone.utc)
        self.scheduler.add_job(self._tick, "date", run_date=when, id=f"escalation-{esc_id}", replace_existing=True)

    def _next_at(self, row: dict[str, Any]) -> float | None:
        policy = self.cfg.escalations.get(row["policy"])
        if policy is None:
            return None
        return decide(_escalation(row), policy, AlertNow(firing=True), float("-inf")).next_at

    async def _tick(self) -> None:
        """A job of the scheduler: on the event loop (a plain function would run on apscheduler's threads)."""
        try:
            self.sync()
        except Exception:  # noqa: BLE001 - SQLite trouble: the next tick tries again
            log.exception("msmon bot: escalation pass failed; retrying in %.0f s", self.period)

    # -- one pass -------------------------------------------------------------------------------------

    def sync(self) -> int:
        """Start escalations for new alerts, take what is due, close what is acked or resolved; how many
        steps were taken."""
        now = self.clock()
        taken = 0
        if not self.state.owns("escalator"):
            return 0  # another replica runs the escalations (a lease row); this one takes over if it stops
        with self.state.tx():
            opened = self.store.escalations.open()
            if not opened and not self._severities():
                return 0  # nothing open and no route escalates: the firing alerts are not read at all
            groups = self._groups()
            self._start_new(groups, now)
            quiet = not self.store.silences(now)  # a silence can pause or resume any escalation as time passes
            settled, self._settled = self._settled, {}
            for row in self.store.escalations.open():
                g = groups.get((row["run_id"], row["rule"]))
                mark = (row["next_step"], row["paused_at"], row["shift"], g.severity if g else None,
                        g.acked_by if g else None)
                last = settled.get(row["id"])
                if quiet and last is not None and last[:-1] == mark and (last[-1] is None or last[-1] > now):
                    self._settled[row["id"]] = last
                    continue
                policy = self.cfg.escalations.get(row["policy"])
                if policy is None or not self.store.escalations.claim(row["id"], self.owner, now, LEASE):
                    continue
                acted = self._act(row, policy, g, now)
                taken += acted[0]
                if quiet and acted[1] is not None:
                    self._settled[row["id"]] = (*acted[1], acted[2])
        if taken:
            self.state.wake_outbox()
        return taken

    def _groups(self) -> dict[tuple[str, str], Group]:
        """Firing alerts by (run, rule): the most severe, acked when every firing one is."""
        out: dict[tuple[str, str], Group] = {}
        rows = self.store.db.execute("SELECT run_id, rule, severity, acked_by FROM alerts WHERE status='firing'")
        for r in rows:
            key = (r["run_id"], r["rule"])
            g = out.get(key)
            if g is None:
                out[key] = Group(r["run_id"], r["rule"], r["severity"], r["acked_by"])
                continue
            if r["severity"] == "ERROR":
                g.severity = "ERROR"
            g.acked_by = g.acked_by if r["acked_by"] is not None else None
        return out

    def _lead(self, run_id: str, rule: str) -> Event | None:
        """The latest event of a run's firing rule (read only for an open escalation: it carries a window)."""
        r = self.store.db.execute("SELECT event FROM alerts WHERE run_id=? AND rule=? AND status='firing' ORDER BY"
                                  " updated_at DESC LIMIT 1", (run_id, rule)).fetchone()
        return None if r is None else _event(r["event"])

    def _route(self, run_id: str) -> tuple[Any, dict[str, Any] | None]:
        run = self.store.run(run_id)
        if run is None:
            return None, None
        return route_for(run["project"], run["labels"], Severity.ERROR, self.cfg.routes), run

    def _severities(self) -> set[str]:
        """The severities some route's escalation policy takes (none: no route escalates)."""
        return {sev for r in self.cfg.routes if r.escalation and r.escalation in self.cfg.escalations
                for sev in self.cfg.escalations[r.escalation].severities}

    def _start_new(self, groups: dict[tuple[str, str], Group], now: float) -> None:
        # What a pass costs follows what can escalate: no run read for a group of a severity no policy takes,
        # each run's route read once a pass (20,000 firing alerts read their run every second: 1.9 s a pass)
        severities = self._severities()
        if not severities:
            return
        active = {(r["run_id"], r["rule"]) for r in self.store.escalations.open()}
        routes: dict[str, Any] = {}
        for key, g in groups.items():
            if key in active or g.acked_by is not None or g.severity not in severities:
                continue
            if g.run_id not in routes:
                routes[g.run_id] = self._route(g.run_id)[0]
            route = routes[g.run_id]
            policy = self.cfg.escalations.get(route.escalation) if route is not None and route.escalation else None
            if policy is None or g.severity not in policy.severities:
                continue
            esc_id = self.store.escalations.start(g.run_id, g.rule, route.escalation, route.receiver, route.channel,
                                                  now)
            log.info("msmon bot: escalation %d started for %s of run %s (policy %s)", esc_id, g.rule, g.run_id,
                     route.escalation)

    def _act(self, row: dict[str, Any], policy: EscalationPolicy, g: Group | None, now: float
             ) -> tuple[int, tuple[Any, ...] | None, float | None]:
        """(steps taken, the escalation's row and alert as this leaves them, when its next step falls due): the
        second None when the next pass must look at it again."""
        esc = _escalation(row)
        firing = g is not None and g.severity in policy.severities
        ev = self._lead(esc.run_id, esc.rule) if firing else None
        if firing and ev is None:
            return 0, None, None  # its event does not decode (logged): no step is taken, none is skipped
        silenced = ev is not None and any(s.matches(ev, now) for s in self.store.silences(now))
        d = decide(esc, policy, AlertNow(firing, g.acked_by if g else None, silenced), now)
        new = d.escalation
        alert = (g.severity if g else None, g.acked_by if g else None)
        if not d.changed and new == esc:
            return 0, (row["next_step"], row["paused_at"], row["shift"], *alert), d.next_at
        if new.state != "active":
            who = [g.acked_by] if new.state == "acked" and g and g.acked_by else []
            self.store.escalations.record_step(esc.id, new.next_step, -1, -1, now, new.state, who,
                                               f"{new.state} after {new.next_step} steps")
            self.steps.labels(new.state).inc()
            log.info("msmon bot: escalation %d (%s of run %s) %s", esc.id, esc.rule, esc.run_id,
                     f"acknowledged by {who[0]}" if who else new.state)
        for step in d.steps:
            assert ev is not None  # steps are only due while it fires
            self._take(row, policy, step, ev, now)
        self.store.escalations.save(esc.id, next_step=new.next_step, state=new.state, paused_at=new.paused_at,
                                    shift=new.shift, acked_by=g.acked_by if g and new.state == "acked" else None,
                                    closed_at=now if new.state != "active" else None)
        self._plan(esc.id, d.next_at)
        kept = (new.next_step, new.paused_at, new.shift, *alert) if new.state == "active" else None
        return len(d.steps), kept, d.next_at

    # -- a step's messages ---------------------------------------------------------------------------

    def _take(self, row: dict[str, Any], policy: EscalationPolicy, step: Step, ev: Event, now: float) -> None:
        level = policy.levels[step.level]
        run = self.store.run(ev.run_id) or {}
        devices = len(run.get("devices") or [])
        total = len(policy.levels) * (1 + policy.repeat)
        lines = [cost_line(ev.run_id, devices, ev.severity.value, row["started_at"], now),
                 f"{ev.severity.value} {ev.rule} at step {ev.step:,}: {ev.message}",
                 f"escalation step {step.number + 1} of {total} (level {step.level + 1}"
                 f"{f', round {step.round + 1}' if policy.repeat else ''}); acknowledge to stop it: "
                 f"`ack {ev.run_id}/{ev.rule}`"]
        if ev.hint:
            lines.append(f"what to do: {ev.hint}")
        text = "\n".join(lines)
        reply_to = self._reply_to(row, ev)
        if level.mention:
            note = Note(text=f"{mention_text(level.mention)}\n{text}", reply_to=reply_to, mentions=list(level.mention))
            self._queue(OutboxEntry(now, row["receiver"], row["channel"], "note", f"esc{row['id']}|step{step.number}",
                                    ev.run_id, encode(note).decode(), now))
            self.store.escalations.record_step(row["id"], step.number, step.round, step.level, now, row["receiver"],
                                               list(level.mention), lines[0])
        if level.email:
            mail = self._mail(row, step, ev, text, list(level.email), reply_to, devices, now)
            self._queue(OutboxEntry(now, "email", "email", "mail", f"esc{row['id']}|step{step.number}", ev.run_id,
                                    msgspec.json.encode(mail).decode(), now))
            self.store.escalations.record_step(row["id"], step.number, step.round, step.level, now, "email",
                                               list(level.email), mail.subject)

    def _queue(self, entry: OutboxEntry) -> None:
        self.store.enqueue_many([entry])
        self.steps.labels(entry.receiver).inc()

    def _reply_to(self, row: dict[str, Any], ev: Event) -> ReplyTo:
        """The alert's thread in the route's channel when its message is known, else the channel."""
        posted = self.store.message(firing_key(ev))
        return ReplyTo(channel=row["channel"], thread=posted["ts"] if posted and posted["channel"] == row["channel"]
                       else "")

    def _mail(self, row: dict[str, Any], step: Step, ev: Event, text: str, to: list[str], reply_to: ReplyTo,
              devices: int, now: float) -> Mail:
        domain = self.cfg.email.sender.rpartition("@")[2] or "msmon"
        message_id = f"<msmon.esc{row['id']}.step{step.number}.{secrets.token_hex(4)}@{domain}>"
        thread = row["mail_root"] or ""
        if not thread:
            self.store.escalations.set_mail_root(row["id"], message_id)
            row["mail_root"] = message_id
        ack_url = ""
        public = self.cfg.email.public_url
        if self.links is not None and public:
            ack_url = f"{public.rstrip('/')}/ack/{self.links.make(row['id'], now)}"
        return Mail(to=to, subject=subject(ev), text=text, message_id=message_id, thread=thread, ack_url=ack_url,
                    event_json=encode(ev).decode(), report_via=row["receiver"],
                    report_to=reply_to, since=float(row["started_at"]), devices=devices)

    # -- the email link -------------------------------------------------------------------------------

    def ack_link(self, token: str) -> tuple[int, str]:
        """Acknowledge through an email link: (HTTP status, what to show)."""
        if self.links is None:
            return 404, "acknowledge links are off on this bot (bot.email.ack_secret_env is not set)"
        now = self.clock()
        checked = self.links.check(token, now)
        if isinstance(checked, str):
            return 410 if "expired" in checked else 403, checked
        esc_id, nonce = checked
        with self.state.tx():
            row = self.store.escalations.get(esc_id)
            if row is None:
                return 404, f"no escalation {esc_id}"
            if row["state"] != "active":  # a link is bound to its episode: never the next one of the run's rule
                why = f"acknowledged already (by {row['acked_by']})" if row["state"] == "acked" and row["acked_by"] \
                    else "acknowledged already" if row["state"] == "acked" else "over: the alert resolved"
                return 409, (f"this escalation of {row['rule']} of run {row['run_id']} is {why}; if it fires again, "
                             f"that is a new episode with links of its own (or acknowledge in chat: `ack "
                             f"{row['run_id']}/{row['rule']}`)")
            if not self.store.escalations.use_link(nonce, now, "email link"):
                return 409, "this link was used already; the escalation is acknowledged"
            fps = self.store.ack(row["run_id"], row["rule"], None, f"email link (escalation {esc_id})")
        self.state.index.acked(fps)
        self.sync()
        if not fps:
            return 200, f"{row['rule']} of run {row['run_id']} is no longer firing; nothing left to acknowledge"
        if self.on_ack is not None:  # the job hears of it as of a chat ack; the page says done whatever it answers
            try:
                self.on_ack(row["run_id"], row["rule"], f"email link (escalation {esc_id})", now)
            except Exception:  # noqa: BLE001 - the acknowledgement stands; the job keeps its rule's state
                log.exception("msmon bot: run %s: %s was acknowledged by an email link, but telling the job failed; "
                              "ack it in chat to reset the rule's reference in the job", row["run_id"], row["rule"])
        return 200, f"acknowledged {row['rule']} of run {row['run_id']}: the escalation stops"


def _escalation(row: dict[str, Any]) -> Escalation:
    return Escalation(id=row["id"], run_id=row["run_id"], rule=row["rule"], policy=row["policy"],
                      started_at=row["started_at"], next_step=row["next_step"] or 0, state=row["state"],
                      paused_at=row["paused_at"], shift=row["shift"] or 0.0)


def _event(raw: str | None) -> Event | None:
    if not raw:
        return None
    try:
        return decode(raw, Event)
    except (msgspec.DecodeError, ValueError):
        log.warning("msmon bot: an alert's stored event does not decode; its escalation waits for the next one")
        return None
