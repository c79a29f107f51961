"""The notification log's one write outside ingest: a message given up (a dead letter) takes back what
ingest recorded when it queued it (bot/pipeline/dedup.py `given_up`), so a dead-lettered ERROR does not
count as notified: the alert's next event, or the job's next reminder, goes out at once instead of a
whole `repeat_interval` later, as Alertmanager writes its notification log only after a successful send."""

from __future__ import annotations

import logging

import msgspec

from bot.delivery.payload import Payload
from bot.pipeline import dedup
from bot.pipeline.alert import fingerprint
from bot.pipeline.flow import NotifyState
from bot.pipeline.schedule import OutboxRow
from bot.shared import BotState
from msmon.contract.wire import decode

log = logging.getLogger("msmon.bot")


def given_up(state: BotState, rows: list[OutboxRow]) -> int:
    """The alert and reminder rows of a dead letter: their alerts' notification log taken back where
    nothing was queued for them since. How many alerts count as not notified now."""
    queued: list[tuple[str, str, Payload]] = []  # (fingerprint, kind, payload)
    for r in rows:
        if r.kind not in ("alert", "repeat"):
            continue
        try:
            p = decode(r.payload, Payload)
        except (msgspec.DecodeError, ValueError, TypeError):
            continue
        queued.append((fingerprint(p.event.run_id, p.event.rule, p.event.device), r.kind, p))
    if not queued:
        return 0
    writes: list[tuple[NotifyState, str]] = []
    with state.tx():
        for run_id in sorted({p.event.run_id for _, _, p in queued}):
            state.store.lock_run(run_id)
        entries = state.index.get([fp for fp, _, _ in queued])
        for fp, kind, p in queued:
            entry = entries.get(fp)
            after = None if entry is None else dedup.given_up(entry.notify, kind, p.received_at, p.event.severity)
            if entry is None or after is None:
                continue
            writes.append((after, fp))
            state.index.stage(fp, after, entry.severity or p.event.severity.value,
                              entry.status or p.event.status.value)
        if writes:
            state.store.set_sent(writes)
    if writes:
        log.info("msmon bot: %d alert(s) of a dead letter count as not notified: their next event is sent again",
                 len(writes))
    return len(writes)
