"""Job text as the bot shows it: control characters (ESC sequences, BEL, CR, NUL, newlines, bidi overrides) never
reach a terminal, a chat answer or a status line as themselves (standard library only; bot/receivers/render.py's
escapes and bot/store/windows.py's kept checkpoints use these)."""

from __future__ import annotations

import re

CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
CONTROL_LINE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")  # and newline


def visible(m: re.Match[str]) -> str:
    return f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100 else f"\\u{ord(m.group()):04x}"


def one_line(value: str) -> str:
    """`value` on one line: its control characters, newlines included, shown as `\\x0a`-style text, so job data can
    neither clear a screen nor forge another line."""
    return CONTROL_LINE.sub(visible, value)
