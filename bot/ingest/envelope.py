"""The ingest edge: what a job posts is recorded, and each of its events runs through the pipeline.

    envelope ─► run, metric windows, plans, job action results ─► each event through STAGES
             ─► alert rows + outbox rows ─► commit ─► 2xx

Everything for one envelope happens in one SQLite transaction of the shared `BotState`, so an event
is either fully accepted (recorded and queued for delivery) or not at all; the job's 2xx comes after
the commit. The decisions are the pure stages' (bot/pipeline); this module reads what they need,
writes what they decided and counts what they dropped.
"""

from __future__ import annotations

import contextlib
from typing import Any

from bot.commands import jobs
from bot.delivery.payload import Payloads
from bot.ingest.commit import Commits
from bot.ingest.overload import Level, Overload, table
from bot.ingest.runs import Runs
from bot.metrics import BotMetrics
from bot.pipeline import STAGES, dedup
from bot.pipeline.alert import fingerprint
from bot.pipeline.flow import Context, Notification, run_stages
from bot.pipeline.route import route_for
from bot.receivers import Note, ReplyTo
from bot.runs.devices import DeviceGate
from bot.shared import BotState
from bot.store.alertindex import Entry
from bot.store.sqlite import AlertRow, OutboxEntry
from msmon.contract.wire import Envelope, Event, Heartbeat, Severity, Status, encode


class _Written:
    """What one batch of events writes (one statement each) and counts (once, after the loop)."""

    __slots__ = ("alerts", "outbox", "events_in", "suppressed")

    def __init__(self) -> None:
        self.alerts: list[AlertRow] = []
        self.outbox: list[OutboxEntry] = []
        self.events_in: dict[Severity, int] = {}
        self.suppressed: dict[str, int] = {}  # stage name -> notifications it dropped

    def counted(self, metrics: BotMetrics) -> None:
        for sev, k in self.events_in.items():
            metrics.events_in.labels(sev.value).inc(k)
        for stage, k in self.suppressed.items():
            metrics.suppressed.labels(stage).inc(k)


class Ingest:
    """The job-facing side of the bot's state: envelopes and heartbeats in (bot/app.py), and the
    watchdog's events (bot/ingest/watchdog.py) through the same stages."""

    def __init__(self, state: BotState) -> None:
        self.state = state
        self.devices = DeviceGate(state.cfg.max_devices, state.cfg.max_runs, self._stored_devices)
        self.runs = Runs(state, self.event)  # a run's attempts and its end (bot/ingest/runs.py)
        oc = state.cfg.overload  # what is shed while the bot falls behind (overload.py; fed by watch_lag)
        self.overload = Overload(table(oc.samples_wait, oc.warnings_wait, oc.samples_lag, oc.warnings_lag)
                                 if oc.enable else (), oc.cool, state.clock)
        self.commits = Commits(state.store, state.clock)  # the group commit of envelopes without events (commit.py)

    def envelope(self, env: Envelope, defer: bool = False) -> dict[str, Any]:
        """Record one envelope (decoded once, at the edge) and queue what passes the stages; the job's answer.
        `defer`: an envelope without events or actions leaves its run's update held in the store for the group
        commit (`self.commits`), which the caller awaits before answering; one with them commits at once."""
        state = self.state
        now = state.clock()
        self.devices.admit(env.run_id, env.device)  # TooManyDevices: refused before anything is kept
        self.runs.before(env.run_id, env.rank, env.device, env.host, env.proc, now)
        events, shed = self._shed(env)
        note = state.drops.due(env.run_id, env.dropped, now)  # the job's drops said in chat (bot/runs/dropped.py)
        # else the run's liveness only: its one write, no transaction (drop counts: counted once it is committed)
        decides = bool(events or env.actions or env.dropped or note)
        with state.tx() if decides else contextlib.nullcontext():
            if decides:
                state.store.lock_run(env.run_id)  # replicas on one database: one decides on this run's alerts at a time
            self._record(env, now, keep_samples=not shed["samples"], defer=defer and not decides)
            queued = jobs.record_results(state, env.actions)
            if note:
                queued += self._drops_note(env, now)
            if events:
                queued += self._events(events, self._context(env.run_id, env.project, env.labels, now),
                                       Payloads(env.project, env.labels, env.rank,
                                                self.state.ranks.known(env.run_id)))
        state.drops.add(env.run_id, env.device, env.dropped, now, note)
        state.metrics.samples_in.inc(len(env.samples))
        if queued:
            state.wake_outbox()
        # Commands reach a job one way only, its long poll (bot/commands/jobs.py). (The answer's old `commands`, always
        # empty, is gone: a notifier that still reads it takes its default, an empty list.)
        answer = {"accepted": {"events": len(env.events), "samples": len(env.samples), "actions": len(env.actions)},
                  "queued": queued}
        if shed["samples"] or shed["warnings"]:
            answer["shed"] = shed  # the bot is overloaded: what of this envelope it did not take (ERRORs never)
        return answer

    def _drops_note(self, env: Envelope, now: float) -> int:
        """Queue the chat note of what the run's job dropped (bot/runs/dropped.py) on the run's route for ERRORs,
        in the thread of its first message there; 1."""
        state = self.state
        route = route_for(env.project, env.labels, Severity.ERROR, state.cfg.routes)
        root = state.store.message(f"{env.run_id}|root|{route.receiver}|{route.channel}")
        text = state.drops.note_text(env.run_id, env.device, env.rank, env.dropped)
        note = Note(text=text, reply_to=ReplyTo(channel=route.channel, thread=root["ts"] if root else ""))
        state.store.enqueue_many([OutboxEntry(now, route.receiver, route.channel, "note", f"drops|{env.run_id}|{now!r}",
                                              env.run_id, encode(note).decode(), now)])
        return 1

    def _shed(self, env: Envelope) -> tuple[list[Event], dict[str, int]]:
        """The events kept at the overload's level, and what is shed (counted): its samples from SAMPLES on (their
        steps still say the run progresses), its WARNING firings from WARNINGS on. Never an ERROR, never a resolution
        (a WARNING's resolution shed would leave its alert firing for ever)."""
        level = self.overload.level
        if level == Level.NORMAL:
            return env.events, {"samples": 0, "warnings": 0}
        events = env.events if level < Level.WARNINGS else [e for e in env.events if e.severity is Severity.ERROR
                                                            or e.status is Status.RESOLVED]
        shed = {"samples": len(env.samples), "warnings": len(env.events) - len(events)}
        for what, n in shed.items():
            if n:
                self.overload.count(what, n)
                self.state.metrics.shed.labels(what).inc(n)
        return events, shed

    def heartbeat(self, hb: Heartbeat, project: str = "default") -> None:
        """A heartbeat on its own: the run's plan and liveness (a run it creates belongs to `project`)."""
        store = self.state.store
        self.devices.admit(hb.run_id, hb.device)
        self.runs.before(hb.run_id, hb.rank, hb.device, hb.host, hb.proc, self.state.clock())
        if self.runs.stale(hb.run_id, hb.proc):
            return  # late, from a process of an earlier attempt: the run's liveness is the new attempt's
        self.state.windows.add_plan(hb)
        if self.state.cfg.ranks.enable:
            self.state.ranks.heartbeat(hb, self.state.clock())
        known = store.run(hb.run_id)
        store.touch_run(hb.run_id, known["project"] if known else project, known["labels"] if known else {},
                        hb.device, hb.step, self.state.clock(), heartbeat=True, paused=hb.paused)

    def _stored_devices(self, run_id: str) -> list[str]:
        run = self.state.store.run(run_id)
        return list(run["devices"]) if run is not None else []

    def event(self, ev: Event, project: str, labels: dict[str, str], now: float, rank: int | None = None) -> int:
        """One event (the watchdog's, the cross-rank rules') through the same path, in a transaction of its
        own; 1 if it was queued. `rank`: the rank it is about (bot/ranks), for the message's count of ranks."""
        with self.state.tx():
            self.state.store.lock_run(ev.run_id)
            return self._events([ev], self._context(ev.run_id, project, labels, now),
                                Payloads(project, labels, rank=rank, ranks=self.state.ranks.known(ev.run_id)))

    def _record(self, env: Envelope, now: float, keep_samples: bool = True, defer: bool = False) -> None:
        """The envelope's run (its devices, last step, heartbeat), samples (unless shed), plans and job actions. One
        sent late by a process of an earlier attempt is not the run's liveness, steps or series (its events still
        count)."""
        if self.runs.stale(env.run_id, env.proc):
            for a in env.actions:
                self.state.windows.add_action(a)
            return
        steps = [s.step for s in env.samples] + [e.step for e in env.events]
        steps += [h.step for h in env.heartbeats if h.step is not None]
        steps += [a.step for a in env.actions]  # a pause's answer names the step the ranks wait at
        self.state.store.touch_run(env.run_id, env.project, env.labels, env.device, max(steps) if steps else None,
                                   now, heartbeat=bool(env.heartbeats),
                                   paused=env.heartbeats[-1].paused if env.heartbeats else None, defer=defer)
        if self.state.cfg.ranks.enable:
            self.state.ranks.envelope(env, now)  # the view across the run's ranks (bot/ranks)
        windows = self.state.windows
        for s in env.samples if keep_samples else ():
            windows.add(s)
        for a in env.actions:
            windows.add_action(a)
        for hb in env.heartbeats:
            windows.add_plan(hb)

    def _context(self, run_id: str, project: str, labels: dict[str, str], now: float) -> Context:
        cfg, store = self.state.cfg, self.state.store
        return Context(now, cfg.pipeline, cfg.routes, project, labels, store.silences(now), store.error_firing(run_id))

    def _events(self, evs: list[Event], ctx: Context, payloads: Payloads) -> int:
        """A run's events through STAGES, in order (an event sees what the ones before it changed);
        the alert rows and outbox rows written with one statement each. How many were queued."""
        fps = [fingerprint(ev.run_id, ev.rule, ev.device) for ev in evs]
        known = self.state.index.get(fps)
        out = _Written()
        for ev, fp in zip(evs, fps, strict=True):
            out.events_in[ev.severity] = out.events_in.get(ev.severity, 0) + 1
            entry = known.get(fp)
            n = Notification(ev, fp) if entry is None else Notification(ev, fp, entry.notify, entry.acked)
            n, dropped_by = run_stages(STAGES, ctx, n)
            if dropped_by is None:
                known[fp] = self._queue(n, ctx.now, payloads, out)
            else:
                out.suppressed[dropped_by.name] = out.suppressed.get(dropped_by.name, 0) + 1
                known[fp] = self._dropped(n, entry, ctx.now, out)
        if out.alerts:
            self.state.store.save_alerts(out.alerts)
        if out.outbox:
            self.state.store.enqueue_many(out.outbox)
        out.counted(self.state.metrics)
        return len(out.outbox)

    def _queue(self, n: Notification, now: float, payloads: Payloads, out: _Written) -> Entry:
        """A notification that passed every stage: its alert row (with the event, and what is now sent)
        and its outbox row, the event encoded once for both; the alert's new entry."""
        ev = n.event
        event_json = encode(ev)
        sev, status = ev.severity.value, ev.status.value
        sent = dedup.record(ev, n.sent, now)
        out.alerts.append(AlertRow(n.fingerprint, ev.run_id, ev.rule, ev.device, sev, status, ev.step, now,
                                   event_json.decode(), sent))
        out.outbox.append(OutboxEntry(now, n.receiver, n.channel, n.kind, n.key, ev.run_id,
                                      payloads.payload(event_json, now, n.thread), n.due_at))
        return self.state.index.stage(n.fingerprint, sent, sev, status)

    def _dropped(self, n: Notification, entry: Entry | None, now: float, out: _Written) -> Entry:
        """A dropped notification still says what the job reports now: its alert row is written when
        severity or status changed; otherwise only its last step moves, held in memory (AlertIndex.touch).
        The alert's entry after it."""
        ev = n.event
        if entry is not None and entry.severity == ev.severity and entry.status == ev.status:  # str enums
            self.state.index.touch(n.fingerprint, ev.step, now)
            return entry
        sev, status = ev.severity.value, ev.status.value
        out.alerts.append(AlertRow(n.fingerprint, ev.run_id, ev.rule, ev.device, sev, status, ev.step, now))
        return self.state.index.stage(n.fingerprint, None, sev, status)
