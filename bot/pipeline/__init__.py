"""The bot's two pipelines, declared here in order (after Alertmanager's notify pipeline).

Ingest (bot/ingest/envelope.py), per event of an envelope, inside the envelope's SQLite transaction:

    event ─► dedup ─► acked ─► inhibit ─► silence ─► route ─► group ─► alert row + outbox row (queued)
               │        │         │          │
               └────────┴─────────┴──────────┴─► dropped: the alert row only (what the job reports now),
                                                 msmon_suppressed_total{stage=<the stage's name>}

Delivery (bot/delivery/worker.py), every round of the worker, per due group of outbox rows (one message):

    due rows ─► Scheduler.groups ─► group_due ─► rate_limit ─► receiver ─► Scheduler.after ─► verdict written
    (SQLite)    (schedule.py)                    │             │                    (schedule.py: delivered,
                                        │             │                     retry later or dead letter)
                                        │             └─► must wait: deferred (no attempt, no error)
                                        └─► no row of the group left to try now: skipped

Every stage is a `Stage` (bot/pipeline/flow.py): a name and one function `(ctx, item) -> item | None`.
Stages do no I/O: the clock's reading and the settings come in the context, and the only state they
change is the context's (inhibit marks the run's firing ERROR, rate_limit takes tokens); SQLite,
receivers and the clock itself stay in bot/ingest/envelope.py,
bot/delivery/worker.py and bot/store/sqlite.py. Each stage's
decision lives in its own module, tested on its own (tests/bot/pipeline/test_stages.py).
"""

from __future__ import annotations

from bot.pipeline import acked, dedup, group, inhibit, ratelimit, route, silence
from bot.pipeline.flow import Context, Due, Notification, Round, Stage

STAGES: tuple[Stage[Context, Notification], ...] = (
    Stage("dedup", dedup.stage),  # a repeat inside repeat_interval; a resolution of nothing sent
    Stage("acked", acked.stage),  # reminders of an acknowledged alert
    Stage("inhibit", inhibit.stage),  # a run's WARNINGs while it has an ERROR firing
    Stage("silence", silence.stage),  # what a silence matches
    Stage("route", route.stage),  # receiver, channel, thread
    Stage("group", group.stage),  # the message it joins and when that is due
)

DELIVERY: tuple[Stage[Round, Due], ...] = (
    Stage("group_due", group.due),  # the group's rows that go together now
    Stage("rate_limit", ratelimit.stage),  # Retry-After pacing of the lane, token buckets
)
