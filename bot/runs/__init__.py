"""Runs and their ranks as pure lifecycles (lifecycle.py: transition tables, clock injected) and the gate on
how many devices a run may report from (devices.py). The ingest carries them out (bot/ingest/runs.py)."""
