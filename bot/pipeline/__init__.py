"""The event path, one small pure stage per module (after Alertmanager's dispatch/inhibit/silence/notify):

    ingest -> dedup -> inhibit -> silence -> route -> durable outbox -> group -> rate limit -> receivers

The first four run when an envelope is accepted (`bot.dispatch`); grouping and rate limiting run
where messages leave (`bot.outbox`), so nothing waits in memory. Stages take the clock as an
argument; persistence and I/O live in `bot.store`, `bot.outbox` and `bot.receivers`.
"""
