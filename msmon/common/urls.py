"""The bot's base URL, checked once for config and transport alike, and the URLs the bot posts to (a chat robot's
webhook): https only, or http to this machine (standard library only)."""

from __future__ import annotations

import ipaddress
import reprlib
from urllib.parse import urlsplit

_REPR = reprlib.Repr()
_REPR.maxstring = 120


def url_problem(url: str) -> str | None:
    """What is wrong with an http(s) base URL, or None. The URL is echoed with any user:password cut out."""
    if any(ch.isspace() for ch in url):
        return f"has a space or other whitespace in it: {_REPR.repr(redacted(url))}"
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in url):
        return "has a control character in it"
    if not url.startswith(("http://", "https://")):
        hint = "" if "://" in url else f" (it needs a scheme: http://{redacted(url)}?)"
        return f"must start with http:// or https://, got {_REPR.repr(redacted(url))}{hint}"
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # e.g. "Invalid IPv6 URL" for http://[::1
        return f"cannot be read as a URL ({exc}): {_REPR.repr(redacted(url))}"
    try:
        parts.port  # noqa: B018 (raises on a port out of range or not a number)
    except ValueError as exc:
        return f"has an invalid port ({exc})"
    if not parts.hostname:
        return f"has no host: {_REPR.repr(redacted(url))}"
    return None


def loopback(host: str) -> bool:
    """The host is this machine: localhost, 127.0.0.0/8 or ::1."""
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def webhook_problem(url: str) -> str | None:
    """What is wrong with a URL the bot POSTs alerts to (a chat robot's webhook, which holds its secret), or None:
    an https URL, or http to this machine only (a local test server); never file://, plain http elsewhere, or
    something that is not a URL. The URL is never echoed: it is a secret."""
    scheme = url.partition("://")[0].lower() if "://" in url else ""
    if scheme not in ("http", "https"):
        return f"is not an https:// URL ({f'it starts with {scheme[:20]}://' if scheme else 'it has no scheme'})"
    problem = url_problem(url)
    if problem is not None:
        return problem.split(": ", 1)[0] if ":" in problem else problem  # without the URL itself
    host = urlsplit(url).hostname or ""
    if scheme == "http" and not loopback(host):
        return "is http://, which sends the robot's token in the clear; use https:// (http only to this machine)"
    return None


def redacted(url: str) -> str:
    """The URL as it may be logged or shown: any user:password replaced by ***."""
    head, sep, rest = url.partition("://")
    netloc, slash, path = rest.partition("/")
    if sep and "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    return f"{head}{sep}{netloc}{slash}{path}"
