"""msmon's firing alerts pushed again into Alertmanager every `bot.alertmanager.resend_interval`, as
Prometheus re-sends its firing alerts: each push carries an endsAt four intervals ahead, so an alert stays
active in Alertmanager while it fires whatever the Alertmanager's resolve_timeout, and is back within an
interval after an Alertmanager restart (it keeps no alerts) or on a peer that was down. A refresh pushes
what the notification log says was sent and still fires (not what a silence, an inhibition or dedup held
back); the outbox still delivers each new alert and its resolution. One replica refreshes at a time (a
lease); a failed push is logged and tried again at the next interval."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import msgspec

from bot.pipeline.group import firing_key
from bot.pipeline.route import route_for
from bot.receivers import DeliveryError, Message
from bot.shared import BotState
from msmon.contract.wire import Event, Severity, Status, decode

log = logging.getLogger("msmon.bot")


class AlertmanagerRefresh:
    def __init__(self, state: BotState, receiver: Any, period: float) -> None:
        self.state, self.receiver, self.period = state, receiver, period
        self._failing = False

    def firing(self) -> list[Message]:
        """The firing alerts routed to the receiver whose notification was sent, one message per run, rule
        and severity (one alert per device in it)."""
        store, routes = self.state.store, self.state.cfg.routes
        groups: dict[tuple[str, str, str], list[Event]] = {}
        rows = store.db.execute("SELECT run_id, rule, severity, event FROM alerts WHERE status='firing' AND"
                                " sent_severity IS NOT NULL AND sent_resolved=0 AND event IS NOT NULL ORDER BY run_id")
        for r in rows:
            try:
                ev = decode(r["event"], Event)
            except (msgspec.DecodeError, ValueError, TypeError):
                continue
            groups.setdefault((r["run_id"], r["rule"], r["severity"]), []).append(ev)
        out = []
        for (run_id, rule, severity), events in groups.items():
            run = store.run(run_id)
            if run is None:
                continue
            route = route_for(run["project"], run["labels"], Severity(severity), routes)
            if route is None or route.receiver != self.receiver.name:
                continue
            out.append(Message(key=firing_key(events[0]), run_id=run_id, project=run["project"], rule=rule,
                               severity=Severity(severity), status=Status.FIRING, events=events))
        return out

    async def refresh(self) -> int:
        """Push every firing alert once; how many messages went."""
        if not self.state.owns("alertmanager-refresh"):
            return 0
        sent = 0
        for msg in self.firing():
            try:
                await self.receiver.send(msg, "refresh", "")
                sent += 1
            except DeliveryError as exc:
                if not self._failing:
                    log.warning("msmon bot: could not push the firing alerts to Alertmanager again (%s); trying "
                                "again every %.0f s", exc, self.period)
                self._failing = True
                return sent
        if self._failing:
            log.info("msmon bot: Alertmanager takes the firing alerts again")
        self._failing = False
        return sent

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), self.period)
            if stop.is_set():
                return
            try:
                await self.refresh()
            except Exception:  # noqa: BLE001 - the store's trouble: the next interval tries again
                log.exception("msmon bot: the Alertmanager refresh failed; trying again in %.0f s", self.period)
