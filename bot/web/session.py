"""Who is looking at the console: operator logins, their cookies and CSRF tokens. Pure but for the
random numbers; the clock is injected.

An operator logs in with the token bot.yaml gives them (`commands.operators`): the same secret
`msmon cmd` sends. A login is a random session id in an HttpOnly, SameSite=Strict cookie, mapped here
to the operator's name and a CSRF token that every POST must carry (a form field or the
`X-CSRF-Token` header). A script may send `Authorization: Bearer <token>` instead: a browser never
adds that header by itself, so such a request needs no CSRF token. Logins are bounded
(`console.web.max_sessions`, the oldest logged out first) and expire (`console.web.session_ttl`);
they live in memory, so a restarted bot asks for the token again. A remote address that sends
`FAILURES` wrong tokens in a minute waits out the minute (429).
"""

from __future__ import annotations

import hmac
import secrets
from collections import OrderedDict
from collections.abc import Callable, Sequence

import msgspec

COOKIE = "msmon_console"
LOGIN_COOKIE = "msmon_login"  # the login form's own CSRF token (double-submit: cookie and field equal)
CSRF_HEADER = "X-CSRF-Token"
FAILURES, FAILURE_WINDOW = 10, 60.0  # wrong tokens a remote may send per window (seconds) before it waits
MAX_REMOTES = 10_000  # remotes whose failures are remembered (the oldest forgotten first)


class Viewer(msgspec.Struct, frozen=True):
    """A logged-in operator: the name commands are recorded under, the project their token reaches
    ("*" for an operator), and the CSRF token of their login ("" for a bearer-token request)."""

    user: str
    project: str
    csrf: str = ""
    expires_at: float = 0.0


class Sessions:
    def __init__(self, tokens: Sequence[tuple[str, str, bytes]], ttl: float, limit: int,
                 clock: Callable[[], float]) -> None:
        # (project, operator, token) from bot/ingest/auth.py; only operators' tokens open the console
        self.tokens = [(project, user, token) for project, user, token in tokens if user]
        self.ttl, self.limit, self.clock = ttl, limit, clock
        self.live: OrderedDict[str, Viewer] = OrderedDict()
        self.failures: OrderedDict[str, list[float]] = OrderedDict()  # remote -> times of its wrong tokens

    def check_token(self, given: str) -> Viewer | None:
        """The operator whose token `given` is, or None. Constant time over every configured token."""
        try:
            raw = given.strip().encode()
        except UnicodeEncodeError:
            return None
        found = None
        for project, user, token in self.tokens:
            if hmac.compare_digest(raw, token) and found is None:
                found = Viewer(user, project)
        return found

    def login(self, viewer: Viewer) -> str:
        """A new session for `viewer`; its id (the cookie's value)."""
        sid = secrets.token_urlsafe(32)
        self.live[sid] = Viewer(viewer.user, viewer.project, secrets.token_urlsafe(24), self.clock() + self.ttl)
        while len(self.live) > self.limit:
            self.live.popitem(last=False)
        return sid

    def get(self, sid: str | None) -> Viewer | None:
        """The session's viewer while it lasts; None (and forgotten) once expired or unknown."""
        if not sid:
            return None
        v = self.live.get(sid)
        if v is None:
            return None
        if self.clock() >= v.expires_at:
            del self.live[sid]
            return None
        return v

    def logout(self, sid: str | None) -> None:
        if sid:
            self.live.pop(sid, None)

    def may_try(self, remote: str) -> float:
        """0 when `remote` may try a token now, else the seconds until it may: after `FAILURES` wrong tokens
        within `FAILURE_WINDOW` s a remote waits out the window (a guessed token gets nowhere)."""
        now = self.clock()
        times = [t for t in self.failures.get(remote, ()) if now - t < FAILURE_WINDOW]
        if times:
            self.failures[remote] = times
        else:
            self.failures.pop(remote, None)
        return FAILURE_WINDOW - (now - times[0]) if len(times) >= FAILURES else 0.0

    def failed(self, remote: str) -> None:
        self.failures.setdefault(remote, []).append(self.clock())
        self.failures.move_to_end(remote)
        while len(self.failures) > MAX_REMOTES:
            self.failures.popitem(last=False)

    def forget_expired(self) -> None:
        now = self.clock()
        for sid in [s for s, v in self.live.items() if now >= v.expires_at]:
            del self.live[sid]


def same_secret(given: str | None, expected: str) -> bool:
    """A CSRF token compared in constant time; an empty one never matches."""
    if not given or not expected:
        return False
    try:
        return hmac.compare_digest(given.encode(), expected.encode())
    except UnicodeEncodeError:
        return False


def new_token() -> str:
    return secrets.token_urlsafe(24)
