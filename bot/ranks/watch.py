"""The edge of the cross-rank rules: every `ranks.period` seconds (bot/assembly.py's periodic task), the
rules over the view (pure, bot/ranks/__init__.py's `check`), and each event they raise through the
same ingest path as a job's (bot/ingest/envelope.py's `Ingest.event`, given here as `emit`): dedup, inhibit,
silences, routes, grouping, the outbox. An event the ingest could not take (SQLite refused it) is tried
again at the next check: the rules' memory is put back as it was before it."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from bot.config import RanksConfig
from bot.ranks import check
from bot.ranks.view import Firing, RankViews
from msmon.contract.wire import Event, Status

log = logging.getLogger("msmon.bot")

Emit = Callable[[Event, str, dict[str, str], float, "int | None"], int]


class RankWatch:
    def __init__(self, views: RankViews, settings: RanksConfig, emit: Emit,
                 run_of: Callable[[str], Mapping[str, Any] | None], clock: Callable[[], float],
                 wake: Callable[[], None]) -> None:
        self.views, self.settings, self.emit, self.run_of = views, settings, emit, run_of
        self.clock, self.wake = clock, wake
        self.failed = 0  # events the ingest refused (retried at the next check)
        self.checked: float | None = None  # the previous check: the next looks at the runs heard from since

    def check(self) -> int:
        """One check; how many events were queued for delivery."""
        now = self.clock()
        queued = 0
        since, self.checked = self.checked, now
        for ev in check(self.views, self.settings, now, since):
            run = self.run_of(ev.run_id)
            project, labels = (run["project"], dict(run["labels"])) if run else ("default", {})
            rank = self.views.rank_of(ev.run_id, ev.device)
            if ev.status is Status.FIRING:
                log.warning("msmon bot: run %s: %s %s: %s", ev.run_id, ev.rule, ev.severity.value, ev.message)
            try:
                queued += self.emit(ev, project, labels, now, rank)
            except Exception:  # noqa: BLE001 - a refused write: the rules raise it again next check
                self.failed += 1
                self.checked = None  # the next check looks at every run again: this one's quiet or not
                log.exception("msmon bot: run %s: the %s event of rank %s could not be recorded; trying again in "
                              "%.0f s", ev.run_id, ev.rule, ev.device, self.settings.period)
                self._undo(ev)
        if queued:
            self.wake()
        return queued

    def _undo(self, ev: Event) -> None:
        run = self.views.runs.get(ev.run_id)
        if run is None:
            return
        key = (ev.rule, ev.device)
        if ev.status is Status.FIRING:
            run.firing.pop(key, None)  # fires again once the condition holds long enough
        else:
            run.firing[key] = Firing(0, ev.severity)  # resolves again at the next check
            self.views.alerting.add(ev.run_id)
