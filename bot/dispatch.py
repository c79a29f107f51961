"""The ingest side of the event path: state, dedup, inhibit, silence, route, then the durable outbox.

Everything for one envelope happens in one SQLite transaction, so an event is either fully
accepted (recorded and queued for delivery) or not at all; the job's 2xx comes after the commit.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from notifier.wire import Envelope, Event, Heartbeat, Status, encode

from .config import BotConfig
from .metrics import BotMetrics
from .pipeline import dedup, group, inhibit, route, silence
from .pipeline.alert import fingerprint
from .store import Store
from .windows import Windows

_NEVER = dedup.NotifyState()


class _Batch:
    """What the events of one envelope share, looked up or encoded once."""

    __slots__ = ("silences", "error_firing", "head")

    def __init__(self, silences: list[silence.Silence], error_firing: bool, project: str,
                 labels: dict[str, str]) -> None:
        self.silences, self.error_firing = silences, error_firing
        self.head = b'{"project":%s,"labels":%s' % (encode(project), encode(labels))


class Dispatcher:
    def __init__(self, cfg: BotConfig, store: Store, metrics: BotMetrics,
                 clock: Callable[[], float] = time.time) -> None:
        self.cfg, self.store, self.metrics, self.clock = cfg, store, metrics, clock
        self.windows = Windows(cfg.window_samples, cfg.max_runs)
        self.wake: Callable[[], None] = lambda: None  # the outbox worker's doorbell (set by the app)

    def ingest(self, env: Envelope, raws: list[bytes] | None = None) -> dict[str, Any]:
        """Record one envelope and queue what passes the stages. `raws`: the events' JSON as received
        (saves re-encoding them); encoded here when not given."""
        now = self.clock()
        queued = 0
        steps = [s.step for s in env.samples] + [e.step for e in env.events]
        steps += [h.step for h in env.heartbeats if h.step is not None]
        with self.store.tx():
            self.store.touch_run(env.run_id, env.project, env.labels, env.device, max(steps) if steps else None, now,
                                 heartbeat=bool(env.heartbeats),
                                 paused=env.heartbeats[-1].paused if env.heartbeats else None)
            for s in env.samples:
                self.windows.add(s)
            for a in env.actions:
                self.windows.add_action(a)
            if env.events:
                ctx = _Batch(self.store.silences(now), self.store.error_firing(env.run_id), env.project, env.labels)
                queued = self.events(env.events, env.project, env.labels, now, ctx, raws)
        self.metrics.samples_in.inc(len(env.samples))
        if queued:
            self.wake()
        return {"accepted": {"events": len(env.events), "samples": len(env.samples), "actions": len(env.actions)},
                "queued": queued, "commands": []}

    def heartbeat(self, hb: Heartbeat, project: str = "default") -> None:
        now = self.clock()
        run = self.store.run(hb.run_id)
        self.store.touch_run(hb.run_id, run["project"] if run else project, run["labels"] if run else {},
                             hb.device, hb.step, now, heartbeat=True, paused=hb.paused)

    def event(self, ev: Event, project: str, labels: dict[str, str], now: float) -> int:
        """One event (the watchdog's) through the same path; 1 if it was queued for delivery."""
        batch = _Batch(self.store.silences(now), self.store.error_firing(ev.run_id), project, labels)
        return self.events([ev], project, labels, now, batch)

    def events(self, evs: list[Event], project: str, labels: dict[str, str], now: float, batch: _Batch,
               raws: list[bytes] | None = None) -> int:
        """Run a batch of events through dedup, inhibit, silence and route, then write the alert state
        and the outbox rows with one statement each; returns how many were queued for delivery."""
        m, p = self.metrics, self.cfg.pipeline
        fps = [fingerprint(ev.run_id, ev.rule, ev.device) for ev in evs]
        states = self.store.notify_states(fps)
        alerts: list[tuple[Any, ...]] = []
        outbox: list[tuple[Any, ...]] = []
        counts: dict[str, int] = {}
        suppressed: dict[str, int] = {}
        for i, (ev, fp) in enumerate(zip(evs, fps, strict=True)):
            sev = ev.severity.value
            counts[sev] = counts.get(sev, 0) + 1
            resolved = ev.status is Status.RESOLVED
            status = "resolved" if resolved else "firing"
            state = states.get(fp, _NEVER)
            stage = None
            if not dedup.decide(ev, state, now, p.repeat_interval):
                stage = "dedup"
            else:
                if sev == "ERROR" and not resolved:
                    batch.error_firing = True
                if inhibit.inhibited(ev, batch.error_firing, p.inhibit_warnings):
                    stage = "inhibit"
                elif silence.silenced_by(ev, batch.silences, now) is not None:
                    stage = "silence"
            if stage is not None:
                suppressed[stage] = suppressed.get(stage, 0) + 1
                alerts.append((fp, ev.run_id, ev.rule, ev.device, sev, status, ev.step, now, None, False, None, None,
                               0))
                continue
            new = dedup.record(ev, state, now)
            states[fp] = new
            raw = raws[i] if raws is not None else encode(ev)
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
        self.store.save_alerts(alerts)
        if outbox:
            self.store.enqueue_many(outbox)
        for sev, n in counts.items():
            m.events_in.labels(sev).inc(n)
        for stage, n in suppressed.items():
            m.suppressed.labels(stage).inc(n)
        return len(outbox)
