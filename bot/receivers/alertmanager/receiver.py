"""msmon's alerts as Alertmanager speaks them, two ways out (routes name the receiver):

- `alertmanager`: POSTs Alertmanager's webhook body (version 4: status, groupKey, commonLabels,
  alerts[] with labels, annotations, startsAt/endsAt) to `bot.alertmanager.webhook_url`, so anything
  that consumes Alertmanager webhooks (PagerDuty, Grafana OnCall, Opsgenie bridges) consumes msmon.
- `alertmanager_api`: pushes the alerts into a real Alertmanager's `POST /api/v2/alerts` (to every peer
  of an HA cluster: `api_url` and `api_urls`), so a team's routing, silences and inhibition apply. As
  Prometheus does, a firing alert carries an endsAt `4 x resend_interval` ahead and is pushed again
  every `resend_interval` while it fires (bot/receivers/alertmanager/push.py), so it stays active whatever the
  Alertmanager's resolve_timeout and comes back within an interval after an Alertmanager restart; a
  resolution carries its endsAt.

One alert per device, labelled alertname/run/rule/severity/device/project, annotated with the
message, the hint and a chart URL (`bot.alertmanager.chart_url` with {run_id} and {rule}). Both go
through the outbox like every receiver: retried with backoff, dead-lettered after a bound.
"""

from __future__ import annotations

import datetime
import hashlib
import logging
import os
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import msgspec

from bot.receivers import DeliveryError, Message, Note, Receiver
from bot.receivers.webhook import HttpReceiver, post_json
from msmon.contract.wire import Event, Status

if TYPE_CHECKING:
    from bot.config import BotConfig

log = logging.getLogger("msmon.bot")

ZERO_TIME = "0001-01-01T00:00:00Z"  # Alertmanager's endsAt of a firing alert in a webhook


def rfc3339(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).isoformat().replace("+00:00", "Z")


def alert_labels(msg: Message, e: Event) -> dict[str, str]:
    return {"alertname": msg.rule, "run": msg.run_id, "rule": msg.rule, "severity": msg.severity.value.lower(),
            "device": e.device, "project": msg.project}


def alert_annotations(msg: Message, e: Event, chart_url: str) -> dict[str, str]:
    out = {"message": e.message, "hint": e.hint, "step": str(e.step), "value": f"{e.value:g}",
           "threshold": f"{e.threshold:g}"}
    if chart_url:
        out["chart_url"] = chart_url.format(run_id=msg.run_id, rule=msg.rule)
    return {k: v for k, v in out.items() if v}


def _resolved(msg: Message) -> bool:
    return msg.status is Status.RESOLVED


def api_alerts(msg: Message, chart_url: str, valid_until: float | None = None) -> list[dict[str, Any]]:
    """The body of `POST /api/v2/alerts` (postableAlerts): one per device, started at its event's time
    (Alertmanager knows an alert by its labels, so a resolution ends the alert it pushed before). A firing
    alert ends at `valid_until` unless pushed again (None: no endsAt, Alertmanager's resolve_timeout)."""
    out = []
    for e in msg.events:
        alert: dict[str, Any] = {"labels": alert_labels(msg, e), "annotations": alert_annotations(msg, e, chart_url),
                                 "startsAt": rfc3339(e.time)}
        if _resolved(msg):
            alert["endsAt"] = rfc3339(e.time)
        elif valid_until is not None:
            alert["endsAt"] = rfc3339(valid_until)
        out.append(alert)
    return out


def webhook_body(msg: Message, receiver: str, chart_url: str, external_url: str = "") -> dict[str, Any]:
    """Alertmanager's webhook payload (version 4) for one msmon message."""
    status = "resolved" if _resolved(msg) else "firing"
    alerts = [{"status": status, "labels": a["labels"], "annotations": a["annotations"], "startsAt": a["startsAt"],
               "endsAt": a.get("endsAt", ZERO_TIME), "generatorURL": a["annotations"].get("chart_url", ""),
               "fingerprint": _fingerprint(a["labels"])} for a in api_alerts(msg, chart_url)]
    group_labels = {"run": msg.run_id, "rule": msg.rule}
    return {"version": "4", "groupKey": "{}:" + "{" + ", ".join(f'{k}="{v}"' for k, v in group_labels.items()) + "}",
            "truncatedAlerts": 0, "status": status, "receiver": receiver, "groupLabels": group_labels,
            "commonLabels": _common(a["labels"] for a in alerts),
            "commonAnnotations": _common(a["annotations"] for a in alerts),
            "externalURL": external_url, "alerts": alerts}


def _fingerprint(label_set: dict[str, str]) -> str:
    """A stable id of an alert's label set (Alertmanager's is a 64-bit hash in hex, as this is)."""
    return hashlib.sha256(msgspec.json.encode(sorted(label_set.items()))).hexdigest()[:16]


def _common(maps: Iterable[dict[str, str]]) -> dict[str, str]:
    """The labels (annotations) every alert has with the same value."""
    items = [set(m.items()) for m in maps]
    return dict(set.intersection(*items)) if items else {}


class AlertmanagerWebhookReceiver(HttpReceiver):
    """Alertmanager's webhook body to a consumer of Alertmanager webhooks."""

    name = "alertmanager"

    def __init__(self, url: str, chart_url: str = "", timeout: float = 10.0) -> None:
        super().__init__(timeout)
        self.url, self.chart_url = url, chart_url

    async def send(self, msg: Message, action: str, ref: str) -> None:
        await post_json(self.url, msgspec.json.encode(webhook_body(msg, "msmon", self.chart_url)),
                        timeout=self.timeout)

    async def note(self, note: Note) -> None:
        """Nothing: an Alertmanager webhook carries alerts, not chat answers."""


class AlertmanagerPushReceiver(HttpReceiver):
    """msmon's alerts pushed into a real Alertmanager (`POST /api/v2/alerts`)."""

    name = "alertmanager_api"

    def __init__(self, base_url: str | list[str], chart_url: str = "", timeout: float = 10.0,
                 resend_interval: float = 30.0, clock: Callable[[], float] = time.time) -> None:
        super().__init__(timeout)
        bases = [base_url] if isinstance(base_url, str) else base_url
        self.urls = [b.rstrip("/") + "/api/v2/alerts" for b in bases if b]
        self.url = self.urls[0] if self.urls else ""
        self.chart_url, self.resend_interval, self.clock = chart_url, resend_interval, clock

    async def send(self, msg: Message, action: str, ref: str) -> None:
        """To every peer (an Alertmanager cluster gossips, but a peer that was down has not heard); a failure
        when no peer took it (one that did is enough: the next refresh reaches the others)."""
        body = msgspec.json.encode(api_alerts(msg, self.chart_url, self.clock() + 4 * self.resend_interval))
        errors: list[DeliveryError] = []
        for url in self.urls:
            try:
                await post_json(url, body, timeout=self.timeout)
            except DeliveryError as exc:
                errors.append(exc)
        if errors and len(errors) == len(self.urls):
            raise errors[0]
        for error in errors:
            log.warning("msmon bot: an Alertmanager peer did not take the alerts of run %s (%s); the others did, "
                        "it gets them at the next refresh", msg.run_id, error)

    async def note(self, note: Note) -> None:
        """Nothing: Alertmanager takes alerts, not chat answers."""


def interop_receivers(cfg: BotConfig) -> dict[str, Receiver]:
    """The `alertmanager`, `alertmanager_api` and `webhook` receivers the routes use (an empty address or
    secret is logged: their messages wait in the outbox)."""
    from bot.receivers.webhook import WebhookReceiver

    am, wh, used = cfg.alertmanager, cfg.webhook, {r.receiver for r in cfg.routes}
    wanted: dict[str, tuple[str, str, Callable[[], Receiver]]] = {
        "alertmanager": (am.webhook_url, "bot.alertmanager.webhook_url",
                         lambda: AlertmanagerWebhookReceiver(am.webhook_url, am.chart_url, am.timeout)),
        "alertmanager_api": (am.api_url or "".join(am.api_urls), "bot.alertmanager.api_url",
                             lambda: AlertmanagerPushReceiver([am.api_url, *am.api_urls], am.chart_url, am.timeout,
                                                              am.resend_interval)),
        "webhook": (wh.url and os.environ.get(wh.secret_env, ""), f"bot.webhook.url and the environment variable "
                    f"{wh.secret_env}", lambda: WebhookReceiver(wh.url, os.environ.get(wh.secret_env, ""), wh.timeout)),
    }
    out: dict[str, Receiver] = {}
    for name, (ready, what, make) in wanted.items():
        if name not in used:
            continue
        if not ready:
            log.error("msmon bot: routes use the %s receiver but %s is not set: its messages wait in the outbox "
                      "(and become dead letters) until it is", name, what)
        out[name] = make()
    return out
