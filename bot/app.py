"""The bot's HTTP API (see docs/openapi.yaml): its handlers, auth and limits, and `create_app`, which serves them.

A handler decodes, authorizes, hands the request to the ingest (bot/ingest/envelope.py), the command service
(bot/commands/service.py) or the jobs' side of commands (bot/commands/jobs.py) and encodes the answer;
all of them work on the one `BotState` that bot/assembly.py builds with the rest of the bot, and its background
tasks. Slack's own routes are bot/chat/slack/inbound.py.
Every malformed request gets a 4xx with a reason; a 5xx only ever means a bug (it is logged).
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, Counter

from bot import assembly
from bot.assembly import build_receivers as build_receivers  # imported from here too (bench, tests)
from bot.assembly import prune_old_runs as prune_old_runs
from bot.charts.links import add_chart_route, chart_links
from bot.commands import jobs
from bot.commands.origin import Origin
from bot.commands.service import CommandService, view
from bot.config import BotConfig
from bot.delivery.digest import Digests
from bot.delivery.worker import Outbox
from bot.escalation.scheduler import Escalator
from bot.ingest.auth import JobAuth
from bot.ingest.deadlines import read_in_time
from bot.ingest.envelope import Ingest
from bot.ingest.runs import alias_problem, events_problem, keyed
from bot.metrics import BotMetrics, project_runs
from bot.pipeline.schedule import Policy
from bot.receivers import Receiver
from bot.receivers.alertmanager.inbound import ROUTE as ALERTMANAGER_ROUTE
from bot.receivers.alertmanager.inbound import add_alertmanager_route
from bot.receivers.console import save_status_chart
from bot.receivers.render import escape_html
from bot.runs.devices import TooManyDevices
from bot.shared import BotState
from bot.store.rows import RunRow
from bot.store.sqlite import Store
from bot.web import add_console_routes
from msmon.contract.wire import (
    ActionRequest,
    Envelope,
    Heartbeat,
    Poll,
    PollAnswer,
    decode,
    encode,
    tag_nonfinite,
)

log = logging.getLogger("msmon.bot")

INGEST = web.AppKey("ingest", Ingest)
STORE = web.AppKey("store", Store)
METRICS = web.AppKey("metrics", BotMetrics)
OUTBOX = web.AppKey("outbox", Outbox)
CONFIG = web.AppKey("config", BotConfig)
TOKENS = web.AppKey("tokens", list)
COMMANDS = web.AppKey("commands", CommandService)
STATE = web.AppKey("state", BotState)  # the one state the ingest and the command side share
ESCALATOR = web.AppKey("escalator", Escalator)
DIGESTS = web.AppKey("digests", Digests)
REFUSED = web.AppKey("refused", Counter)  # cross-project requests refused, by route
DRAINING = web.AppKey("draining", asyncio.Event)  # set on shutdown: jobs' long polls are answered at once
AUTH = web.AppKey("auth", JobAuth)  # whose a token is and whose a run is (bot/ingest/auth.py), as NATS's ingest asks
PROJECT = web.RequestKey("project", str)
OPERATOR = web.RequestKey("operator", str)  # the operator's name; "" for a job's token


def _error(status: int, reason: str, **extra: Any) -> web.Response:
    return web.json_response({"error": reason, **extra}, status=status)


def _authenticate(request: web.Request) -> tuple[str, str] | None:
    """(project, operator) of the request's bearer token, or None. Compared in constant time, with
    every configured token (no early exit that would time which one matched)."""
    header = request.headers.get("Authorization", "")
    if not header.startswith("Bearer "):
        return None
    try:
        given = header[7:].strip().encode()
    except UnicodeEncodeError:  # raw bytes that are not UTF-8: no token of ours
        return None
    return request.app[AUTH].token_holder(given)


def _job_only(request: web.Request) -> None:
    if request[OPERATOR]:
        raise web.HTTPForbidden(reason="this is an operator's token (commands.operators); jobs use a job token")


def _operator_only(request: web.Request) -> str:
    if not request[OPERATOR]:
        raise web.HTTPForbidden(reason="a job's token cannot send commands; use an operator token "
                                       "(commands.operators in bot.yaml)")
    return request[OPERATOR]


@web.middleware
async def guard(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                ) -> web.StreamResponse:
    """Every request's one middleware: the bearer token (the /v1/ API), the body read within bot.read_timeout
    (bot/ingest/deadlines.py), and the answer to whatever the handler raised; counted by endpoint and status."""
    resource = request.match_info.route.resource
    endpoint = resource.canonical if resource is not None else "unknown"
    metrics = request.app[METRICS]
    try:
        if endpoint.startswith("/v1/") and endpoint != ALERTMANAGER_ROUTE:  # Alertmanager's own credentials
            who = _authenticate(request)
            if who is None:
                resp: web.StreamResponse = _error(401, "missing or unknown bearer token (Authorization: Bearer ...)")
                metrics.request(endpoint, 401)
                return resp
            request[PROJECT], request[OPERATOR] = who
        await read_in_time(request, request.app[CONFIG].read_timeout)
        if endpoint in JOB_WORK:  # a job's message waits for the bot from here: the overload's signal
            waiting = request.app[INGEST].overload.backlogs["ingest"]
            token = waiting.enter(request.app[INGEST].overload.clock())
            try:
                resp = await handler(request)
            finally:
                waiting.leave(token)
        else:
            resp = await handler(request)
    except TooManyDevices as exc:
        resp = _error(422, str(exc))
    except web.HTTPRequestEntityTooLarge:
        resp = _error(413, f"request body over the {request.app[CONFIG].max_request_bytes} byte limit; "
                      "send smaller batches")
    except web.HTTPException as exc:
        resp = _error(exc.status, exc.reason)
        if "Allow" in exc.headers:  # a 405 says which methods the route takes
            resp.headers["Allow"] = exc.headers["Allow"]
    except request.app[STORE].Error as exc:  # the database went away or refused: not a bug of the request
        log.error("msmon bot: the state store failed on %s (%s); answered 503, the sender retries; check %s",
                  request.path, str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__,
                  request.app[STORE].where)
        resp = _error(503, "the bot's state store is unavailable; retry later")
        resp.headers["Retry-After"] = "2"
    except Exception:  # noqa: BLE001 - a bug: say so, keep serving
        log.exception("msmon bot: internal error on %s", request.path)
        resp = _error(500, "internal error (logged by the bot)")
    metrics.request(endpoint, resp.status)
    return resp


async def _body(request: web.Request, type_: Any) -> Any:
    if request.content_type != "application/json":
        raise web.HTTPUnsupportedMediaType(reason=f"expected Content-Type application/json, got {request.content_type}")
    raw = await request.read()
    if not raw:
        raise web.HTTPBadRequest(reason="empty body")
    try:
        return decode(raw, type_)
    except msgspec.ValidationError as exc:  # a subclass of DecodeError: first
        raise web.HTTPUnprocessableEntity(reason=f"does not match the schema: {exc}") from None
    except msgspec.DecodeError as exc:
        raise web.HTTPBadRequest(reason=f"body is not valid JSON: {exc}") from None


def _own(request: web.Request, run_id: str, claimed: str | None = None) -> tuple[str | None, str]:
    """(the project, the bot's key) of the job's run `run_id` (`JobAuth.run_owner`); a refusal is a 403, logged (no
    secret) and counted (msmon_cross_project_refused_total)."""
    token = request[PROJECT]
    problem = alias_problem(run_id)
    if problem is not None:
        raise web.HTTPUnprocessableEntity(reason=problem)
    owner, key, refusal = request.app[AUTH].run_owner(token, run_id, claimed)
    if refusal is None:
        return owner, key
    route = request.match_info.route.resource.canonical if request.match_info.route.resource else request.path
    request.app[REFUSED].labels(route).inc()
    log.warning("msmon bot: REFUSED %s from %s: a token of project %r sent for run %r of project %r (%s). A job token "
                "reaches only its own project's runs: check the job's bot.token and bot.project.", route,
                request.remote, token, run_id, owner, refusal)
    raise web.HTTPForbidden(reason=refusal)


async def ingest(request: web.Request) -> web.Response:
    _job_only(request)
    env: Envelope = await _body(request, Envelope)
    carried = [e.run_id for e in env.events] + [s.run_id for s in env.samples] + [a.run_id for a in env.actions] + \
        [h.run_id for h in env.heartbeats]
    if any(r != env.run_id for r in carried):
        raise web.HTTPUnprocessableEntity(reason="every event, sample, action and heartbeat must carry the "
                                                 "envelope's run_id")
    problem = events_problem(env.events)
    if problem is not None:
        raise web.HTTPUnprocessableEntity(reason=problem)
    _, key = _own(request, env.run_id, env.project)  # no await from here to the commit: nobody re-homes it between
    if key != env.run_id:  # another project's run has this id: this project's is kept under its own key
        env = keyed(env, key)
    ingest = request.app[INGEST]
    answer = ingest.envelope(env, defer=True)
    _ended(request, env.heartbeats)
    if request.app[STORE].holding:  # its run's update waits for the group commit (bot/ingest/commit.py): 202 after it
        await ingest.commits.committed()
    return web.Response(body=msgspec.json.encode(answer), status=202, content_type="application/json")


async def heartbeat(request: web.Request) -> web.Response:
    """A heartbeat on its own. One that would create a run without saying its project (an older notifier,
    with a token of every project) creates nothing: the job's first envelope does, in the project it states."""
    _job_only(request)
    hb: Heartbeat = await _body(request, Heartbeat)
    owner, key = _own(request, hb.run_id, hb.project)
    hb = msgspec.structs.replace(hb, run_id=key) if key != hb.run_id else hb
    if owner is None:
        return web.json_response({"ok": True, "recorded": False,
                                  "why": "a new run needs its project: this token is for every project and the "
                                         "heartbeat says none (the job's envelopes create the run)"}, status=202)
    request.app[INGEST].heartbeat(hb, owner)
    _ended(request, [hb])
    return web.json_response({"ok": True}, status=202)


def _ended(request: web.Request, beats: list[Heartbeat]) -> None:
    """A final heartbeat: the rank ended normally (the watchdog raises nothing for it after this); the
    run's attempt ends when every rank did (bot/ingest/runs.py); NATS's ingest does the same."""
    request.app[INGEST].runs.ended(beats)


_ACK_PAGE = ("<!doctype html><html><head><meta charset=utf-8><title>msmon: acknowledge</title></head><body>"
             "<p>{text}</p>{form}</body></html>")


MAX_ACK_TOKEN = 200  # characters of an acknowledge link's token (docs/openapi.yaml); a longer one is no link


def _not_a_link(request: web.Request) -> web.Response | None:
    """404 for a token longer than any link the bot makes, before anything reads it."""
    if len(request.match_info["token"]) <= MAX_ACK_TOKEN:
        return None
    return web.Response(text=_ACK_PAGE.format(text="Not an acknowledge link msmon made.", form=""), status=404,
                        content_type="text/html")


async def ack_page(request: web.Request) -> web.Response:
    """The email link's page: a button that POSTs (a mail scanner fetching the link acknowledges nothing)."""
    refused = _not_a_link(request)
    if refused is not None:
        return refused
    form = ('<form method="post"><button type="submit">Acknowledge: stop the escalation</button></form>')
    return web.Response(text=_ACK_PAGE.format(text="Acknowledge this msmon alert?", form=form),
                        content_type="text/html")


async def ack_link(request: web.Request) -> web.Response:
    refused = _not_a_link(request)
    if refused is not None:
        return refused
    status, text = request.app[ESCALATOR].ack_link(request.match_info["token"])
    return web.Response(text=_ACK_PAGE.format(text=escape_html(text), form=""), status=status,
                        content_type="text/html")


async def runs(request: web.Request) -> web.Response:
    """The token's project's runs, most recently seen first, `limit` a page (1 to 1000, 100 unless said);
    `next` is the cursor of the page after, null on the last."""
    limit = _limit(request, 100, 1000)
    after = _cursor(request.query.get("cursor"))
    request.app[STATE].flush()
    project = None if request[PROJECT] == "*" else request[PROJECT]
    page = request.app[STORE].runs_page(project, after, limit + 1)  # one more: is there a page after?
    more, page = len(page) > limit, page[:limit]
    return web.json_response({"runs": [_run_view(request, r) for r in page],
                              "next": _cursor_of(page[-1]["last_seen"] or 0.0, page[-1]["run_id"]) if more else None})


def _limit(request: web.Request, default: int, most: int) -> int:
    """The `limit` query parameter, 1 to `most`: anything else is a 422 saying so (never clamped)."""
    raw = request.query.get("limit")
    if raw is None:
        return default
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 7) or not 1 <= int(raw) <= most:
        raise web.HTTPUnprocessableEntity(reason=f"limit must be a whole number from 1 to {most}")
    return int(raw)


def _cursor_of(last_seen: float, run_id: str) -> str:
    return base64.urlsafe_b64encode(json.dumps([last_seen, run_id]).encode()).decode().rstrip("=")


def _cursor(raw: str | None) -> tuple[float, str] | None:
    """A page cursor as `_cursor_of` wrote it (the last run of the page before), or a 422."""
    if raw is None:
        return None
    try:
        seen, run_id = json.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))
        if len(raw) <= 1024 and isinstance(seen, (int, float)) and isinstance(run_id, str):
            return float(seen), run_id
    except (ValueError, TypeError, RecursionError):
        pass
    raise web.HTTPUnprocessableEntity(reason="cursor is not one this bot gave (the `next` of a page of runs)")


def _run_view(request: web.Request, r: RunRow, detail: bool = False) -> dict[str, Any]:
    store, windows = request.app[STORE], request.app[STATE].windows
    firing = store.alerts(r["run_id"], "firing")
    keys = ("run_id", "project", "labels", "devices", "first_seen", "last_seen", "last_step", "last_heartbeat",
            "paused", "gone", "state", "attempt", "ended", "ended_at", "end_reason")
    view: dict[str, Any] = {k: v for k, v in r.items() if k in keys}
    view["firing"] = [{"rule": a["rule"], "device": a["device"], "severity": a["severity"],
                       "since_step": a["first_step"], "acked_by": a["acked_by"]} for a in firing]
    if detail:
        view["latest"] = {dev: msgspec.to_builtins(s) for dev, s in windows.latest(r["run_id"]).items()}
        view["alerts"] = store.alerts(r["run_id"])
        view["actions"] = [msgspec.to_builtins(a) for a in windows.actions.get(r["run_id"], [])]
        view["attempts"] = store.attempts.of(r["run_id"])  # the earlier attempts' history (bot/ingest/runs.py)
    finite: dict[str, Any] = tag_nonfinite(view)
    return finite


async def run_detail(request: web.Request) -> web.Response:
    run_id = request.match_info["run_id"]
    request.app[STATE].flush()
    r = request.app[STORE].run(run_id)
    if (r is None or r["project"] != request[PROJECT]) and request[PROJECT] != "*":  # its own run of that id
        r = request.app[STORE].run(f"{run_id}@{request[PROJECT]}") or r
    if r is None or request[PROJECT] not in ("*", r["project"]):  # another project's run is not there for it
        known = [x["run_id"] for x in request.app[STORE].runs() if request[PROJECT] in ("*", x["project"])][:20]
        return _error(404, f"no run {run_id!r}", known_runs=known)
    return web.json_response(_run_view(request, r, detail=True))


async def poll_commands(request: web.Request) -> web.Response:
    """A job's long poll for its commands: answers at once when there are some, else when one is queued
    or after `wait` seconds (at most commands.long_poll)."""
    _job_only(request)
    poll: Poll = await _body(request, Poll)
    _, key = _own(request, poll.run_id, poll.project)
    wait = 0.0 if request.app[DRAINING].is_set() else min(max(poll.wait, 0.0), request.app[CONFIG].commands.long_poll)
    cmds, cursor = await jobs.long_poll(request.app[STATE], key, poll.device, poll.after, wait)
    cmds = [msgspec.structs.replace(c, run_id=poll.run_id) for c in cmds]  # the job's own name for its run
    return web.Response(body=encode(PollAnswer(commands=cmds, cursor=cursor)), content_type="application/json")


async def rule_action(request: web.Request) -> web.Response:
    """A rank of a multi-rank run asks for the configured action its rule fired (monitor_config `actions:`):
    queued as a command that every rank applies at the same step (bot/commands/jobs.py `rule_request`)."""
    _job_only(request)
    req: ActionRequest = await _body(request, ActionRequest)
    project, key = _own(request, req.run_id, req.project)
    req = msgspec.structs.replace(req, run_id=key) if key != req.run_id else req
    try:
        cmd, new = jobs.rule_request(request.app[STATE], request.app[COMMANDS].apply_step, req, project or "")
    except jobs.RuleRequestError as exc:
        answer = _error(exc.status, exc.reason)
        if exc.retry:  # the run's first report is on its way: the job asks again
            answer.headers["Retry-After"] = "1"
        return answer
    if new:
        log.warning("msmon bot: run %s: %s asks for %s: queued as %s, every rank applies it at step %d", req.run_id,
                    cmd["source"], req.action, cmd["id"], cmd["apply_step"])
    return web.json_response({"command": view(cmd), "new": new}, status=202 if new else 200)


class _CommandText(msgspec.Struct):
    text: str


async def post_command(request: web.Request) -> web.Response:
    """`msmon cmd`: one command from an operator; the answer now, the job's result later (GET its id)."""
    user = _operator_only(request)
    body: _CommandText = await _body(request, _CommandText)
    svc = request.app[COMMANDS]
    answer = svc.submit(body.text, Origin(source="cli", user=user))  # reported on the console
    out = answer.to_json()
    if answer.chart is not None:  # a status: its chart's path (null when charts are off or it failed)
        console = request.app[CONFIG].console
        state = request.app[STATE]
        out["chart"] = await save_status_chart(console.charts_dir, answer.chart, state.windows,
                                               state.firing(answer.chart.run_id)) \
            if console.charts else None
    return web.json_response(tag_nonfinite(out), status=answer.status)


async def get_command(request: web.Request) -> web.Response:
    _operator_only(request)
    cmd = request.app[STORE].commands.get(request.match_info["command_id"])
    if cmd is None:
        return _error(404, f"no command {request.match_info['command_id']!r}")
    return web.json_response(tag_nonfinite(view(cmd)))


async def healthz(request: web.Request) -> web.Response:
    store = request.app[STORE]
    return web.json_response({"ok": True, "outbox_depth": store.depth(), "dead_letters": store.dead_count(),
                              "overload": request.app[INGEST].overload.status()})


async def dead_letters(request: web.Request) -> web.Response:
    """Operators: the outbox rows given up on, newest first (what, where, how often tried, the last error)."""
    _operator_only(request)
    limit = _limit(request, 100, 1000)
    store = request.app[STORE]
    rows = [{"id": r.id, "receiver": r.receiver, "channel": r.channel, "kind": r.kind, "key": r.key,
             "run_id": r.run_id, "created_at": r.created_at, "dead_at": r.dead_at, "attempts": r.attempts,
             "error": r.error, "posted_ref": r.posted_ref} for r in store.dead_letters(limit)]
    return web.json_response({"count": store.dead_count(), "dead": rows})


async def metrics(request: web.Request) -> web.Response:
    """GET /metrics with a bearer token: the scrape token (bot.metrics_token_env), an operator's or a job
    token of every project ('*') reads every series; a project's job token its own project's runs only
    (and the bot's own series); no token: 401."""
    project = _scraper(request)
    if project is None:
        resp = _error(401, "missing or unknown bearer token: /metrics takes the scrape token "
                           "(bot.metrics_token_env), an operator's token or a job token (its project's runs)")
        resp.headers["WWW-Authenticate"] = 'Bearer realm="msmon"'
        return resp
    m, store = request.app[METRICS], request.app[STORE]
    m.outbox_depth.set(store.depth())
    m.outbox_dead.set(store.dead_count())
    runs = None if project == "*" else project_runs(store, project)
    return web.Response(body=await m.render(runs), headers={"Content-Type": CONTENT_TYPE_LATEST})


def _scraper(request: web.Request) -> str | None:
    """The project a /metrics request may read ('*': all), or None."""
    name = request.app[CONFIG].metrics_token_env
    scrape = (os.environ.get(name) or None) if name else None
    header = request.headers.get("Authorization", "")
    if scrape is not None and header.startswith("Bearer ") and \
            hmac.compare_digest(header[7:].strip().encode("utf-8", "replace"), scrape.encode()):
        return "*"
    who = _authenticate(request)
    if who is None:
        return None
    project, operator = who
    return "*" if operator else project


JOB_WORK = ("/v1/ingest", "/v1/heartbeat")  # the requests whose wait in the bot is its ingest backlog


def create_app(cfg: BotConfig, *, clock: Callable[[], float] = time.time,
               receivers: dict[str, Receiver] | None = None, delivery: Policy | None = None,
               escalation_period: float = 1.0) -> web.Application:
    """The bot as an aiohttp application: its parts built once, each with what it needs (bot/assembly.py), the
    HTTP API's routes and every platform's, the background tasks for the app's lifetime and the drain at shutdown."""
    app = web.Application(client_max_size=cfg.max_request_bytes, middlewares=[guard])
    bot = assembly.build(cfg, clock, receivers, delivery, escalation_period)
    state = bot.state
    app[CONFIG], app[STORE], app[METRICS], app[INGEST], app[OUTBOX] = cfg, state.store, state.metrics, bot.ingest, \
        bot.outbox
    app[TOKENS], app[AUTH], app[DRAINING], app[REFUSED] = bot.tokens, bot.auth, bot.draining, bot.refused
    app[COMMANDS], app[STATE], app[ESCALATOR], app[DIGESTS] = bot.svc, state, bot.escalator, bot.digests
    _add_routes(app, bot)
    app.on_shutdown.append(assembly.Drain(state, bot.draining))
    app.cleanup_ctx.append(assembly.Background(bot))
    return app


def _add_routes(app: web.Application, bot: assembly.Parts) -> None:
    """The HTTP API's routes (docs/openapi.yaml), each chat platform's way in, the charts, the web console,
    Alertmanager's webhook, the acknowledge links, /healthz and /metrics."""
    cfg, clock = bot.cfg, bot.clock
    app.router.add_post("/v1/ingest", ingest)
    app.router.add_post("/v1/heartbeat", heartbeat)
    app.router.add_get("/v1/runs", runs)
    app.router.add_get("/v1/runs/{run_id}", run_detail)
    app.router.add_post("/v1/commands", post_command)
    app.router.add_get("/v1/commands/{command_id}", get_command)
    app.router.add_post("/v1/commands/poll", poll_commands)
    app.router.add_post("/v1/actions/request", rule_action)
    app.router.add_get("/v1/outbox/dead", dead_letters)
    for integration in bot.chat:  # each platform's way in: /slack/..., /feishu/events, /dingtalk/callback
        integration.routes(app, bot.ctx)
    add_chart_route(app, chart_links(cfg, clock))  # GET /charts/<signed token> (bot/charts/links.py)
    add_console_routes(app, cfg, bot.state, bot.svc, bot.tokens)  # the web console at /console (bot/web/)
    add_alertmanager_route(app, cfg, bot.state, clock)
    app.router.add_get("/ack/{token}", ack_page)
    app.router.add_post("/ack/{token}", ack_link)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics)
