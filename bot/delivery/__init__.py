"""Getting accepted messages out: the worker that takes due outbox rows through each destination's lane
(worker.py; the pure retry schedule is bot/pipeline/schedule.py), the outbox row's payload (payload.py),
the notification log's write after a dead letter (nflog.py) and the cron digests (digest.py)."""
