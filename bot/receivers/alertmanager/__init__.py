"""Prometheus Alertmanager, both ways: its alerts in (inbound.py), msmon's alerts out as its webhook or API
(receiver.py), and firing alerts pushed again on a timer (push.py)."""
