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
from typing import Any

import msgspec
from aiohttp import web

from msmon.contract.wire import Severity

from .config import AlertmanagerInbound, BotConfig
from .pipeline.route import route_for
from .receivers import Note, ReplyTo
from .state import BotState
from .store import AlertRow, OutboxEntry

log = logging.getLogger("msmon.bot")

ROUTE = "/v1/alertmanager"
_ERROR_SEVERITIES = {"critical", "error", "page", "fatal", "emergency"}


class AmAlert(msgspec.Struct):
    status: str
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    startsAt: str = ""  # noqa: N815 - Alertmanager's field names
    endsAt: str = ""  # noqa: N815
    fingerprint: str = ""


class AmWebhook(msgspec.Struct):
    """Alertmanager's webhook body (version 4); fields msmon does not read are ignored."""

    alerts: list[AmAlert]
    version: str = "4"
    status: str = "firing"
    receiver: str = ""


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


def matching_runs(alert: AmAlert, runs: Iterable[Mapping[str, Any]], cfg: AlertmanagerInbound
                  ) -> list[tuple[str, str]]:
    """(run id, the host or job it matched) of each run the alert concerns."""
    hosts = {_host(alert.labels[k]) for k in cfg.host_labels if alert.labels.get(k)}
    jobs = {alert.labels[k] for k in cfg.job_labels if alert.labels.get(k)}
    out = []
    for r in runs:
        labels = r.get("labels") or {}
        by_host = hosts & run_hosts(labels, cfg)
        by_job = jobs & ({r["run_id"]} | {labels[k] for k in cfg.run_job_labels if labels.get(k)})
        if by_host or by_job:
            out.append((r["run_id"], sorted(by_host or by_job)[0]))
    return out


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
        rows: list[AlertRow] = []
        notes: list[OutboxEntry] = []
        for alert in alerts:
            for run_id, where in matching_runs(alert, runs, self.cfg.alertmanager.inbound):
                rule = "cluster:" + alert.labels.get("alertname", "alert")
                fp = f"{run_id}|{rule}|{where}"
                status = "resolved" if alert.status == "resolved" else "firing"
                known = {a["fingerprint"]: a["status"] for a in store.alerts(run_id)}
                sev = _severity(alert)
                rows.append(AlertRow(fp, run_id, rule, where, sev.value, status, steps[run_id], now))
                if known.get(fp) != status and (status == "firing" or fp in known):
                    notes.append(self._note(run_id, sev, _text(alert, run_id, where), fp, now))
        with self.state.tx():
            if rows:
                store.save_alerts(rows)
            if notes:
                store.enqueue_many(notes)
        if notes:
            self.state.wake_outbox()
        log.info("msmon bot: Alertmanager sent %d alert(s); %d matched a run, %d note(s) queued", len(alerts),
                 len(rows), len(notes))
        return len(rows)

    def _note(self, run_id: str, severity: Severity, text: str, fp: str, now: float) -> OutboxEntry:
        """A note in the thread of the run's first message on its route (the channel itself when none)."""
        run = self.state.store.run(run_id) or {}
        route = route_for(run.get("project", "default"), run.get("labels") or {}, severity, self.cfg.routes)
        root = self.state.store.message(f"{run_id}|root|{route.receiver}|{route.channel}")
        note = Note(text=text, reply_to=ReplyTo(channel=route.channel, thread=root["ts"] if root else ""))
        return OutboxEntry(now, route.receiver, route.channel, "note", f"cluster|{fp}|{now!r}", run_id,
                           msgspec.json.encode(note).decode(), now)


def add_alertmanager_route(app: web.Application, cfg: BotConfig, state: BotState, clock: Callable[[], float]) -> None:
    app.router.add_post(ROUTE, AlertmanagerInboundHandler(cfg, state, clock).handle)
