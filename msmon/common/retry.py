"""Reading an HTTP Retry-After header, for the job's send queue and the bot's receivers alike."""

from __future__ import annotations

import math


def retry_after(value: str | None, now: float, cap: float) -> float | None:
    """Seconds to wait from a Retry-After header: delta seconds or an HTTP date, bounded to [0, cap];
    None when absent or unreadable (then the usual backoff applies)."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        import email.utils  # only for an HTTP date: it pulls in socket, which the pure queue does not need

        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
        if when.tzinfo is None:
            return None
        seconds = when.timestamp() - now
    if math.isnan(seconds):
        return None
    return min(max(seconds, 0.0), cap)
