"""The escalation edge: reads alerts and escalations from SQLite, asks the pure policy what is due,
queues the steps' messages through the durable outbox and writes the new state, in one transaction.

    alerts (firing ERRORs, acks) ─► Escalator.sync ─► policy.decide ─► outbox rows (note, mail) + steps
                                    (apscheduler jobs)                 + escalation row, one commit

Timing is apscheduler's `AsyncIOScheduler`: one job per open escalation at its next step's due time,
rebuilt from the escalations table on start (so a restart neither loses a level nor repeats one: a
step is taken in the transaction that advances `next_step`), plus a short interval job that picks up
new ERRORs, acknowledgements, resolutions and silences.

A pass costs what changed, not what is stored: the instance holding the escalator keeps the open escalations
and the firing alert groups in memory (`Picture`, read whole when it takes the escalator over or after a
failed pass), a heap of when each is next due, and reads only the alerts changed since its previous pass
(`alerts.changed`, set by a trigger on every write of an alert's status, severity, ack or event:
Store.changed_alerts; on PostgreSQL by transaction id, so another replica's late commit is still read).

Ownership (several replicas on one database later): an escalation is acted on only by the instance
holding its lease row (`escalations.owner`, `lease_until`), claimed in the same transaction as the
step; another instance takes over once the lease has run out. One owner per escalation, never two.
"""

from __future__ import annotations

import dataclasses
import hashlib
import heapq
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
from bot.pipeline.silence import Silence
from bot.receivers import Mail, Note, ReplyTo
from bot.receivers.render import cost_line, escape_console, mention_text, num
from bot.shared import BotState
from bot.store.sqlite import OutboxEntry
from msmon.contract.wire import Event, Severity, decode, encode

log = logging.getLogger("msmon.bot")

WATCHDOG_RULES = ("job_gone", "job_stalled")
LEASE = 30.0  # seconds an owner holds an escalation without acting on it
UNREADABLE_RETRY = 60.0  # seconds before an escalation whose alert's event does not decode is looked at again
# the columns of an open escalation the escalator keeps (Picture): what deciding and taking a step read
KEPT = ("id", "run_id", "rule", "policy", "receiver", "channel", "started_at", "next_step", "state", "paused_at",
        "shift", "mail_root")


@dataclasses.dataclass(slots=True)
class Group:
    """The firing alerts of one run's rule, as an escalation sees them."""

    run_id: str
    rule: str
    severity: str
    acked_by: str | None


def _fold(rows: Any) -> dict[tuple[str, str], Group]:
    """Firing alert rows (run_id, rule, severity, acked_by) by (run, rule): the most severe, acked when every
    firing one is."""
    out: dict[tuple[str, str], Group] = {}
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


class Picture:
    """What the escalator holds in memory between passes, so that a pass costs what changed: the open
    escalations (their rows, by id, by (run, rule) and by run), the firing alert groups, when each open
    escalation is next due (a heap; `at` says which entry of an escalation is the live one), the silences in
    force at the last pass, and the change mark from which the next pass reads the alerts changed
    (Store.changed_alerts). One instance runs the escalator at a time (its lease), so its own writes keep the
    escalations exact; the alerts, which ingest and acks change anywhere, are read by change mark."""

    def __init__(self, mark: int) -> None:
        self.mark = mark
        self.open: dict[int, dict[str, Any]] = {}
        self.by_key: dict[tuple[str, str], int] = {}
        self.by_run: dict[str, set[tuple[str, str]]] = {}
        self.groups: dict[tuple[str, str], Group] = {}
        self.at: dict[int, float] = {}
        self.heap: list[tuple[float, int]] = []
        self.silences: dict[int, Silence] = {}

    def add(self, row: dict[str, Any], next_at: float | None) -> None:
        row = {k: row[k] for k in KEPT}  # what a pass reads of it (a tenth less memory per open escalation)
        key = (row["run_id"], row["rule"])
        self.open[row["id"]] = row
        self.by_key[key] = row["id"]
        self.by_run.setdefault(row["run_id"], set()).add(key)
        self.plan(row["id"], next_at)

    def close(self, esc_id: int) -> None:
        row = self.open.pop(esc_id)
        key = (row["run_id"], row["rule"])
        if self.by_key.get(key) == esc_id:
            del self.by_key[key]
        keys = self.by_run.get(row["run_id"], set())
        keys.discard(key)
        if not keys:
            self.by_run.pop(row["run_id"], None)
        self.at.pop(esc_id, None)

    def plan(self, esc_id: int, at: float | None) -> None:
        """Look at `esc_id` again at `at` (None: only when its alerts or the silences change)."""
        if at is None:
            self.at.pop(esc_id, None)
        elif self.at.get(esc_id) != at:
            self.at[esc_id] = at
            heapq.heappush(self.heap, (at, esc_id))

    def due(self, now: float) -> set[tuple[str, str]]:
        """The (run, rule) of the open escalations due by `now` (each taken off the heap)."""
        out: set[tuple[str, str]] = set()
        while self.heap and self.heap[0][0] <= now:
            at, esc_id = heapq.heappop(self.heap)
            if self.at.get(esc_id) == at:  # else an older plan of it, or it closed
                del self.at[esc_id]
                row = self.open[esc_id]
                out.add((row["run_id"], row["rule"]))
        return out

    def regroup(self, key: tuple[str, str], group: Group | None) -> None:
        if group is None:
            self.groups.pop(key, None)
        else:
            self.groups[key] = group

    def silences_moved(self, silences: list[Silence]) -> set[tuple[str, str]]:
        """The (run, rule) of the open escalations a silence added or run out since the last pass may pause or
        resume: those of its run (all of them for a silence of no run), of its rule when it names one."""
        now_in = {s.id: s for s in silences}
        if now_in.keys() == self.silences.keys():
            return set()
        moved = [s for i, s in now_in.items() if i not in self.silences] + \
                [s for i, s in self.silences.items() if i not in now_in]
        self.silences = now_in
        out: set[tuple[str, str]] = set()
        for s in moved:
            keys: Any = self.by_run.get(s.run_id, ()) if s.run_id is not None else self.by_key
            out.update(k for k in keys if s.rule is None or k[1] == s.rule)
        return out


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
                 period: float = 1.0, links: AckLinks | None = None, *,
                 on_ack: Callable[[str, str, str, float], object] | None = None) -> None:
        self.state, self.cfg, self.clock, self.period, self.links = state, state.cfg, clock, period, links
        # The store's owner: one per SQLite file (a restarted bot holds its escalations' leases at once, so
        # a level falls due on time across a SIGKILL), one per process on PostgreSQL (released at stop).
        self.owner = owner or state.store.owner
        self.scheduler: AsyncIOScheduler | None = None
        self.on_ack = on_ack  # (run, rule, who, now) after an email link acked: the job is told as of a chat ack
        # the open escalations and firing alert groups as the last pass left them (None: read them whole at the next
        # pass), and when this instance last renewed the escalator's lease (time.monotonic(); None: not holding it)
        self._picture: Picture | None = None
        self._held: float | None = None
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
        self._picture = self._held = None
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
        steps were taken. A pass looks at what changed since the previous one (alerts changed, steps fallen
        due, silences added or run out), from the picture of the open escalations it keeps (`Picture`):
        read whole when this instance takes the escalator over, then kept by its own writes."""
        now = self.clock()
        renewing = time.monotonic()
        if not self.state.owns("escalator"):
            self._picture = self._held = None  # another replica runs the escalations (a lease row); read again
            return 0  # when this one takes over
        if self._held is None or renewing - self._held >= self.cfg.store.lease:
            self._picture = None  # the lease may have run out since (a stalled loop): another may have acted
        self._held = renewing
        taken = 0
        picture, self._picture = self._picture, None  # kept only when the pass commits
        with self.state.tx():
            if picture is None:
                opened = self.store.escalations.open()
                if not opened and not self._severities():
                    return 0  # nothing open and no route escalates: the firing alerts are not read at all
                picture = self._load(opened)
                look = set(picture.groups) | set(picture.by_key)  # every one once
            else:
                keys, picture.mark = self.store.changed_alerts(picture.mark)
                for key in keys:
                    picture.regroup(key, self._firing(key))
                look = set(keys) | picture.due(now)
            silences = self.store.silences(now)  # a silence can pause or resume an escalation as time passes
            look |= picture.silences_moved(silences)
            look |= self._start_new(picture, look, now)
            for key in sorted(look):
                esc_id = picture.by_key.get(key)
                if esc_id is None:
                    continue
                row = picture.open[esc_id]
                policy = self.cfg.escalations.get(row["policy"])
                if policy is None:
                    continue  # its policy left the config: kept as it is (nothing can take a step of it)
                if not self.store.escalations.claim(esc_id, self.owner, now, LEASE):
                    picture.plan(esc_id, now + self.period)  # another owner's lease: look again next pass
                    continue
                steps, next_at = self._act(row, policy, picture.groups.get(key), silences, now)
                taken += steps
                if row["state"] != "active":
                    picture.close(esc_id)
                else:
                    picture.plan(esc_id, next_at)
        self._picture = picture
        if taken:
            self.state.wake_outbox()
        return taken

    def _load(self, opened: list[dict[str, Any]]) -> Picture:
        """The whole picture, when this instance takes the escalator over: the change mark first (what changes
        while this reads is read again by the next pass), then every open escalation and firing alert."""
        picture = Picture(self.store.change_mark())
        for row in opened:
            picture.add(row, self._next_at(row))
        picture.groups = _fold(self.store.db.execute(
            "SELECT run_id, rule, severity, acked_by FROM alerts WHERE status='firing'"))
        return picture

    def _firing(self, key: tuple[str, str]) -> Group | None:
        """The group of one run's rule as its firing alerts say now (None: none fires)."""
        return _fold(self.store.db.execute("SELECT run_id, rule, severity, acked_by FROM alerts WHERE run_id=? AND"
                                           " status='firing' AND rule=?", key)).get(key)

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

    def _start_new(self, picture: Picture, keys: set[tuple[str, str]], now: float) -> set[tuple[str, str]]:
        """An escalation for each of `keys` whose group fires unacknowledged at a severity its route's policy
        takes and has none open; the keys started. Each run's route read once a pass."""
        severities = self._severities()
        started: set[tuple[str, str]] = set()
        if not severities:
            return started
        routes: dict[str, Any] = {}
        for key in sorted(keys):
            g = picture.groups.get(key)
            if g is None or key in picture.by_key or g.acked_by is not None or g.severity not in severities:
                continue
            if g.run_id not in routes:
                routes[g.run_id] = self._route(g.run_id)[0]
            route = routes[g.run_id]
            policy = self.cfg.escalations.get(route.escalation) if route is not None and route.escalation else None
            if policy is None or g.severity not in policy.severities:
                continue
            esc_id = self.store.escalations.start(g.run_id, g.rule, route.escalation, route.receiver, route.channel,
                                                  now)
            row = self.store.escalations.get(esc_id)
            assert row is not None
            picture.add(row, None)
            started.add(key)
            log.info("msmon bot: escalation %d started for %s of run %s (policy %s)", esc_id, g.rule, g.run_id,
                     route.escalation)
        return started

    def _act(self, row: dict[str, Any], policy: EscalationPolicy, g: Group | None, silences: list[Any],
             now: float) -> tuple[int, float | None]:
        """(steps taken, when to look again: its next step's due time, None for only when its alerts or the
        silences change); `row` is left as the escalation now is (its state, next step, pause, shift)."""
        esc = _escalation(row)
        firing = g is not None and g.severity in policy.severities
        ev = self._lead(esc.run_id, esc.rule) if firing else None
        if firing and ev is None:
            return 0, now + UNREADABLE_RETRY  # its event does not decode (logged): no step taken, none skipped
        silenced = ev is not None and any(s.matches(ev, now) for s in silences)
        d = decide(esc, policy, AlertNow(firing, g.acked_by if g else None, silenced), now)
        new = d.escalation
        if not d.changed and new == esc:
            return 0, d.next_at
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
        acked_by = g.acked_by if g and new.state == "acked" else None
        closed_at = now if new.state != "active" else None
        self.store.escalations.save(esc.id, next_step=new.next_step, state=new.state, paused_at=new.paused_at,
                                    shift=new.shift, acked_by=acked_by, closed_at=closed_at)
        row.update(next_step=new.next_step, state=new.state, paused_at=new.paused_at, shift=new.shift)
        self._plan(esc.id, d.next_at)
        return len(d.steps), d.next_at

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
