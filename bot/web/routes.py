"""The console's HTTP edge: its routes under /console on the bot's own port, the login, CSRF, the
security headers, the command box and the live stream.

Nothing here is reachable without a login (or an operator's bearer token): a page redirects to the
login form, an API call or a POST gets 401. Every POST made with the login cookie must carry the
login's CSRF token. A command goes through the one `CommandService.submit` (bot/commands/service.py)
exactly as `msmon cmd` and the chats do, so the console has the same language, permissions and audit
log: an operator not in `commands.allow` reads, but cannot pause.

The live stream is Server-Sent Events, one coroutine per open page that reads the bot's state every
`console.web.stream_interval` seconds and writes what changed: no queue per client, so a browser that
stops reading holds one pending write, and is dropped after `stream_write_timeout`. At shutdown every
stream ends within one interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

from aiohttp import web
from yarl import URL

from bot.commands.origin import Origin
from bot.commands.parse import CommandError, Parsed, parse_duration
from bot.commands.service import CommandService
from bot.config import BotConfig
from bot.receivers.render import console_url
from bot.shared import BotState
from bot.store.rows import RunRow
from bot.web import pages, views
from bot.web.session import COOKIE, CSRF_HEADER, LOGIN_COOKIE, Sessions, Viewer, new_token, same_secret
from msmon.contract.wire import MAX_ID, tag_nonfinite

log = logging.getLogger("msmon.bot")

BASE = pages.BASE
STATIC = Path(__file__).parent / "static"
_STATIC_TYPES = {"uPlot.iife.min.js": "text/javascript", "uPlot.min.css": "text/css",
                 "console.js": "text/javascript", "console.css": "text/css", "favicon.ico": "image/x-icon"}
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
_HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "X-Frame-Options": "DENY",
            "Referrer-Policy": "same-origin", "Cross-Origin-Opener-Policy": "same-origin"}
_PING = 15.0  # seconds of silence after which a stream sends a comment (proxies keep it; a gone client shows)

_BUTTONS = ("ack", "silence")  # the commands an alert's buttons send as structures
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
VIEWER = web.RequestKey("console_viewer", Viewer)


def _html(body: str, status: int = 200) -> web.Response:
    return web.Response(text=body, status=status, content_type="text/html", headers={"Cache-Control": "no-store"})


def _json(data: Any, status: int = 200) -> web.Response:
    return web.json_response(data, status=status, headers={"Cache-Control": "no-store"})


def _redirect(location: str, status: int = 303) -> web.Response:
    return web.Response(status=status, headers={"Location": location, "Cache-Control": "no-store"})


async def _form(request: web.Request) -> Any:
    """The request's form fields (none for another content type); a body that is no form: 400."""
    if request.content_type not in ("application/x-www-form-urlencoded", "multipart/form-data"):
        return {}
    try:
        return await request.post()
    except (ValueError, UnicodeDecodeError, AssertionError) as exc:
        raise web.HTTPBadRequest(reason=f"the form cannot be read: {exc}") from None


def _safe_next(path: str | None) -> str:
    """Where to go after the login: a console path of this bot, never another site, and nothing a Location
    header cannot carry (CR, LF, NUL, any control or non-ASCII character, a space)."""
    if path and (path == BASE or path.startswith(BASE + "/")) and "//" not in path and "\\" not in path and \
            len(path) <= 2048 and path.isascii() and path.isprintable() and " " not in path:
        return path
    return BASE + "/"


def _back(request: web.Request) -> str:
    """The console page a form was sent from (its same-origin Referer), else the runs page."""
    try:
        ref = URL(request.headers.get("Referer", ""))
    except ValueError:
        return BASE + "/"
    return _safe_next(ref.raw_path if ref.host == request.url.host and ref.port == request.url.port else None)


class Console:
    def __init__(self, cfg: BotConfig, state: BotState, svc: CommandService,
                 tokens: Sequence[tuple[str, str, bytes]]) -> None:
        wc = cfg.console.web
        self.cfg, self.state, self.svc, self.wc = cfg, state, svc, wc
        self.sessions = Sessions(tokens, wc.session_ttl, wc.max_sessions, state.clock)
        self.secure = (wc.public_url or "").startswith("https://")
        self.streams: set[asyncio.Task[Any]] = set()
        self.closing = asyncio.Event()
        self.static = {name: (STATIC / name).read_bytes() for name in _STATIC_TYPES}

    # -- who is asking ---------------------------------------------------------------------------------

    def viewer(self, request: web.Request) -> tuple[Viewer | None, bool]:
        """(the viewer, whether they came with a bearer token rather than the login cookie). A wrong bearer
        token counts against its address as a wrong login does (bot/web/session.py)."""
        header = request.headers.get("Authorization", "")
        if header.startswith("Bearer "):
            v = self.sessions.check_token(header[7:])
            if v is None:
                self.sessions.failed(request.remote or "?")
            return v, True
        return self.sessions.get(request.cookies.get(COOKIE)), False

    def _guessing(self, request: web.Request) -> web.Response | None:
        """429 for a bearer token from an address that sent too many wrong ones (logins included): tokens
        are not guessed through /console/api/* either."""
        if not request.headers.get("Authorization", "").startswith("Bearer "):
            return None
        wait = self.sessions.may_try(request.remote or "?")
        if not wait:
            return None
        resp = _json({"error": f"too many wrong tokens from this address: try again in {wait:.0f} s"}, 429)
        resp.headers["Retry-After"] = str(max(int(wait), 1))
        return resp

    def page(self, handler: Handler) -> Handler:
        """A page: without a login, to the login form (and back here after it)."""
        async def wrapped(request: web.Request) -> web.StreamResponse:
            limited = self._guessing(request)
            if limited is not None:
                return limited
            v, _ = self.viewer(request)
            if v is None:
                return _redirect(f"{BASE}/login?next={quote(request.rel_url.raw_path, safe='/')}", 302)
            request[VIEWER] = v
            return await handler(request)
        return wrapped

    def api(self, handler: Handler) -> Handler:
        """JSON or a POST: 401 without a login; a POST by cookie without its CSRF token: 403."""
        async def wrapped(request: web.Request) -> web.StreamResponse:
            limited = self._guessing(request)
            if limited is not None:
                return limited
            v, bearer = self.viewer(request)
            if v is None:
                return _json({"error": "log in at /console/login, or send an operator's token (Authorization: Bearer "
                                       "...)"}, 401)
            if request.method == "POST" and not bearer:
                given = request.headers.get(CSRF_HEADER)
                if given is None:
                    given = str((await _form(request)).get("csrf", ""))
                if not same_secret(given, v.csrf):
                    log.warning("msmon bot: console %s %s from %s refused: no valid CSRF token", request.method,
                                request.path, request.remote)
                    return _json({"error": "missing or wrong CSRF token: reload the page and try again"}, 403)
            request[VIEWER] = v
            return await handler(request)
        return wrapped

    # -- login -----------------------------------------------------------------------------------------

    async def login_form(self, request: web.Request) -> web.StreamResponse:
        return self._login(request.query.get("next"), "", 200)

    def _login(self, next_path: str | None, problem: str, status: int) -> web.Response:
        token = new_token()
        resp = _html(pages.login(token, _safe_next(next_path), problem), status)
        resp.set_cookie(LOGIN_COOKIE, token, path=f"{BASE}/login", httponly=True, samesite="Strict",
                        secure=self.secure, max_age=3600)
        return resp

    async def login(self, request: web.Request) -> web.StreamResponse:
        form = await _form(request)
        next_path = str(form.get("next", ""))
        if not same_secret(str(form.get("csrf", "")), request.cookies.get(LOGIN_COOKIE, "")):
            return self._login(next_path, "The login form expired: please try again.", 403)
        remote = request.remote or "?"
        wait = self.sessions.may_try(remote)
        if wait:
            resp = self._login(next_path, f"Too many wrong tokens from this address: try again in {wait:.0f} s.", 429)
            resp.headers["Retry-After"] = str(max(int(wait), 1))
            return resp
        v = self.sessions.check_token(str(form.get("token", "")))
        if v is None:
            self.sessions.failed(remote)
            log.warning("msmon bot: console login refused from %s: not an operator's token", remote)
            return self._login(next_path, "That is not an operator's token (commands.operators in bot.yaml).", 401)
        self.sessions.forget_expired()
        sid = self.sessions.login(v)
        log.info("msmon bot: %s logged in to the console from %s", v.user, request.remote)
        resp = _redirect(_safe_next(next_path))
        resp.set_cookie(COOKIE, sid, path=BASE, httponly=True, samesite="Strict", secure=self.secure,
                        max_age=int(self.wc.session_ttl))
        resp.del_cookie(LOGIN_COOKIE, path=f"{BASE}/login")
        return resp

    async def logout(self, request: web.Request) -> web.StreamResponse:
        self.sessions.logout(request.cookies.get(COOKIE))
        resp = _redirect(f"{BASE}/login")
        resp.del_cookie(COOKIE, path=BASE)
        return resp

    # -- pages -----------------------------------------------------------------------------------------

    async def runs_page(self, request: web.Request) -> web.StreamResponse:
        v = request[VIEWER]
        return _html(pages.runs_page(views.runs(self.state, v.project), v.user, v.csrf))

    async def alerts_page(self, request: web.Request) -> web.StreamResponse:
        v = request[VIEWER]
        return _html(pages.alerts_page(views.alerts(self.state, v.project), v.user, v.csrf))

    def _run(self, request: web.Request) -> RunRow | None:
        run = self.state.store.run(request.match_info["run_id"])
        return run if run is not None and views.visible(request[VIEWER].project, run) else None

    async def run_page(self, request: web.Request) -> web.StreamResponse:
        v = request[VIEWER]
        run = self._run(request)
        if run is None:
            return _html(pages.not_found(f"No run {request.match_info['run_id']!r} has reported to this bot.", v.user,
                                         v.csrf), 404)
        self.state.flush()
        return _html(pages.run_page(views.run_detail(self.state, run), v.user, v.csrf))

    # -- JSON ------------------------------------------------------------------------------------------

    async def api_runs(self, request: web.Request) -> web.StreamResponse:
        return _json({"runs": views.runs(self.state, request[VIEWER].project)})

    async def api_run(self, request: web.Request) -> web.StreamResponse:
        run = self._run(request)
        if run is None:
            return _json({"error": f"no run {request.match_info['run_id']!r}"}, 404)
        self.state.flush()
        return _json({**views.run_detail(self.state, run),
                      "series": views.series(self.state, run["run_id"], whole=bool(run["ended"] or run["gone"]))})

    async def api_alerts(self, request: web.Request) -> web.StreamResponse:
        firing = request.query.get("firing", "") in ("1", "true")
        return _json({"alerts": views.alerts(self.state, request[VIEWER].project, firing_only=firing)})

    async def command(self, request: web.Request) -> web.StreamResponse:
        """The command box (JSON {"text": ...}) and the ack / silence buttons (a form): one command through
        the command service, under the operator's name, source "console"."""
        v = request[VIEWER]
        as_json = request.content_type == "application/json"
        if as_json:
            try:
                body = await request.json()
            except (ValueError, RecursionError):
                return _json({"error": "body is not valid JSON"}, 400)
            fields = body if isinstance(body, dict) else {}
        else:
            fields = await _form(request)
        text = fields.get("text")
        origin = Origin(source="console", user=v.user)
        if fields.get("verb") in _BUTTONS and not text:
            parsed = self._button(fields, v)
            if isinstance(parsed, web.Response):
                return parsed
            answer = self.svc.submit_parsed(parsed, origin)
        elif isinstance(text, str):
            answer = self.svc.submit(text, origin)
        else:
            return _json({"error": "give the command as text, e.g. {\"text\": \"status run-42\"}, or a button's "
                                   "{\"verb\": \"ack\", \"run\": ..., \"rule\": ..., \"device\": ...}"}, 422)
        if as_json:
            return _json(tag_nonfinite({**answer.to_json(), "status": answer.status}), answer.status)
        return _html(pages.answer_page(answer.text, answer.ok, _back(request), v.user, v.csrf), answer.status)

    def _button(self, fields: Any, v: Viewer) -> Parsed | web.Response:
        """An ack or silence button's command as a structure: the alert's run, rule and device taken as they
        are (a run named `fz-a grad_norm` stays one run id), the run one this viewer may see; else a 4xx."""
        verb = str(fields.get("verb"))
        values = {k: fields.get(k) for k in ("run", "rule", "device", "duration")}
        if any(x is not None and (not isinstance(x, str) or len(x) > MAX_ID) for x in values.values()):
            return _json({"error": f"run, rule, device and duration are strings of at most {MAX_ID} characters"},
                         422)
        run_id, rule, device = values["run"] or "", values["rule"] or None, values["device"] or None
        run = self.state.store.run(run_id) if run_id else None
        if run is None or not views.visible(v.project, run):
            return _json({"error": f"no run {run_id[:80]!r}"}, 404)
        if verb == "ack":
            if rule is None:
                return _json({"error": "an ack names the alert's rule (and its device)"}, 422)
            return Parsed("ack", run=run_id, rule=rule, device=device)
        try:
            duration = parse_duration(values["duration"] or "")
        except CommandError as exc:
            return _json({"error": str(exc)}, 422)
        return Parsed("silence", run=run_id, rule=rule, duration=duration)

    # -- live updates ----------------------------------------------------------------------------------

    async def stream(self, request: web.Request) -> web.StreamResponse:
        v = request[VIEWER]
        run_id = request.query.get("run")
        if run_id is not None:
            run = self.state.store.run(run_id)
            if run is None or not views.visible(v.project, run):
                return _json({"error": f"no run {run_id!r}"}, 404)
        if len(self.streams) >= self.wc.max_streams:
            return _json({"error": f"too many live pages open ({self.wc.max_streams}, console.web.max_streams); "
                                   "close some"}, 503)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store",
                                           "X-Accel-Buffering": "no"})
        task = asyncio.current_task()
        assert task is not None
        self.streams.add(task)
        try:
            await resp.prepare(request)
            await self._feed(resp, v, run_id)
        except (asyncio.TimeoutError, ConnectionError) as exc:
            log.info("msmon bot: console stream to %s closed (%s)", request.remote,
                     "it stopped reading" if isinstance(exc, asyncio.TimeoutError) else "connection lost")
        finally:
            self.streams.discard(task)
        return resp

    async def _feed(self, resp: web.StreamResponse, v: Viewer, run_id: str | None) -> None:
        sent: dict[str, Any] = {}
        cursor: dict[str, int] = {}
        quiet = 0.0
        interval = self.wc.stream_interval
        while not self.closing.is_set():
            out: list[tuple[str, Any]] = []
            if run_id is not None:
                run = self.state.store.run(run_id)
                if run is None:
                    return
                self.state.flush()
                latest = {d: s.step for d, s in self.state.windows.latest(run_id).items()}
                if any(step < cursor.get(d, -1) for d, step in latest.items()):
                    cursor = {}  # the run went back (resumed from a checkpoint): start its curves again
                    out.append(("reset", {}))
                fresh = views.series(self.state, run_id, cursor) if any(
                    step > cursor.get(d, -1) for d, step in latest.items()) else {}
                if fresh:
                    out.append(("samples", fresh))
                    cursor.update({d: cols["steps"][-1] for d, cols in fresh.items()})
                detail = views.run_detail(self.state, run)
                for key in ("run", "alerts", "commands"):
                    if sent.get(key) != detail[key]:
                        sent[key] = detail[key]
                        out.append((key, detail[key]))
            else:
                for key, value in (("runs", views.runs(self.state, v.project)),
                                   ("alerts", views.alerts(self.state, v.project))):
                    if sent.get(key) != value:
                        sent[key] = value
                        out.append((key, value))
            if out:
                quiet = 0.0
                await asyncio.wait_for(resp.write(b"".join(_event(name, data) for name, data in out)),
                                       self.wc.stream_write_timeout)
            elif quiet >= _PING:
                quiet = 0.0
                await asyncio.wait_for(resp.write(b": ping\n\n"), self.wc.stream_write_timeout)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.closing.wait(), interval)
            quiet += interval

    def announce(self, port: int) -> None:
        """One line once the bot listens (`port`: the real one, also for --port 0): where the console is and
        who may log in, or why nobody can yet."""
        where = (self.wc.public_url or "").rstrip("/") + BASE + "/" if self.wc.public_url else \
            f"http://{self.cfg.host}:{port}{BASE}/" if self.cfg.host not in ("0.0.0.0", "::") else \
            f"http://<this host>:{port}{BASE}/"
        who = ", ".join(u for _, u, _ in self.sessions.tokens)
        if who:
            log.info("msmon bot: web console at %s (log in with an operator's token: %s)", where, who)
            return
        ops = self.cfg.commands.operators
        if not ops:
            log.warning("msmon bot: web console at %s, but nobody can log in yet: add an operator to "
                        "commands.operators in bot.yaml (user, and env or file of the token)", where)
            return
        log.warning("msmon bot: web console at %s, but nobody can log in: the token of %s is empty (%s); set it "
                    "and restart", where, ", ".join(o.user for o in ops),
                    ", ".join(f"env {o.env}" if o.env else f"file {o.file}" for o in ops))

    async def close_streams(self, app: web.Application) -> None:
        """At shutdown: every stream's loop ends now (its page reconnects to whichever bot comes up)."""
        self.closing.set()
        if self.streams:
            await asyncio.wait(list(self.streams), timeout=max(self.wc.stream_interval, 1.0) + 1.0)

    # -- the rest --------------------------------------------------------------------------------------

    async def static_file(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        if name not in self.static:
            return _json({"error": f"no static file {name!r}"}, 404)
        return web.Response(body=self.static[name], content_type=_STATIC_TYPES[name],
                            headers={"Cache-Control": "private, max-age=3600"})

    async def favicon(self, request: web.Request) -> web.StreamResponse:
        return web.Response(body=self.static["favicon.ico"], content_type="image/x-icon",
                            headers={"Cache-Control": "public, max-age=86400"})

    async def headers(self, request: web.Request, response: web.StreamResponse) -> None:
        if request.path == BASE or request.path.startswith(BASE + "/"):
            for k, val in _HEADERS.items():
                response.headers.setdefault(k, val)


def _event(name: str, data: Any) -> bytes:
    return f"event: {name}\ndata: {json.dumps(_finite(data), separators=(',', ':'))}\n\n".encode()


def _finite(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(x) for k, x in obj.items()}
    if isinstance(obj, list):
        return [_finite(x) for x in obj]
    return obj


def console_link(cfg: BotConfig) -> Callable[[str], str] | None:
    """A run's console page as chat messages link to it: when the console is on and console.web.public_url
    says where people reach the bot; else None (no link)."""
    wc = cfg.console.web
    if not wc.enabled or not wc.public_url:
        return None
    return functools.partial(console_url, wc.public_url)


async def _to_runs(request: web.Request) -> web.StreamResponse:
    return _redirect(BASE + "/", 302)


CONSOLE = web.AppKey("console", Console)


def announce_console(app: web.Application, port: int) -> None:
    """The console's line, once `app` listens on `port` (nothing when the console is off)."""
    if CONSOLE in app:
        app[CONSOLE].announce(port)


def add_console_routes(app: web.Application, cfg: BotConfig, state: BotState, svc: CommandService,
                       tokens: list[tuple[str, str, bytes]]) -> Console | None:
    """The console's routes on `app` (none when console.web.enabled is false)."""
    if not cfg.console.web.enabled:
        return None
    c = Console(cfg, state, svc, tokens)
    r = app.router
    r.add_get(BASE, _to_runs)
    r.add_get(BASE + "/", c.page(c.runs_page))
    r.add_get(BASE + "/alerts", c.page(c.alerts_page))
    r.add_get(BASE + "/runs/{run_id:.+}", c.page(c.run_page))
    r.add_get(BASE + "/login", c.login_form)
    r.add_post(BASE + "/login", c.login)
    r.add_post(BASE + "/logout", c.api(c.logout))
    r.add_post(BASE + "/commands", c.api(c.command))
    r.add_get(BASE + "/api/runs", c.api(c.api_runs))
    r.add_get(BASE + "/api/runs/{run_id:.+}", c.api(c.api_run))
    r.add_get(BASE + "/api/alerts", c.api(c.api_alerts))
    r.add_get(BASE + "/api/stream", c.api(c.stream))
    r.add_get(BASE + "/static/{name}", c.static_file)
    r.add_get("/", _to_runs)  # the bot's own address opens the console
    r.add_get("/favicon.ico", c.favicon)
    app.on_response_prepare.append(c.headers)
    app[CONSOLE] = c
    app.on_shutdown.append(c.close_streams)
    return c
