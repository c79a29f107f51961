"""Prometheus metrics of the bot (served at /metrics), one registry per service instance."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class BotMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("msmon_requests_total", "HTTP requests by endpoint and status", ["endpoint", "status"],
                                registry=r)
        self.events_in = Counter("msmon_events_in_total", "events received", ["severity"], registry=r)
        self.samples_in = Counter("msmon_samples_in_total", "metric samples received", registry=r)
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
