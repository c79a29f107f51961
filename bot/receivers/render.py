"""Text of a message, shared by the receivers: what happened, where, the numbers, what to do."""

from __future__ import annotations

import math

from notifier.wire import Event, Status

from . import Message

ICON = {"ERROR": ":red_circle:", "WARNING": ":large_orange_circle:"}


def num(x: float | None) -> str:
    if x is None:
        return "-"
    if not math.isfinite(x):
        return str(x)
    return f"{x:.4g}"


def devices_text(msg: Message) -> str:
    devs = msg.devices
    if len(devs) <= 16:
        return ", ".join(devs)
    return ", ".join(devs[:16]) + f" and {len(devs) - 16} more"


def title(msg: Message) -> str:
    state = "RESOLVED" if msg.status is Status.RESOLVED else msg.severity.value
    n = len(msg.devices)
    where = f"device {msg.devices[0]}" if n == 1 else f"{n} devices"
    again = " (still firing)" if msg.repeat else ""
    return f"{state} {msg.rule}{again}: run {msg.run_id}, {where}, step {msg.lead.step}"


def _last(values: list[float | None]) -> float | None:
    for v in reversed(values):
        if v is not None:
            return v
    return None


def median(values: list[float | None]) -> float | None:
    xs = sorted(v for v in values if v is not None and math.isfinite(v))
    if not xs:
        return None
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def metric_lines(ev: Event) -> list[str]:
    """Current value of each metric against its median over the recent window."""
    w = ev.window
    if w is None or not w.steps:
        return []
    out = []
    for name, values in (("loss", w.loss), ("lr", w.learning_rate), ("grad norm", w.grad_norm),
                         ("tokens/s", w.tokens_per_s)):
        now = _last(values)
        if now is not None:
            out.append(f"{name} {num(now)} (median {num(median(values))})")
    return out


def text(msg: Message) -> str:
    """Plain text (console; Slack's notification fallback)."""
    ev = msg.lead
    lines = [title(msg)]
    if msg.status is not Status.RESOLVED:
        lines.append(ev.message)
        lines.append(f"value {num(ev.value)} vs threshold {num(ev.threshold)}; devices {devices_text(msg)}; "
                     f"phase {ev.phase}")
        metrics = metric_lines(ev)
        if metrics:
            lines.append("now: " + " | ".join(metrics))
        if ev.hint:
            lines.append("what to do: " + ev.hint)
    else:
        lines.append(f"back to normal on devices {devices_text(msg)}")
    return "\n".join(lines)
