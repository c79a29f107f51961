"""The ingest side of the event path: state, dedup, inhibit, silence, route, then the durable outbox.

Everything for one envelope happens in one SQLite transaction, so an event is either fully
accepted (recorded and queued for delivery) or not at all; the job's 2xx comes after the commit.
"""

from __future__ import annotations

from typing import Any

import msgspec

from msmon.contract.wire import Envelope, Event, Heartbeat, Status, encode

from .commands import jobs
from .pipeline import dedup, group, inhibit, route, silence
from .pipeline.alert import fingerprint
from .state import BotState

_NEVER = dedup.NotifyState()


class _RawEvents(msgspec.Struct):
    """The events of an envelope as the job encoded them (kept as is: no re-encoding in the bot)."""

    events: list[msgspec.Raw] = msgspec.field(default_factory=list)


class _Batch:
    """What the events of one envelope share, looked up or encoded once."""

    __slots__ = ("silences", "error_firing", "head", "body", "_raws")

    def __init__(self, silences: list[silence.Silence], error_firing: bool, project: str,
                 labels: dict[str, str], body: bytes | None = None) -> None:
        self.silences, self.error_firing = silences, error_firing
        self.head = b'{"project":%s,"labels":%s' % (encode(project), encode(labels))
        self.body = body
        self._raws: list[msgspec.Raw] | None = None

    def raw(self, i: int, ev: Event) -> bytes:
        """Event `i`'s JSON: as received when the envelope's body is at hand (decoded on first need:
        most events of a storm are suppressed and never need it), else encoded."""
        if self.body is None:
            return encode(ev)
        if self._raws is None:
            self._raws = msgspec.json.decode(self.body, type=_RawEvents).events
        return bytes(self._raws[i])


class Dispatcher:
    def __init__(self, state: BotState) -> None:
        self.state = state
        self.cfg, self.store, self.metrics, self.clock = state.cfg, state.store, state.metrics, state.clock
        self.windows, self.index = state.windows, state.index

    def ingest(self, env: Envelope, body: bytes | None = None) -> dict[str, Any]:
        """Record one envelope and queue what passes the stages. `body`: the envelope as received, whose
        events' JSON is stored as is (saves re-encoding them)."""
        now = self.clock()
        queued = 0
        steps = [s.step for s in env.samples] + [e.step for e in env.events]
        steps += [h.step for h in env.heartbeats if h.step is not None]
        with self.state.tx():
            self.store.touch_run(env.run_id, env.project, env.labels, env.device, max(steps) if steps else None, now,
                                 heartbeat=bool(env.heartbeats),
                                 paused=env.heartbeats[-1].paused if env.heartbeats else None)
            for s in env.samples:
                self.windows.add(s)
            for a in env.actions:
                self.windows.add_action(a)
            for hb in env.heartbeats:
                self.windows.add_plan(hb)
            queued += jobs.record_results(self.state, env.actions)
            if env.events:
                ctx = _Batch(self.store.silences(now), self.store.error_firing(env.run_id), env.project, env.labels,
                             body)
                queued += self.events(env.events, env.project, env.labels, now, ctx)
        self.metrics.samples_in.inc(len(env.samples))
        if queued:
            self.state.wake_outbox()
        commands = jobs.pending_for(self.state, env.run_id, env.device)
        return {"accepted": {"events": len(env.events), "samples": len(env.samples), "actions": len(env.actions)},
                "queued": queued, "commands": [msgspec.to_builtins(c) for c in commands]}

    def heartbeat(self, hb: Heartbeat, project: str = "default") -> None:
        now = self.clock()
        self.windows.add_plan(hb)
        run = self.store.run(hb.run_id)
        self.store.touch_run(hb.run_id, run["project"] if run else project, run["labels"] if run else {},
                             hb.device, hb.step, now, heartbeat=True, paused=hb.paused)

    def event(self, ev: Event, project: str, labels: dict[str, str], now: float) -> int:
        """One event (the watchdog's) through the same path; 1 if it was queued for delivery."""
        batch = _Batch(self.store.silences(now), self.store.error_firing(ev.run_id), project, labels)
        return self.events([ev], project, labels, now, batch)

    def events(self, evs: list[Event], project: str, labels: dict[str, str], now: float, batch: _Batch) -> int:
        """Run a batch of events through dedup, inhibit, silence and route, then write the alert state
        and the outbox rows with one statement each; returns how many were queued for delivery."""
        m, p = self.metrics, self.cfg.pipeline
        fps = [fingerprint(ev.run_id, ev.rule, ev.device) for ev in evs]
        index = self.index
        entries = index.get(fps)
        alerts: list[tuple[Any, ...]] = []
        outbox: list[tuple[Any, ...]] = []
        counts: dict[str, int] = {}
        suppressed: dict[str, int] = {}
        for i, (ev, fp) in enumerate(zip(evs, fps, strict=True)):
            sev = ev.severity.value
            counts[sev] = counts.get(sev, 0) + 1
            resolved = ev.status is Status.RESOLVED
            status = "resolved" if resolved else "firing"
            entry = entries.get(fp)
            state = entry.notify if entry is not None else _NEVER
            stage = None
            if not dedup.decide(ev, state, now, p.repeat_interval):
                stage = "dedup"
            elif entry is not None and entry.acked and not resolved and state.severity is ev.severity:
                stage = "acked"  # someone is on it: no reminders (a rise in severity still goes out)
            else:
                if sev == "ERROR" and not resolved:
                    batch.error_firing = True
                if inhibit.inhibited(ev, batch.error_firing, p.inhibit_warnings):
                    stage = "inhibit"
                elif silence.silenced_by(ev, batch.silences, now) is not None:
                    stage = "silence"
            if stage is not None:
                suppressed[stage] = suppressed.get(stage, 0) + 1
                if entry is not None and entry.severity == sev and entry.status == status:
                    index.touch(fp, ev.step, now)  # only the last step moved: written by flush()
                    continue
                alerts.append((fp, ev.run_id, ev.rule, ev.device, sev, status, ev.step, now, None, False, None, None,
                               0))
                index.stage(fp, None, sev, status)
                entries[fp] = index.staged[fp]
                continue
            new = dedup.record(ev, state, now)
            index.stage(fp, new, sev, status)
            entries[fp] = index.staged[fp]
            raw = batch.raw(i, ev)
            alerts.append((fp, ev.run_id, ev.rule, ev.device, sev, status, ev.step, now, raw.decode(), True,
                           None if new.severity is None else new.severity.value, new.sent_at, int(new.resolved)))
            repeat = not resolved and state.severity is ev.severity and not state.resolved
            r = route.route_for(project, labels, ev.severity, self.cfg.routes)
            kind = "resolve" if resolved else "repeat" if repeat else "alert"
            thread = sev == "WARNING" and r.warnings == "thread"  # under the run's first message
            payload = batch.head + b',"received_at":%r,"thread":%s,"event":%s}' % (
                now, b"true" if thread else b"false", raw)
            outbox.append((now, r.receiver, r.channel, kind, group.group_key(ev), ev.run_id, payload.decode(),
                           now + group.delay(ev, p.group_wait)))
        if alerts:
            self.store.save_alerts(alerts)
        if outbox:
            self.store.enqueue_many(outbox)
        for sev, n in counts.items():
            m.events_in.labels(sev).inc(n)
        for stage, n in suppressed.items():
            m.suppressed.labels(stage).inc(n)
        return len(outbox)
