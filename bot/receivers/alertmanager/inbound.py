"""`POST /v1/alertmanager`: cluster alerts from Alertmanager (node down, NPU/GPU errors, disk full)
in the chat thread and the `status` of the runs on those hosts.

Alertmanager's webhook_config sends its version 4 body; it authenticates with the bearer token of
`bot.alertmanager.inbound.token_env` (http_config.authorization) or with basic auth
(http_config.basic_auth), compared in constant time. Each alert is matched to runs by its host
labels (`host_labels`, a port dropped) against the hosts a run's labels list (`run_host_labels`,
comma-separated), or by its job labels (`job_labels`) against the run id and `run_job_labels`.
A match becomes an alert row of the run (rule `cluster:<alertname>`, device the host, so `status`
and GET /v1/runs/{id} list it while it fires) and, when it changes (new, resolved), a note in the
thread of the run's first message on its route's receiver. The matching is pure (`matching_runs`).
"""

from __future__ import annotations

import base64
import hmac
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Annotated, Any

import msgspec
from aiohttp import web

from bot.config import AlertmanagerInbound, BotConfig
from bot.pipeline.route import route_for
from bot.receivers import Note, ReplyTo
from bot.shared import BotState
from bot.store.sqlite import AlertRow, OutboxEntry
from msmon.contract.wire import MAX_ID, MAX_TEXT, Severity

log = logging.getLogger("msmon.bot")

ROUTE = "/v1/alertmanager"
_ERROR_SEVERITIES = {"critical", "error", "page", "fatal", "emergency"}


_Str = Annotated[str, msgspec.Meta(max_length=MAX_TEXT)]
_Map = Annotated[dict[Annotated[str, msgspec.Meta(max_length=MAX_ID)], _Str], msgspec.Meta(max_length=256)]
MAX_ALERTS = 10_000  # alerts in one webhook (Alertmanager sends what a group holds; max_alerts caps it there)
MAX_MATCHES = 10_000  # (alert, run) matches one webhook records: the work of one webhook is bounded


class AmAlert(msgspec.Struct):
    status: Annotated[str, msgspec.Meta(max_length=MAX_ID)]
    labels: _Map = {}
    annotations: _Map = {}
    startsAt: _Str = ""  # noqa: N815 - Alertmanager's field names
    endsAt: _Str = ""  # noqa: N815
    fingerprint: _Str = ""


class AmWebhook(msgspec.Struct):
    """Alertmanager's webhook body (version 4); fields msmon does not read are ignored. Bounded: at most
    MAX_ALERTS alerts, 256 labels or annotations each, the wire's lengths for names and texts."""

    alerts: Annotated[list[AmAlert], msgspec.Meta(max_length=MAX_ALERTS)]
    version: _Str = "4"
    status: _Str = "firing"
    receiver: _Str = ""


def authorized(cfg: AlertmanagerInbound, header: str, env: Mapping[str, str] = os.environ) -> bool:
    """The Authorization header carries the configured bearer token or basic auth (constant time)."""
    if cfg.basic_user is not None:
        password = env.get(cfg.basic_password_env, "")
        want = "Basic " + base64.b64encode(f"{cfg.basic_user}:{password}".encode()).decode()
        return bool(password) and hmac.compare_digest(header.encode(errors="replace"), want.encode())
    token = env.get(cfg.token_env, "")
    return bool(token) and hmac.compare_digest(header.encode(errors="replace"), f"Bearer {token}".encode())


def _host(value: str) -> str:
    """`node3:9100` -> `node3` (an IPv6 address in brackets keeps its colons)."""
    if value.startswith("["):
        return value[1:value.find("]")] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def run_hosts(labels: Mapping[str, str], cfg: AlertmanagerInbound) -> set[str]:
    return {h.strip() for k in cfg.run_host_labels for h in labels.get(k, "").split(",") if h.strip()}


class RunIndex:
    """The runs by host and by job, built once per webhook: each alert looks up the runs it concerns
    instead of reading every run (3,000 alerts x 200 runs held the loop for a minute)."""

    def __init__(self, runs: Iterable[Mapping[str, Any]], cfg: AlertmanagerInbound) -> None:
        self.cfg = cfg
        self.ids: list[str] = []
        self.hosts: list[set[str]] = []
        self.jobs: list[set[str]] = []
        self.by_host: dict[str, list[int]] = {}
        self.by_job: dict[str, list[int]] = {}
        for i, r in enumerate(runs):
            labels = r.get("labels") or {}
            self.ids.append(r["run_id"])
            self.hosts.append(run_hosts(labels, cfg))
            self.jobs.append({r["run_id"]} | {labels[k] for k in cfg.run_job_labels if labels.get(k)})
            for h in self.hosts[-1]:
                self.by_host.setdefault(h, []).append(i)
            for j in self.jobs[-1]:
                self.by_job.setdefault(j, []).append(i)

    def matching(self, alert: AmAlert) -> list[tuple[str, str]]:
        """(run id, the host or job it matched) of each run the alert concerns, in the runs' order."""
        hosts = {_host(alert.labels[k]) for k in self.cfg.host_labels if alert.labels.get(k)}
        jobs = {alert.labels[k] for k in self.cfg.job_labels if alert.labels.get(k)}
        found = {i for h in hosts for i in self.by_host.get(h, ())} | {i for j in jobs for i in self.by_job.get(j, ())}
        out = []
        for i in sorted(found):
            by_host, by_job = hosts & self.hosts[i], jobs & self.jobs[i]
            out.append((self.ids[i], sorted(by_host or by_job)[0]))
        return out


def matching_runs(alert: AmAlert, runs: Iterable[Mapping[str, Any]], cfg: AlertmanagerInbound
                  ) -> list[tuple[str, str]]:
    """(run id, the host or job it matched) of each run the alert concerns."""
    return RunIndex(runs, cfg).matching(alert)


def _severity(alert: AmAlert) -> Severity:
    return Severity.ERROR if alert.labels.get("severity", "").lower() in _ERROR_SEVERITIES else Severity.WARNING


def _text(alert: AmAlert, run_id: str, where: str) -> str:
    name = alert.labels.get("alertname", "alert")
    said = alert.annotations.get("summary") or alert.annotations.get("description") or alert.annotations.get(
        "message", "")
    state = "RESOLVED" if alert.status == "resolved" else "FIRING"
    head = f"Cluster alert {state}: {name} on {where} (run {run_id}, from Alertmanager)"
    tail = "" if alert.status == "resolved" else ". msmon's own alerts for this run may be caused by it."
    return head + (f": {said}" if said else "") + tail


class AlertmanagerInboundHandler:
    """The route's handler over the shared state; `clock` is the bot's."""

    def __init__(self, cfg: BotConfig, state: BotState, clock: Callable[[], float]) -> None:
        self.cfg, self.state, self.clock = cfg, state, clock

    async def handle(self, request: web.Request) -> web.Response:
        if not authorized(self.cfg.alertmanager.inbound, request.headers.get("Authorization", "")):
            return web.json_response({"error": "missing or wrong credentials: set webhook_config http_config "
                                      "authorization (bearer) or basic_auth as bot.alertmanager.inbound says"},
                                     status=401)
        if request.content_type != "application/json":
            raise web.HTTPUnsupportedMediaType(reason=f"expected application/json, got {request.content_type}")
        try:
            body = msgspec.json.decode(await request.read(), type=AmWebhook)
        except msgspec.ValidationError as exc:
            raise web.HTTPUnprocessableEntity(reason=f"not an Alertmanager webhook body: {exc}") from None
        except msgspec.DecodeError as exc:
            raise web.HTTPBadRequest(reason=f"body is not valid JSON: {exc}") from None
        matched = self.record(body.alerts)
        return web.json_response({"alerts": len(body.alerts), "matched": matched})

    def record(self, alerts: list[AmAlert]) -> int:
        """Alert rows and thread notes for every (alert, run) match; how many matches there were."""
        store, now = self.state.store, self.clock()
        runs = [r for r in store.runs() if not r.get("gone")]
        steps = {r["run_id"]: r.get("last_step") or 0 for r in runs}  # a cluster alert starts at the run's step
        index = RunIndex(runs, self.cfg.alertmanager.inbound)
        states: dict[str, dict[str, str]] = {}  # run -> its alerts' status by fingerprint, read once a webhook
        rows: list[AlertRow] = []
        notes: list[OutboxEntry] = []
        threads: dict[tuple[str, Severity], tuple[str, str, str]] = {}  # (run, severity) -> where its notes go
        unrecorded = 0
        for alert in alerts:
            for run_id, where in index.matching(alert):
                if len(rows) >= MAX_MATCHES:
                    unrecorded += 1
                    continue
                rule = "cluster:" + alert.labels.get("alertname", "alert")
                fp = f"{run_id}|{rule}|{where}"
                status = "resolved" if alert.status == "resolved" else "firing"
                known = states.get(run_id)
                if known is None:
                    known = states[run_id] = {a["fingerprint"]: a["status"] for a in store.alerts(run_id)}
                sev = _severity(alert)
                rows.append(AlertRow(fp, run_id, rule, where, sev.value, status, steps[run_id], now))
                if known.get(fp) != status and (status == "firing" or fp in known):
                    notes.append(self._note(run_id, sev, _text(alert, run_id, where), fp, now, threads))
        with self.state.tx():
            if rows:
                store.save_alerts(rows)
            if notes:
                store.enqueue_many(notes)
        if notes:
            self.state.wake_outbox()
        log.info("msmon bot: Alertmanager sent %d alert(s); %d matched a run, %d note(s) queued", len(alerts),
                 len(rows), len(notes))
        if unrecorded:
            log.warning("msmon bot: an Alertmanager webhook matched more than %d (alert, run) pairs; %d more were not "
                        "recorded. Group fewer alerts per notification (route group_by, max_alerts) or label runs "
                        "with fewer shared hosts", MAX_MATCHES, unrecorded)
        return len(rows)

    def _note(self, run_id: str, severity: Severity, text: str, fp: str, now: float,
              threads: dict[tuple[str, Severity], tuple[str, str, str]]) -> OutboxEntry:
        """A note in the thread of the run's first message on its route (the channel itself when none);
        `threads` keeps each (run, severity)'s route and thread for the rest of the webhook."""
        where = threads.get((run_id, severity))
        if where is None:
            run = self.state.store.run(run_id)
            route = route_for(run["project"] if run else "default", run["labels"] if run else {}, severity,
                              self.cfg.routes)
            root = self.state.store.message(f"{run_id}|root|{route.receiver}|{route.channel}")
            where = threads[(run_id, severity)] = (route.receiver, route.channel, root["ts"] if root else "")
        receiver, channel, thread = where
        note = Note(text=text, reply_to=ReplyTo(channel=channel, thread=thread))
        return OutboxEntry(now, receiver, channel, "note", f"cluster|{fp}|{now!r}", run_id,
                           msgspec.json.encode(note).decode(), now)


def add_alertmanager_route(app: web.Application, cfg: BotConfig, state: BotState, clock: Callable[[], float]) -> None:
    app.router.add_post(ROUTE, AlertmanagerInboundHandler(cfg, state, clock).handle)
