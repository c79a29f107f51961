"""An alert's identity: one rule on one device of one run (the notifier's gate keys the same way)."""

from __future__ import annotations


def fingerprint(run_id: str, rule: str, device: str) -> str:
    return f"{run_id}|{rule}|{device}"
