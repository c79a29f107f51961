"""Text of a message, shared by the receivers: what happened, where, the numbers, what to do.

Everything a job sends (run id, rule, device, message, hint, phase, project) is data, never markup:
it goes through the receiver's escape function, one per markup, defined here so that a new receiver
(Feishu, Matrix, ...) adds its own next to these. Only msmon's own templates add markup.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Callable
from urllib.parse import quote

from bot.receivers import Message
from bot.runs.lifecycle import RUN_ENDED
from msmon.common.text import CONTROL as _CONTROL
from msmon.common.text import CONTROL_LINE as _CONTROL_LINE
from msmon.common.text import one_line
from msmon.contract.wire import Event, Status

ICON = {"ERROR": ":red_circle:", "WARNING": ":large_orange_circle:"}

Escape = Callable[[str], str]

_BROADCAST = re.compile(r"@(?=(?:here|channel|everyone)\b)", re.IGNORECASE)


def escape_console(value: str) -> str:
    """A terminal line: control characters (ESC sequences, BEL, CR, NUL, bidi overrides) shown as
    `\\x1b`-style text, so job data can neither clear the screen nor forge another line."""
    return one_line(value)


def escape_slack(value: str) -> str:
    """Slack mrkdwn (and a message's `text`): `&`, `<`, `>` as entities, as Slack asks
    (https://api.slack.com/reference/surfaces/formatting#escaping), so `<!channel>`, `<@U1>` and
    `<http://x|click>` are shown, not acted on; `@here`/`@channel`/`@everyone` get a word joiner
    after the `@`; control characters are dropped."""
    value = _CONTROL.sub("", value).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _BROADCAST.sub("@\u2060", value)


def escape_slack_code(value: str) -> str:
    """Inside a mrkdwn code span: escaped as mrkdwn, and no backtick that would close the span."""
    return escape_slack(value).replace("`", "\u02cb")


def escape_slack_plain(value: str) -> str:
    """A Block Kit plain_text object (a header, a file title): the same entities as mrkdwn (Slack shows
    them as the characters), so no raw `<!channel>` reaches Slack in any field."""
    return escape_slack(value)


def escape_html(value: str) -> str:
    """HTML text (an email's HTML part): `&`, `<`, `>` and quotes as entities; control characters dropped."""
    return html.escape(_CONTROL.sub("", value), quote=True)


_MATRIX_ROOM = re.compile(r"@(?=room\b)", re.IGNORECASE)


def escape_matrix_text(value: str) -> str:
    """A Matrix message's plain `body`: control characters dropped and a word joiner after the `@` of
    `@room`, which the homeserver's legacy push rule would otherwise turn into a notification of the room."""
    return _MATRIX_ROOM.sub("@\u2060", _CONTROL.sub("", value))


def slack_mention(target: str) -> str:
    """An escalation target from bot.yaml as Slack mention markup: U.../W... a user, S... a user group,
    here/channel/everyone a broadcast; anything else is shown as text."""
    t = target.lstrip("@")
    if t in ("here", "channel", "everyone"):
        return f"<!{t}>"
    if re.fullmatch(r"[UW][A-Z0-9]{2,20}", t):
        return f"<@{t}>"
    if re.fullmatch(r"S[A-Z0-9]{2,20}", t):
        return f"<!subteam^{t}>"
    return escape_slack(target)


def mention_text(targets: list[str]) -> str:
    """Escalation targets for a plain-text receiver (the console): `for: @U1, @oncall`."""
    return "for: " + ", ".join("@" + escape_console(t.lstrip("@")) for t in targets) if targets else ""


_MD_SPECIAL = re.compile(r"[\\`*_~\[\]()#|!]")  # what opens emphasis, code, a link, an image, a heading, a table
_MENTION = re.compile(r"@")


def _markdown(value: str) -> str:
    """Chat markdown: control characters and newlines dropped, `&`, `<`, `>` as entities (these
    markups read HTML-like tags: `<at>`, `<font>`, `<@user>`), each character that opens markup
    backslashed, and a word joiner after every `@` so that job text mentions nobody."""
    value = _CONTROL_LINE.sub(" ", value).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    value = _MD_SPECIAL.sub(lambda m: "\\" + m.group(), value)
    return _MENTION.sub("@\u2060", value)


def escape_feishu(value: str) -> str:
    """A Feishu/Lark card's lark_md text: no `<at id=all>`, `<font>`, link or emphasis from job data."""
    return _markdown(value)


def escape_dingtalk(value: str) -> str:
    """DingTalk markdown: no link, image, heading or emphasis, and no `@mobile` that would notify."""
    return _markdown(value)


def escape_wecom(value: str) -> str:
    """WeCom markdown: no `<@userid>` mention, `<font>` colour, link or emphasis from job data."""
    return _markdown(value)


def escape_plain_im(value: str) -> str:
    """A plain-text field of a card (Feishu's plain_text header): control characters and newlines dropped."""
    return _CONTROL_LINE.sub(" ", value)


def escape_none(value: str) -> str:
    return value


def num(x: float | None) -> str:
    if x is None:
        return "-"
    if not math.isfinite(x):
        return str(x)
    return f"{x:.4g}"


def devices_text(msg: Message, esc: Escape = escape_none) -> str:
    devs = [esc(d) for d in msg.devices]
    if len(devs) <= 16:
        return ", ".join(devs)
    return ", ".join(devs[:16]) + f" and {len(devs) - 16} more"


def ranks_text(msg: Message, esc: Escape = escape_none) -> str | None:
    """"on 64/64 ranks (first: rank 17 at step 12,400)": where a message of a run with several ranks
    (bot/ranks) happened, counted out of the ranks the bot knows in the run; None for a single process."""
    n = len(msg.devices)
    known = max(msg.known_ranks, n)
    if known < 2 and not msg.ranks:
        return None
    lead = msg.lead
    r = msg.ranks.get(lead.device)
    unit = "ranks" if msg.ranks else "devices"
    first = f"rank {r}" if r is not None else f"device {esc(lead.device)}"
    if n == 1:
        return f"on {first} (1/{known} {unit}) at step {lead.step:,}"
    return f"on {n}/{known} {unit} (first: {first} at step {lead.step:,})"


def title(msg: Message, esc: Escape = escape_none) -> str:
    state = "RESOLVED" if msg.status is Status.RESOLVED else msg.severity.value
    n = len(msg.devices)
    again = " (still firing)" if msg.repeat else ""
    ranks = ranks_text(msg, esc)
    if ranks is not None:
        return f"{state} {esc(msg.rule)}{again}: run {esc(msg.run_id)}, {ranks}"
    where = f"device {esc(msg.devices[0])}" if n == 1 else f"{n} devices"
    return f"{state} {esc(msg.rule)}{again}: run {esc(msg.run_id)}, {where}, step {msg.lead.step}"


def chart_line(msg: Message) -> str | None:
    """What the reader is told when the alert's chart could not be drawn (msmon's own words)."""
    return None if msg.chart_problem is None else f"(chart could not be drawn: {msg.chart_problem})"


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




def resolved_text(msg: Message, esc: Escape) -> str:
    """What a resolution says: "back to normal", or why it closed without being back to normal (its run
    ended: `RUN_ENDED`, then the run's own words)."""
    why = msg.resolution or msg.lead.message
    if why.startswith(RUN_ENDED):
        return f"closed, {esc(why)} (devices {devices_text(msg, esc)})"
    return f"back to normal on devices {devices_text(msg, esc)}"


def text(msg: Message, esc: Escape) -> str:
    """The message as lines of text (console; Slack's notification fallback), job data through `esc`."""
    ev = msg.lead
    lines = [title(msg, esc)]
    if msg.status is not Status.RESOLVED:
        lines.append(esc(ev.message))
        lines.append(f"value {num(ev.value)} vs threshold {num(ev.threshold)}; devices {devices_text(msg, esc)}; "
                     f"phase {esc(ev.phase)}")
        metrics = metric_lines(ev)
        if metrics:
            lines.append("now: " + " | ".join(metrics))
        if ev.hint:
            lines.append("what to do: " + esc(ev.hint))
        problem = chart_line(msg)
        if problem:
            lines.append(esc(problem))
    else:
        lines.append(resolved_text(msg, esc))
    if msg.link:
        lines.append(f"open in msmon: {msg.link}")  # msmon's own URL, the run id percent-encoded in it
    return "\n".join(lines)


def console_path(run_id: str) -> str:
    """A run's page in the web console (bot/web): the id percent-encoded, so no markup, `/` or `?` of a
    job's run id is anything but part of the id."""
    return f"/console/runs/{quote(run_id, safe='')}"


def console_url(public_url: str, run_id: str) -> str:
    """The link a chat message gives to its run's console page."""
    return public_url.rstrip("/") + console_path(run_id)


def duration_text(seconds: float) -> str:
    """35 min, 2 h 05 min, 3 d 4 h: how long, for a person."""
    m = max(int(seconds // 60), 0)
    if m < 120:
        return f"{m} min" if m else f"{max(int(seconds), 0)} s"
    h, m = divmod(m, 60)
    if h < 48:
        return f"{h} h {m:02d} min"
    d, h = divmod(h, 24)
    return f"{d} d {h} h"


def cost_line(run_id: str, devices: int, severity: str, since: float, now: float) -> str:
    """The cost of waiting: "run-42 on 64 devices has been in ERROR for 35 min (≈37 device-hours)"."""
    age = max(now - since, 0.0)
    hours = devices * age / 3600.0
    spent = f"{hours:.0f}" if hours >= 10 else f"{hours:.1f}"
    where = f"on {devices} device{'s' if devices != 1 else ''} " if devices else ""
    return f"{run_id} {where}has been in {severity} for {duration_text(age)} (≈{spent} device-hours)"
