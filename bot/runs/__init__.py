"""Runs and their ranks as pure lifecycles (lifecycle.py: transition tables, clock injected, a run that ends while
dying is `failed`), the gate on how many devices a run may report from and which ids it may use (devices.py), and
a run's whole curve in bounded memory (curve.py). The ingest carries them out (bot/ingest/runs.py)."""
