"""msmon's alerts as Alertmanager speaks them, two ways out (routes name the receiver):

- `alertmanager`: POSTs Alertmanager's webhook body (version 4: status, groupKey, commonLabels,
  alerts[] with labels, annotations, startsAt/endsAt) to `bot.alertmanager.webhook_url`, so anything
  that consumes Alertmanager webhooks (PagerDuty, Grafana OnCall, Opsgenie bridges) consumes msmon.
- `alertmanager_api`: pushes the alerts into a real Alertmanager's `POST /api/v2/alerts`, so a team's
  routing, silences and inhibition apply. A firing alert carries no endsAt (Alertmanager resolves it
  after its resolve_timeout unless msmon's reminder, every pipeline.repeat_interval, pushes it again);
  a resolution carries its endsAt.

One alert per device, labelled alertname/run/rule/severity/device/project, annotated with the
message, the hint and a chart URL (`bot.alertmanager.chart_url` with {run_id} and {rule}). Both go
through the outbox like every receiver: retried with backoff, dead-lettered after a bound.
"""

from __future__ import annotations

import datetime
import hashlib
import logging
import os
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import msgspec

from msmon.contract.wire import Event, Status

from . import Message, Note, Receiver
from .webhook import HttpReceiver, post_json

if TYPE_CHECKING:
    from ..config import BotConfig

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


def api_alerts(msg: Message, chart_url: str) -> list[dict[str, Any]]:
    """The body of `POST /api/v2/alerts` (postableAlerts): one per device, started at its event's time
    (Alertmanager knows an alert by its labels, so a resolution ends the alert it pushed before)."""
    out = []
    for e in msg.events:
        alert: dict[str, Any] = {"labels": alert_labels(msg, e), "annotations": alert_annotations(msg, e, chart_url),
                                 "startsAt": rfc3339(e.time)}
        if _resolved(msg):
            alert["endsAt"] = rfc3339(e.time)
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

    def __init__(self, base_url: str, chart_url: str = "", timeout: float = 10.0) -> None:
        super().__init__(timeout)
        self.url, self.chart_url = base_url.rstrip("/") + "/api/v2/alerts", chart_url

    async def send(self, msg: Message, action: str, ref: str) -> None:
        await post_json(self.url, msgspec.json.encode(api_alerts(msg, self.chart_url)),
                        timeout=self.timeout)

    async def note(self, note: Note) -> None:
        """Nothing: Alertmanager takes alerts, not chat answers."""


def interop_receivers(cfg: BotConfig) -> dict[str, Receiver]:
    """The `alertmanager`, `alertmanager_api` and `webhook` receivers the routes use (an empty address or
    secret is logged: their messages wait in the outbox)."""
    from .webhook import WebhookReceiver

    am, wh, used = cfg.alertmanager, cfg.webhook, {r.receiver for r in cfg.routes}
    wanted: dict[str, tuple[str, str, Callable[[], Receiver]]] = {
        "alertmanager": (am.webhook_url, "bot.alertmanager.webhook_url",
                         lambda: AlertmanagerWebhookReceiver(am.webhook_url, am.chart_url, am.timeout)),
        "alertmanager_api": (am.api_url, "bot.alertmanager.api_url",
                             lambda: AlertmanagerPushReceiver(am.api_url, am.chart_url, am.timeout)),
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
