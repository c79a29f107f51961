"""A local, Slack-Web-API-compatible HTTP server for driving slack-sdk's real client in tests.

`SlackAPIServer` is an aiohttp application on 127.0.0.1 (random free port) that runs in its own
thread with its own event loop, so synchronous tests and code on any other event loop can talk to
it. Point `slack_sdk.web.async_client.AsyncWebClient(base_url=server.base_url)` at it; nothing
goes to slack.com.

Implemented methods (Slack's response shapes): auth.test, chat.postMessage, chat.update,
files.getUploadURLExternal, the upload URL it hands out (recorded as method "upload"),
files.completeUploadExternal, and response URLs (`response_url(name)` hands one out, as Slack
does with each slash command or button click; POSTs to it are recorded as method "response").
Every request is recorded, in order, in `calls`; `fail()` injects HTTP 429 (with Retry-After)
or 500/503 answers for the next N calls to a method; `slow()` makes a method answer late.

Socket Mode (for slack-sdk's SocketModeClient): apps.connections.open (app-level `xapp-` token only,
as on Slack) hands out `ws://127.0.0.1:PORT/socket-mode/<id>`; a client connecting there gets Slack's
`hello`, then whatever `push(type, payload)` sends (an envelope with a fresh envelope_id, to every
connected client) and `socket_disconnect()` (Slack's "refresh_requested" notice; the client reconnects
through a new apps.connections.open). The acks clients send back ({"envelope_id", "payload"?}) are kept
in `socket_acks()`; `wait_for` wakes on them as on requests. Pings are answered with pongs (aiohttp's
autoping), as Slack does.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import itertools
import json
import socket
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from aiohttp import WSCloseCode, WSMsgType, web

from tests.fakes.helpers import patience

UPLOAD = "upload"  # the method name under which POSTs to an upload URL are recorded
RESPONSE = "response"  # ... and POSTs to a response_url
CONNECTIONS_OPEN = "apps.connections.open"  # the Socket Mode method; the only one that takes an app-level token

# Parameters that slack-sdk may send as JSON text inside a form (or that callers pass as strings).
_JSON_PARAMS = ("blocks", "attachments", "files", "metadata", "user_auth_blocks")

_ERROR_BODIES = {429: "ratelimited", 500: "internal_error", 503: "service_unavailable"}

TEAM = {
    "url": "https://msmon-test.slack.com/",
    "team": "msmon-test",
    "user": "msmon",
    "team_id": "T0MSMON01",
    "user_id": "U0MSMON01",
    "bot_id": "B0MSMON01",
    "is_enterprise_install": False,
}
APP_ID = "A0MSMON01"  # the app whose app-level token opens Socket Mode connections (Slack's hello names it)


@dataclass(frozen=True)
class Call:
    """One request the server answered.

    method: Slack method name ("chat.postMessage", ...; "upload" for the upload URL).
    params: query + body parameters merged, JSON-in-form values (blocks, attachments, files,
        metadata) decoded to Python objects; for "upload": {"file_id", "size"}.
    time: time.monotonic() when the request arrived.
    http_status: the HTTP status answered (200, or the injected 429/500/503).
    failed: True when the answer was an injected failure from `fail()`.
    ok: the "ok" of the JSON answer (True for a successful upload).
    error: the Slack error string when ok is False, else None.
    token: the bearer token sent, or None.
    http_method, content_type: of the request.
    response: the JSON body answered (None for "upload").
    """

    method: str
    params: dict[str, Any]
    time: float
    http_status: int = 200
    failed: bool = False
    ok: bool = True
    error: str | None = None
    token: str | None = None
    http_method: str = "POST"
    content_type: str = ""
    response: dict[str, Any] | None = None


@dataclass
class _Failure:
    status: int
    retry_after: int | None
    body: str | None = None  # answered as is (an HTML or plain-text error page) instead of Slack's JSON
    content_type: str = "text/html"
    when: Callable[[dict[str, Any]], bool] | None = None  # only calls whose params match (others pass)


@dataclass
class _PendingFile:
    file_id: str
    filename: str
    length: int | None
    alt_txt: str | None = None
    snippet_type: str | None = None
    content: bytes | None = None
    params: dict[str, Any] = field(default_factory=dict)


class SlackAPIServer:
    """Loopback Slack Web API. Use `with SlackAPIServer() as s:` or start()/stop()."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self._port: int | None = None
        self._lock = threading.Condition(threading.RLock())
        self._calls: list[Call] = []
        self._failures: dict[str, deque[_Failure]] = {}
        self._delays: dict[str, float] = {}  # method -> seconds its answers wait (slow())
        self._messages: list[dict[str, Any]] = []  # chat.postMessage params + ts, in order
        self._store: dict[tuple[str, str], dict[str, Any]] = {}  # (channel, ts) -> current message
        self._updates: list[dict[str, Any]] = []
        self._pending: dict[str, _PendingFile] = {}
        self._uploads: list[dict[str, Any]] = []
        self._ts_counter = itertools.count(1)
        self._file_counter = itertools.count(1)
        # Socket Mode. _sockets is only mutated on the server thread, under the lock so others can count it.
        self._socket_ids: set[str] = set()  # connection ids apps.connections.open handed out
        self._sockets: list[web.WebSocketResponse] = []  # open connections that have had their hello
        self._sockets_accepted = 0  # connections ever opened (a reconnect makes it grow)
        self._acks: list[dict[str, Any]] = []  # what clients sent back, in order
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None

    # -- lifecycle -----------------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("SlackAPIServer is not started")
        return self._port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """For AsyncWebClient(base_url=...): ends in "/api/"."""
        return f"{self.url}/api/"

    def start(self) -> SlackAPIServer:
        if self._thread is not None:
            raise RuntimeError("SlackAPIServer already started")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, 0))
        self._port = sock.getsockname()[1]
        ready = threading.Event()
        errors: list[BaseException] = []
        loop = asyncio.new_event_loop()
        self._loop = loop

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self._serve(sock))
            except BaseException as e:  # reported to start()'s caller
                errors.append(e)
                sock.close()
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

        self._thread = threading.Thread(target=run, name=f"slack-api-{self._port}", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("SlackAPIServer did not start within 10 s")
        if errors:
            self._thread.join(5)
            self._thread = None
            raise errors[0]
        return self

    async def _serve(self, sock: socket.socket) -> None:
        app = web.Application(client_max_size=1024**3)
        app.router.add_route("*", "/api/{method}", self._handle_api)
        app.router.add_post("/upload/v1/{file_id}", self._handle_upload)
        app.router.add_post("/response/{name}", self._handle_response)
        app.router.add_get("/socket-mode/{conn_id}", self._handle_socket)
        app.on_shutdown.append(self._close_sockets)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        await web.SockSite(self._runner, sock).start()

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        if self._runner is not None:
            fut = asyncio.run_coroutine_threadsafe(self._runner.cleanup(), loop)
            with contextlib.suppress(Exception):  # best effort on shutdown
                fut.result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        self._thread = None
        self._loop = None
        self._runner = None

    def __enter__(self) -> SlackAPIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def response_url(self, name: str = "r1") -> str:
        """A response URL like the one Slack sends with a slash command or an interaction."""
        return f"{self.url}/response/{name}"

    def responses(self, name: str | None = None) -> list[dict[str, Any]]:
        """JSON bodies POSTed to response URLs (with "_name" added), in order."""
        return [dict(c.params, _name=c.params.get("_name")) for c in self.calls_to(RESPONSE)
                if name is None or c.params.get("_name") == name]

    # -- Socket Mode (thread-safe; call from any thread but the server's) ------------------------

    def push(self, type: str, payload: dict[str, Any], *, accepts_response_payload: bool = True,
             timeout: float = 10.0) -> str:
        """Send a Socket Mode envelope to every connected client, as Slack does; return its envelope_id.

        type: "slash_commands", "interactive", "events_api", ...; payload: what Slack puts in it (a slash
        command's form fields, an interaction's JSON payload). Waits up to `timeout` for a client to be
        connected (its hello sent), so a push right after the client's connect() does not race it;
        RuntimeError when none connects in time.
        """
        envelope_id = str(uuid.uuid4())
        self._send_socket({"envelope_id": envelope_id, "type": type, "payload": copy.deepcopy(payload),
                           "accepts_response_payload": accepts_response_payload}, timeout)
        return envelope_id

    def socket_disconnect(self, reason: str = "refresh_requested", timeout: float = 10.0) -> None:
        """Tell connected clients to reconnect, as Slack does every few hours (or before a server restart)."""
        self._send_socket({"type": "disconnect", "reason": reason, "debug_info": {"host": "applink-msmon-test"}},
                          timeout)

    def socket_acks(self) -> list[dict[str, Any]]:
        """The acks clients sent ({"envelope_id", "payload"?}, as sent), in order."""
        with self._lock:
            return copy.deepcopy(self._acks)

    def socket_ack(self, envelope_id: str) -> dict[str, Any] | None:
        """The first ack for `envelope_id`, or None (yet)."""
        with self._lock:
            return next((copy.deepcopy(a) for a in self._acks if a.get("envelope_id") == envelope_id), None)

    def socket_connections(self) -> int:
        """Socket Mode connections open now (hello sent, not closed)."""
        with self._lock:
            return len(self._sockets)

    def socket_connections_accepted(self) -> int:
        """Socket Mode connections opened since start (a reconnect adds one)."""
        with self._lock:
            return self._sockets_accepted

    def _send_socket(self, message: dict[str, Any], timeout: float) -> None:
        loop = self._loop
        if loop is None or self._thread is None:
            raise RuntimeError("SlackAPIServer is not started")
        if threading.current_thread() is self._thread:
            raise RuntimeError("push/socket_disconnect block; call them from another thread than the server's")
        if not self.wait_for(lambda s: bool(s._sockets), timeout):
            raise RuntimeError(f"no Socket Mode client connected within {timeout} s")
        sent = asyncio.run_coroutine_threadsafe(self._send_all(json.dumps(message)), loop).result(timeout)
        if not sent:
            raise RuntimeError("the Socket Mode client disconnected before the message could be sent")

    async def _send_all(self, text: str) -> int:
        with self._lock:
            sockets = list(self._sockets)
        sent = 0
        for ws in sockets:
            if not ws.closed:
                with contextlib.suppress(ConnectionError):
                    await ws.send_str(text)
                    sent += 1
        return sent

    async def _handle_socket(self, request: web.Request) -> web.StreamResponse:
        with self._lock:
            known = request.match_info["conn_id"] in self._socket_ids
        if not known:  # only URLs that apps.connections.open handed out
            return web.Response(status=404, text="unknown Socket Mode connection")
        ws = web.WebSocketResponse()  # autoping: the client's pings get pongs, as from Slack
        await ws.prepare(request)
        with self._lock:
            n = len(self._sockets) + 1
        await ws.send_json({"type": "hello", "num_connections": n,
                            "debug_info": {"host": "applink-msmon-test", "build_number": 1,
                                           "approximate_connection_time": 18060},
                            "connection_info": {"app_id": APP_ID}})
        with self._lock:  # registered after the hello, so a push never overtakes it
            self._sockets.append(ws)
            self._sockets_accepted += 1
            self._lock.notify_all()
        try:
            async for msg in ws:
                if msg.type != WSMsgType.TEXT:
                    continue
                try:
                    data = json.loads(msg.data)
                except ValueError:
                    continue  # Slack ignores what it cannot parse
                if isinstance(data, dict) and "envelope_id" in data:
                    with self._lock:
                        self._acks.append(data)
                        self._lock.notify_all()
        finally:
            with self._lock:
                self._sockets.remove(ws)
                self._lock.notify_all()
        return ws

    async def _close_sockets(self, app: web.Application) -> None:
        """On stop: close open connections (their handlers would otherwise hold the shutdown)."""
        with self._lock:
            sockets = list(self._sockets)
        for ws in sockets:
            with contextlib.suppress(Exception):  # best effort on shutdown
                await ws.close(code=WSCloseCode.GOING_AWAY, message=b"server shutdown")

    # -- failure injection ---------------------------------------------------------------------

    def fail(self, method: str, status: int = 429, times: int = 1, retry_after: int | None = 1,
             body: str | None = None, content_type: str = "text/html",
             when: Callable[[dict[str, Any]], bool] | None = None) -> None:
        """Answer the next `times` calls to `method` with HTTP `status`.

        429 carries `Retry-After: retry_after` (omit with retry_after=None); other statuses carry it only
        when `body` is given (a proxy's 503 page may). `body`: answer this text with `content_type`
        instead of Slack's JSON error (the HTML or plain-text page a load balancer sends on a 5xx).
        `when(params)`: fail only the calls it is true for (one poison message while others pass).
        The attempts are recorded in `calls` with failed=True and change no state.
        """
        with self._lock:
            q = self._failures.setdefault(method, deque())
            for _ in range(times):
                q.append(_Failure(status, retry_after if status == 429 or body is not None else None, body,
                                  content_type, when))

    def slow(self, method: str, seconds: float) -> None:
        """Answer every later call to `method` ("upload" for the upload URL) `seconds` late (Slack on a bad day).
        The call is recorded when it arrives (`time`); its answer leaves `seconds` later. 0: at once again."""
        with self._lock:
            self._delays[method] = seconds

    async def _delay(self, method: str) -> None:
        with self._lock:
            seconds = self._delays.get(method, 0.0)
        if seconds > 0:
            await asyncio.sleep(seconds)

    def pending_failures(self, method: str) -> int:
        with self._lock:
            return len(self._failures.get(method, ()))

    # -- records (all return copies; safe from any thread) -------------------------------------

    @property
    def calls(self) -> list[Call]:
        with self._lock:
            return list(self._calls)

    def calls_to(self, method: str) -> list[Call]:
        with self._lock:
            return [c for c in self._calls if c.method == method]

    def messages(self, channel: str | None = None) -> list[dict[str, Any]]:
        """Successful chat.postMessage params in order, each with "ts" (and "channel") added."""
        with self._lock:
            return [copy.deepcopy(m) for m in self._messages if channel is None or m.get("channel") == channel]

    def message(self, ts: str, channel: str | None = None) -> dict[str, Any] | None:
        """The message as it stands now (updates applied): channel, ts, text, blocks, attachments, thread_ts,
        edited (number of updates applied)."""
        with self._lock:
            for (ch, mts), m in self._store.items():
                if mts == ts and (channel is None or ch == channel):
                    return copy.deepcopy(m)
            return None

    def updates(self) -> list[dict[str, Any]]:
        """Successful chat.update params in order."""
        with self._lock:
            return copy.deepcopy(self._updates)

    def uploads(self) -> list[dict[str, Any]]:
        """Completed uploads (one per file per files.completeUploadExternal), in order.

        Keys: file_id, filename, title, size (bytes received), length (declared), content (bytes),
        channel (channel_id or first of channels), channels (list), initial_comment, thread_ts, alt_txt.
        """
        with self._lock:
            return copy.deepcopy(self._uploads)

    def wait_for(self, predicate: Callable[[SlackAPIServer], bool], timeout: float = 5.0) -> bool:
        """Block until predicate(self) is true (re-checked after every request and Socket Mode ack or
        connection change); False after timeout x patience() seconds."""
        deadline = time.monotonic() + timeout * patience()
        with self._lock:
            while not predicate(self):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(min(left, 0.1))
            return True

    def reset(self) -> None:
        """Forget calls, messages, uploads, Socket Mode acks and pending failures (open connections stay)."""
        with self._lock:
            self._calls.clear()
            self._failures.clear()
            self._messages.clear()
            self._store.clear()
            self._updates.clear()
            self._pending.clear()
            self._uploads.clear()
            self._acks.clear()

    # -- HTTP ----------------------------------------------------------------------------------

    def _record(self, call: Call) -> None:
        with self._lock:
            self._calls.append(call)
            self._lock.notify_all()

    def _take_failure(self, method: str, params: dict[str, Any] | None = None) -> _Failure | None:
        with self._lock:
            q = self._failures.get(method, deque())
            for f in q:
                if f.when is None or (params is not None and f.when(params)):
                    q.remove(f)
                    return f
            return None

    @staticmethod
    async def _params(request: web.Request) -> dict[str, Any]:
        params: dict[str, Any] = dict(request.query)
        if request.method in ("POST", "PUT") and request.can_read_body:
            ctype = request.content_type
            if ctype == "application/json":
                body = await request.json()
                if isinstance(body, dict):
                    params.update(body)
            elif ctype in ("application/x-www-form-urlencoded", "multipart/form-data"):
                form = await request.post()
                for k, fv in form.items():
                    params[k] = fv.file.read() if isinstance(fv, web.FileField) else fv
            else:
                raw = await request.read()
                if raw:
                    params["_body"] = raw
        for k in _JSON_PARAMS:
            v = params.get(k)
            if isinstance(v, str):
                with contextlib.suppress(ValueError):
                    params[k] = json.loads(v)
        return params

    @staticmethod
    def _token(request: web.Request) -> str | None:
        auth = request.headers.get("Authorization", "")
        if auth.startswith("Bearer "):
            return auth[len("Bearer ") :].strip() or None
        return None

    def _fail_now(self, base: dict[str, Any], f: _Failure) -> web.Response:
        """Record an injected failure and answer it."""
        error = _ERROR_BODIES.get(f.status, "fatal_error")
        body = {"ok": False, "error": error}
        self._record(Call(**base, http_status=f.status, failed=True, ok=False, error=error, response=body))
        headers = {"Retry-After": str(f.retry_after)} if f.retry_after is not None else {}
        if f.body is not None:
            return web.Response(text=f.body, status=f.status, headers=headers, content_type=f.content_type)
        return web.json_response(body, status=f.status, headers=headers)

    async def _handle_api(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        now = time.monotonic()
        params = await self._params(request)
        token = self._token(request)
        base: dict[str, Any] = {
            "method": method,
            "params": params,
            "time": now,
            "token": token,
            "http_method": request.method,
            "content_type": request.content_type,
        }
        failure = self._take_failure(method, params)
        if failure is not None:
            return self._fail_now(base, failure)
        if method == CONNECTIONS_OPEN and token is not None and not token.startswith("xapp-"):
            body: dict[str, Any] = {"ok": False, "error": "not_allowed_token_type"}  # Slack's answer to a bot token
        elif token is None or not token.startswith("xapp-" if method == CONNECTIONS_OPEN else "xoxb-"):
            body = {"ok": False, "error": "not_authed"}
        else:
            handler = self._methods.get(method)
            body = handler(self, params) if handler else {"ok": False, "error": "unknown_method"}
        self._record(Call(**base, ok=bool(body.get("ok")), error=body.get("error"), response=copy.deepcopy(body)))
        await self._delay(method)
        return web.json_response(body)

    async def _handle_upload(self, request: web.Request) -> web.Response:
        file_id = request.match_info["file_id"]
        now = time.monotonic()
        data = await request.read()
        base: dict[str, Any] = {
            "method": UPLOAD,
            "params": {"file_id": file_id, "size": len(data)},
            "time": now,
            "token": self._token(request),
            "http_method": request.method,
            "content_type": request.content_type,
        }
        failure = self._take_failure(UPLOAD)
        if failure is not None:
            return self._fail_now(base, failure)
        with self._lock:
            pending = self._pending.get(file_id)
            if pending is not None:
                pending.content = data
        if pending is None:
            self._record(Call(**base, http_status=404, ok=False, error="file_not_found"))
            return web.Response(status=404, text="Not Found - unknown upload", content_type="text/plain")
        self._record(Call(**base))
        await self._delay(UPLOAD)
        return web.Response(text=f"OK - {len(data)}", content_type="text/plain")

    # -- Slack methods (called on the server thread; take the lock for state) ------------------

    async def _handle_response(self, request: web.Request) -> web.Response:
        params = await self._params(request)
        params["_name"] = request.match_info["name"]
        failure = self._take_failure(RESPONSE)
        if failure is not None:
            self._record(Call(RESPONSE, params, time.monotonic(), failure.status, True, False, "injected", None))
            return web.Response(status=failure.status, text=_ERROR_BODIES.get(failure.status, "error"))
        self._record(Call(RESPONSE, params, time.monotonic(), 200, False, True, None, None))
        return web.Response(text="ok")

    def _next_ts(self) -> str:
        micros = 1_700_000_000_000_000 + next(self._ts_counter) * 100
        return f"{micros // 1_000_000}.{micros % 1_000_000:06d}"

    def _auth_test(self, params: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True, **TEAM}

    def _post_message(self, params: dict[str, Any]) -> dict[str, Any]:
        channel = params.get("channel")
        if not channel:
            return {"ok": False, "error": "channel_not_found"}
        if not any(params.get(k) for k in ("text", "blocks", "attachments", "markdown_text")):
            return {"ok": False, "error": "no_text"}
        with self._lock:
            ts = self._next_ts()
            msg: dict[str, Any] = {
                "type": "message",
                "user": TEAM["user_id"],
                "bot_id": TEAM["bot_id"],
                "text": params.get("text", ""),
                "ts": ts,
                "channel": channel,
                "edited": 0,
            }
            for k in ("blocks", "attachments", "thread_ts", "metadata"):
                if k in params:
                    msg[k] = copy.deepcopy(params[k])
            self._store[(channel, ts)] = msg
            self._messages.append({**copy.deepcopy(params), "ts": ts, "channel": channel})
            echo = {k: v for k, v in msg.items() if k not in ("channel", "edited")}
        return {"ok": True, "channel": channel, "ts": ts, "message": copy.deepcopy(echo)}

    def _update(self, params: dict[str, Any]) -> dict[str, Any]:
        channel, ts = params.get("channel"), params.get("ts")
        if not channel:
            return {"ok": False, "error": "channel_not_found"}
        with self._lock:
            msg = self._store.get((channel, str(ts)))
            if msg is None:
                return {"ok": False, "error": "message_not_found"}
            for k in ("text", "blocks", "attachments", "metadata"):
                if k in params:
                    msg[k] = copy.deepcopy(params[k])
            msg["edited"] += 1
            self._updates.append(copy.deepcopy(params))
            echo = {k: copy.deepcopy(v) for k, v in msg.items() if k not in ("channel", "ts", "edited")}
            text = msg.get("text", "")
        return {"ok": True, "channel": channel, "ts": ts, "text": text, "message": echo}

    def _connections_open(self, params: dict[str, Any]) -> dict[str, Any]:
        conn_id = uuid.uuid4().hex
        with self._lock:
            self._socket_ids.add(conn_id)
        return {"ok": True, "url": f"ws://{self.host}:{self.port}/socket-mode/{conn_id}"}

    def _get_upload_url(self, params: dict[str, Any]) -> dict[str, Any]:
        filename = params.get("filename")
        length = params.get("length")
        if not filename:
            return {"ok": False, "error": "invalid_arguments"}
        try:
            length_i = int(length) if length is not None else None
        except (TypeError, ValueError):
            return {"ok": False, "error": "invalid_arguments"}
        with self._lock:
            file_id = f"F{next(self._file_counter):08d}"
            self._pending[file_id] = _PendingFile(
                file_id=file_id,
                filename=str(filename),
                length=length_i,
                alt_txt=params.get("alt_txt"),
                snippet_type=params.get("snippet_type"),
                params=copy.deepcopy(params),
            )
        return {"ok": True, "upload_url": f"{self.url}/upload/v1/{file_id}", "file_id": file_id}

    def _complete_upload(self, params: dict[str, Any]) -> dict[str, Any]:
        files = params.get("files")
        if not isinstance(files, list) or not files:
            return {"ok": False, "error": "invalid_arguments"}
        channel_id = params.get("channel_id")
        channels_raw = params.get("channels")
        channels = [c for c in str(channels_raw).split(",") if c] if channels_raw else []
        if channel_id and channel_id not in channels:
            channels.insert(0, channel_id)
        out: list[dict[str, Any]] = []
        with self._lock:
            pendings = []
            for f in files:
                p = self._pending.get(str(f.get("id"))) if isinstance(f, dict) else None
                if p is None or p.content is None:
                    return {"ok": False, "error": "file_not_found"}
                pendings.append((f, p))
            for f, p in pendings:
                del self._pending[p.file_id]
                title = f.get("title") or p.filename
                self._uploads.append(
                    {
                        "file_id": p.file_id,
                        "filename": p.filename,
                        "title": title,
                        "size": len(p.content or b""),
                        "length": p.length,
                        "content": p.content,
                        "channel": channels[0] if channels else None,
                        "channels": list(channels),
                        "initial_comment": params.get("initial_comment"),
                        "thread_ts": params.get("thread_ts"),
                        "alt_txt": p.alt_txt,
                    }
                )
                out.append(
                    {
                        "id": p.file_id,
                        "name": p.filename,
                        "title": title,
                        "size": len(p.content or b""),
                        "channels": list(channels),
                        "user": TEAM["user_id"],
                        "url_private": f"{self.url}/files/{p.file_id}/{p.filename}",
                    }
                )
        return {"ok": True, "files": out}

    _methods: dict[str, Callable[[SlackAPIServer, dict[str, Any]], dict[str, Any]]] = {
        "auth.test": _auth_test,
        CONNECTIONS_OPEN: _connections_open,
        "chat.postMessage": _post_message,
        "chat.update": _update,
        "files.getUploadURLExternal": _get_upload_url,
        "files.completeUploadExternal": _complete_upload,
    }
