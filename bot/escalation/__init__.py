"""Escalation of unacknowledged alerts: `policy.py` (pure: what is due), `scheduler.py` (the edge:
apscheduler, SQLite, the outbox)."""
