"""The NATS side of the wire: the subjects a job and the bot meet on, and the headers they carry.

    <prefix>.<project>.<run>.env           a job's envelopes      (JetStream; Nats-Msg-Id: the batch's key)
    <prefix>.<project>.<run>.hb            a job's heartbeats     (JetStream)
    <prefix>.<project>.<run>.poll          a rank's command poll  (core NATS, any bot replica answers)
    <prefix>.<project>.<run>.cmd.<device>  the commands for that rank (the poll's reply subject)
    <prefix>.<project>.<run>.act           a rank's configured action for the whole run (request/reply)

A subject token may not hold `.`, `*`, `>` or whitespace, so project, run and device names (job data)
are never put in raw: `token` keeps letters, digits and `-`, and writes every other byte of the UTF-8
as `_XX` (hex), `_` itself included. That is one-to-one: two runs never share a subject, and the bot
checks an envelope's subject against the project and run it carries by encoding them again.

Pure string code, the standard library only (both the job runtime and the bot import it).
"""

from __future__ import annotations

ENVELOPE, HEARTBEAT, POLL, COMMANDS, ACTION = "env", "hb", "poll", "cmd", "act"
TOKEN_HEADER = "Msmon-Token"  # the job's token, checked by the bot like HTTP's bearer token
STATUS_HEADER = "Msmon-Status"  # the bot's answer to a poll, as an HTTP status ("200", "403", ...)
MSG_ID_HEADER = "Nats-Msg-Id"  # JetStream's dedup key
DEFAULT_PREFIX = "msmon"

_KEEP = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-")


def token(value: str) -> str:
    """`value` as one subject token: never empty; letters, digits, `-` and `_XX` escapes only."""
    if not value:
        return "_"
    return "".join(c if c in _KEEP else "".join(f"_{b:02X}" for b in c.encode("utf-8", "surrogatepass"))
                   for c in value)


def subject(prefix: str, project: str, run_id: str, kind: str, device: str | None = None) -> str:
    """The subject of `kind` (ENVELOPE, HEARTBEAT, POLL, COMMANDS) for a run (and, for COMMANDS, a device)."""
    base = f"{prefix}.{token(project)}.{token(run_id)}.{kind}"
    return base if device is None else f"{base}.{token(device)}"


def prefix_problem(prefix: str) -> str | None:
    """What keeps `prefix` from being the first token(s) of msmon's subjects, or None."""
    if not prefix:
        return "must not be empty"
    for part in prefix.split("."):
        if not part or any(c not in _KEEP and c != "_" for c in part):
            return (f"{prefix!r} is not a NATS subject prefix: dot-separated tokens of letters, digits, '-' and "
                    "'_' (e.g. msmon or team.msmon)")
    return None


def name_problem(name: str) -> str | None:
    """What keeps `name` from being a JetStream stream or consumer name, or None."""
    if not name or len(name) > 64 or any(c not in _KEEP and c != "_" for c in name):
        return f"{name!r} is not a JetStream name: 1 to 64 letters, digits, '-' and '_' (e.g. MSMON)"
    return None


def is_nats_url(url: str | None) -> bool:
    """Whether a `bot.url` names NATS servers (nats:// or tls://) rather than the bot's HTTP address."""
    return bool(url) and str(url).strip().startswith(("nats://", "tls://"))


def nats_url_problem(url: str) -> str | None:
    """What is wrong with a NATS server address (`nats://host:port`, `tls://...`; several: comma-separated),
    or None. Any user:password is left out of the message."""
    for one in url.split(","):
        one = one.strip()
        scheme, sep, rest = one.partition("://")
        if not sep or scheme not in ("nats", "tls"):
            return f"must start with nats:// or tls:// (e.g. nats://127.0.0.1:4222), got {_shown(one)}"
        if any(c.isspace() or ord(c) < 32 for c in rest):
            return f"has whitespace or a control character in it: {_shown(one)}"
        netloc = rest.partition("/")[0].rpartition("@")[2]
        host, colon, port = netloc.rpartition(":") if not netloc.endswith("]") else (netloc, "", "")
        if not colon:
            host, port = netloc, ""
        if not host.strip("[]"):
            return f"has no host: {_shown(one)}"
        if port and (not port.isdigit() or not 0 < int(port) < 65536):
            return f"has an invalid port {port!r}: {_shown(one)}"
    return None


def _shown(url: str) -> str:
    head, sep, rest = url.partition("://")
    netloc, slash, path = rest.partition("/")
    if "@" in netloc:
        netloc = "***@" + netloc.rpartition("@")[2]
    return repr(f"{head}{sep}{netloc}{slash}{path}"[:120])


__all__ = ["ACTION", "COMMANDS", "DEFAULT_PREFIX", "ENVELOPE", "HEARTBEAT", "MSG_ID_HEADER", "POLL", "STATUS_HEADER",
           "TOKEN_HEADER", "is_nats_url", "name_problem", "nats_url_problem", "prefix_problem", "subject", "token"]
