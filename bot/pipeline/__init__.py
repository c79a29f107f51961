"""The event path, one small pure stage per module (after Alertmanager's dispatch/inhibit/silence/notify):

    ingest -> dedup -> inhibit -> silence -> group -> rate limit -> route -> outbox -> receivers

Stages take the clock as an argument and keep only bounded state; persistence and I/O live in
`bot.store`, `bot.outbox` and `bot.receivers`.
"""
