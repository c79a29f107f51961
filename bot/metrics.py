"""Prometheus metrics of the bot (served at /metrics), one registry per service instance: counters
updated where things happen, and per-run training gauges and delivery figures read at each scrape
(`RunCollector`). config/grafana-dashboard.json queries them."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Container, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from bot.store.sqlite import Store
    from bot.store.windows import Windows


class BotMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("msmon_requests_total", "HTTP requests by endpoint and status", ["endpoint", "status"],
                                registry=r)
        self.events_in = Counter("msmon_events_in_total", "events received", ["severity"], registry=r)
        self.samples_in = Counter("msmon_samples_in_total", "metric samples received", registry=r)
        self.shed = Counter("msmon_ingest_shed_total", "samples and WARNING events the ingest shed under overload "
                            "(bot.overload), by what", ["what"], registry=r)
        self.overload = Gauge("msmon_ingest_overload_level", "what the ingest sheds now: 0 nothing, 1 samples, "
                              "2 samples and WARNINGs", registry=r)
        self.suppressed = Counter("msmon_suppressed_total", "events suppressed, by pipeline stage", ["stage"],
                                  registry=r)
        self.sent = Counter("msmon_alerts_sent_total", "messages delivered, by receiver and kind", ["receiver", "kind"],
                            registry=r)
        self.delivery_errors = Counter("msmon_delivery_errors_total", "failed delivery attempts", ["receiver"],
                                       registry=r)
        self.outbox_depth = Gauge("msmon_outbox_depth", "undelivered messages", registry=r)
        self.outbox_dead = Gauge("msmon_outbox_dead_letters", "messages given up on (GET /v1/outbox/dead lists them)",
                                 registry=r)
        self.dead_letters = Counter("msmon_dead_letters_total", "messages given up on by this process, by receiver",
                                    ["receiver"], registry=r)
        self.error_latency = Histogram("msmon_error_latency_seconds", "ERROR arrival to receiver call",
                                       buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10), registry=r)
        self._requests: dict[tuple[str, int], Any] = {}  # (endpoint, status) -> its child of `requests`

    def request(self, endpoint: str, status: int) -> None:
        """One HTTP request answered: `requests` counted, its child looked up once per endpoint and status (labels()
        takes a lock and builds its key on every call)."""
        child = self._requests.get((endpoint, status))
        if child is None:
            child = self._requests[(endpoint, status)] = self.requests.labels(endpoint, str(status))
        child.inc()

    def watch(self, state: RunSource) -> None:
        """Export the per-run training gauges and the delivery figures of `state`, read at each scrape."""
        self.registry.register(RunCollector(state))

    async def render(self, runs: Container[str] | None = None) -> bytes:
        """The text of GET /metrics: every series, or (`runs` given: a project token's scrape) the bot's
        own series and the per-run series of those runs only. The families are collected here, on the
        event loop that owns the windows and the SQLite connection; the text, most of a scrape's cost with
        many runs (bench/bench_metrics.py), is written in a worker thread so ingest is not held meanwhile."""
        families = list(self.registry.collect())
        if runs is not None:
            families = [_only(f, runs) for f in families]
        return await asyncio.to_thread(generate_latest, _Collected(families))


def _only(family: Metric, runs: Container[str]) -> Metric:
    """`family` without the samples of runs not in `runs` (a series without a run label stays)."""
    kept = [s for s in family.samples if "run" not in s.labels or s.labels["run"] in runs]
    if len(kept) == len(family.samples):
        return family
    out = Metric(family.name, family.documentation, family.type, family.unit)
    out.samples = kept
    return out


def project_runs(store: Store, project: str) -> set[str]:
    """The run ids of `project`: what a scrape with that project's job token may see."""
    return {r[0] for r in store.db.execute("SELECT run_id FROM runs WHERE project=?", (project,))}


class _Collected:
    """Families already collected, in the shape generate_latest reads (an object with collect())."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


class RunSource(Protocol):
    """What the run collector reads: the bot's metric windows and its SQLite store (bot/shared.py)."""

    @property
    def windows(self) -> Windows: ...

    @property
    def store(self) -> Store: ...


_PENDING = "delivered_at IS NULL AND dead_at IS NULL"
_FINAL = "('done', 'failed', 'expired', 'partial')"  # bot/commands/jobs.py FINAL


class RunCollector(Collector):
    """Per-run series read at scrape time from the runs in the metric windows: a run that leaves the
    windows (past bot.max_runs, the least recently seen first) leaves /metrics with all its series, so
    label cardinality is bounded by max_runs x devices, rules and severities."""

    def __init__(self, state: RunSource) -> None:
        self.state = state

    def collect(self) -> Iterator[Metric]:
        windows, db = self.state.windows, self.state.store.db
        runs = list(windows.runs)
        step = GaugeMetricFamily("msmon_run_step", "latest training step of a run", labels=["run"])
        per_device = {f: GaugeMetricFamily(f"msmon_run_{name}", help_, labels=["run", "device"])
                      for f, name, help_ in _DEVICE_GAUGES}
        for run_id in runs:
            latest = windows.latest(run_id)
            if latest:
                step.add_metric([run_id], max(s.step for s in latest.values()))
            for device, s in latest.items():
                for f, family in per_device.items():
                    v = getattr(s, f)
                    if v is not None:
                        family.add_metric([run_id, device], v)
        yield step
        yield from per_device.values()
        known = set(runs)
        firing = GaugeMetricFamily("msmon_run_alerts_firing", "alerts firing on a run (devices), by rule and severity",
                                   labels=["run", "rule", "severity"])
        for run_id, rule, severity, n in db.execute(
                "SELECT run_id, rule, severity, COUNT(*) FROM alerts WHERE status='firing' GROUP BY 1, 2, 3"):
            if run_id in known:
                firing.add_metric([run_id, rule, severity], n)
        yield firing
        latency = GaugeMetricFamily("msmon_run_command_latency_seconds", "a run's last finished command: seconds "
                                    "from its submission to its final result", labels=["run"])
        for run_id, seconds in db.execute(
                f"SELECT run_id, updated_at - created_at FROM commands WHERE status IN {_FINAL} AND seq IN "
                f"(SELECT MAX(seq) FROM commands WHERE status IN {_FINAL} GROUP BY run_id)"):
            if run_id in known and seconds is not None:
                latency.add_metric([run_id], max(seconds, 0.0))
        yield latency
        yield from _delivery(db)


_DEVICE_GAUGES = (("loss", "loss", "latest loss of a run's device"),
                  ("grad_norm", "grad_norm", "latest gradient norm of a run's device"),
                  ("samples_per_s", "samples_per_second", "latest throughput of a run's device, samples/s"),
                  ("tokens_per_s", "tokens_per_second", "latest throughput of a run's device, tokens/s"))


def _delivery(db: sqlite3.Connection) -> Iterator[Metric]:
    """Undelivered and dead-lettered outbox rows by receiver (retries: msmon_delivery_errors_total)."""
    queued = GaugeMetricFamily("msmon_outbox_queued", "undelivered outbox rows, by receiver", labels=["receiver"])
    dead = GaugeMetricFamily("msmon_outbox_dead", "dead-lettered outbox rows, by receiver", labels=["receiver"])
    for receiver, n_queued, n_dead in db.execute(
            f"SELECT receiver, SUM(CASE WHEN {_PENDING} THEN 1 ELSE 0 END),"  # portable: SQLite and PostgreSQL
            " SUM(CASE WHEN dead_at IS NOT NULL THEN 1 ELSE 0 END) FROM outbox GROUP BY receiver"):
        queued.add_metric([receiver], n_queued or 0)
        dead.add_metric([receiver], n_dead or 0)
    yield queued
    yield dead
