"""The HTTP service: versioned API (see docs/openapi.yaml), auth, limits, and the background tasks.

A handler decodes, authorizes, hands the request to the ingest (bot/ingest/envelope.py), the command service
(bot/commands/service.py) or the jobs' side of commands (bot/commands/jobs.py) and encodes the answer;
all of them work on the one `BotState` built here. Slack's own routes are bot/chat/slack/inbound.py.
Every malformed request gets a 4xx with a reason; a 5xx only ever means a bug (it is logged).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
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

from bot.charts.links import add_chart_route, chart_links
from bot.commands import jobs
from bot.commands.origin import Origin
from bot.commands.service import CommandService, view
from bot.config import BotConfig
from bot.delivery import nflog
from bot.delivery.digest import DigestReceiver, Digests
from bot.delivery.worker import Lane, Outbox
from bot.escalation.scheduler import AckLinks, Escalator
from bot.ingest.deadlines import read_in_time
from bot.ingest.envelope import Ingest
from bot.ingest.overload import Level, Median
from bot.ingest.runs import alias_problem, events_problem, keyed
from bot.ingest.watchdog import Watchdog
from bot.integration import Context, Integration, Task
from bot.integrations import chat_integrations
from bot.metrics import BotMetrics, project_runs
from bot.pipeline.ratelimit import RateLimiter
from bot.pipeline.schedule import Policy
from bot.ranks.missing import RULE as MISSING_RULE
from bot.ranks.watch import RankWatch
from bot.receivers import Receiver
from bot.receivers.alertmanager.inbound import ROUTE as ALERTMANAGER_ROUTE
from bot.receivers.alertmanager.inbound import add_alertmanager_route
from bot.receivers.alertmanager.receiver import interop_receivers
from bot.receivers.console import ConsoleReceiver, save_status_chart
from bot.receivers.render import escape_html
from bot.runs.devices import TooManyDevices
from bot.shared import BotState
from bot.store import open_store
from bot.store.rows import RunRow
from bot.store.sqlite import Store
from bot.web import add_console_routes, console_link
from msmon.contract.wire import (
    ActionRequest,
    Envelope,
    Event,
    Heartbeat,
    Poll,
    PollAnswer,
    Status,
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
PROJECT = web.RequestKey("project", str)
OPERATOR = web.RequestKey("operator", str)  # the operator's name; "" for a job's token


def _error(status: int, reason: str, **extra: Any) -> web.Response:
    return web.json_response({"error": reason, **extra}, status=status)


def _tokens(cfg: BotConfig) -> list[tuple[str, str, bytes]]:
    """(project, operator name or "", token) for every job and operator token configured."""
    out = []
    for secret, project, operator in [(t, t.project, "") for t in cfg.tokens] + \
            [(o, "*", o.user) for o in cfg.commands.operators]:
        value = secret.value()
        if value:
            out.append((project, operator, value.encode()))
        else:
            whose = f"operator {operator}" if operator else f"the jobs of project {project}"
            log.warning("msmon bot: the token of %s (%s) is empty or missing; it will be refused", whose,
                        f"env {secret.env}" if secret.env else f"file {secret.file}")
    return out


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
    return token_holder(request.app[TOKENS], given)


def token_holder(tokens: list[tuple[str, str, bytes]], given: bytes) -> tuple[str, str] | None:
    """(project, operator) of the token `given` (HTTP's bearer token, NATS's Msmon-Token header), or None."""
    found = None
    for project, operator, token in tokens:
        if hmac.compare_digest(given, token) and found is None:
            found = (project, operator)
    return found


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
    """(the project, the bot's key) of the job's run `run_id` (`run_owner`); a refusal is a 403, logged (no
    secret) and counted (msmon_cross_project_refused_total)."""
    token = request[PROJECT]
    problem = alias_problem(run_id)
    if problem is not None:
        raise web.HTTPUnprocessableEntity(reason=problem)
    owner, key, refusal = run_owner(request.app[STORE], token, run_id, claimed)
    if refusal is None:
        return owner, key
    route = request.match_info.route.resource.canonical if request.match_info.route.resource else request.path
    request.app[REFUSED].labels(route).inc()
    log.warning("msmon bot: REFUSED %s from %s: a token of project %r sent for run %r of project %r (%s). A job token "
                "reaches only its own project's runs: check the job's bot.token and bot.project.", route,
                request.remote, token, run_id, owner, refusal)
    raise web.HTTPForbidden(reason=refusal)


def run_owner(store: Store, token: str, run_id: str, claimed: str | None = None
              ) -> tuple[str | None, str, str | None]:
    """(project, key, None) when a token of project `token` may act on the job's run `run_id`, else (project,
    key, why not). (HTTP's `_own`, NATS's ingest.)

    The run is the project's: the one the job states (`claimed`), else the token's own; never a default. Run
    ids are the jobs' own, so two projects may use one: each has its own run, and a token of one project can
    never claim, move or read the other's (no squatting: whoever came first, the other's run is kept as
    "<run_id>@<project>", its `key` here). A token of every project (`*`) with a message that states no
    project (an older notifier) reaches the run of that id as it is; it creates none: (None, run_id, None)."""
    project = claimed if claimed is not None else token if token != "*" else None
    if token not in ("*", project):
        return project, run_id, f"this token is for project {token!r}, not {project!r} (run {run_id!r})"
    owner = store.project_of(run_id)
    if project is None:
        return owner, run_id, None
    if owner is None or owner == project:
        return project, run_id, None
    alias = f"{run_id}@{project}"
    other = store.project_of(alias)
    if other is None or other == project:
        return project, alias, None
    return project, alias, f"run ids {run_id!r} and {alias!r} both belong to other projects"


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
    run's attempt ends when every rank did (bot/ingest/runs.py)."""
    runs_ended(request.app[INGEST], beats)


def runs_ended(ingest: Ingest, beats: list[Heartbeat]) -> None:
    """`_ended` for any edge (bot/ingest/nats.py too)."""
    ingest.runs.ended(beats)


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
                                               state.store.alerts(answer.chart.run_id, "firing")) \
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


def _extra_receivers(cfg: BotConfig, receivers: dict[str, Receiver], store: Store,
                     clock: Callable[[], float]) -> dict[str, Receiver]:
    """`receivers` plus the email receiver (bot.email.host set) and the digest receiver (a route uses it)."""
    out = dict(receivers)
    e = cfg.email
    if e.host and "email" not in out:
        from bot.receivers.email import EmailReceiver

        out["email"] = EmailReceiver(e.host, e.port, e.tls, e.sender, e.timeout, e.username_env, e.password_env,
                                     e.ca_file, clock)
    if any(r.receiver == "digest" for r in cfg.routes) and "digest" not in out:
        out["digest"] = DigestReceiver(store, clock)
    return out


def _ack_links(cfg: BotConfig) -> AckLinks | None:
    key = os.environ.get(cfg.email.ack_secret_env, "")
    if cfg.email.host and cfg.email.public_url and not key:
        log.warning("msmon bot: escalation mail goes without an acknowledge link: the environment variable %s (the "
                    "key that signs the links) is empty", cfg.email.ack_secret_env)
    return AckLinks(key.encode(), cfg.email.ack_link_ttl) if key else None


def build_receivers(cfg: BotConfig, chat: list[Integration] | None = None,
                    clock: Callable[[], float] = time.time) -> dict[str, Receiver]:
    """The console, each chat platform's receiver its routes use (bot/integrations.py), and the Alertmanager and
    webhook receivers the routes use."""
    receivers: dict[str, Receiver] = {
        "console": ConsoleReceiver(cfg.console.charts_dir if cfg.console.charts else None)}
    ctx = Context(cfg, clock)
    for integration in chat if chat is not None else chat_integrations():
        receiver = integration.receiver(ctx)
        if receiver is not None:
            receivers[integration.name] = receiver
    receivers.update(interop_receivers(cfg))  # alertmanager, alertmanager_api, webhook (the routes that use them)
    return receivers


def prune_old_runs(state: BotState) -> list[str]:
    """The runs past bot.retention forgotten, a batch a pass, by one replica at a time (its lease)."""
    if not state.cfg.retention or not state.owns("retention"):
        return []
    gone = state.store.prune_runs(state.clock() - state.cfg.retention)
    if gone:
        log.info("msmon bot: forgot %d run(s) last seen more than %.0f days ago (bot.retention): %s", len(gone),
                 state.cfg.retention / 86400, ", ".join(gone[:5]) + (" ..." if len(gone) > 5 else ""))
    return gone


async def _every(period: float, fn: Callable[[], object], stop: asyncio.Event) -> None:
    while not stop.is_set():
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), period)
        try:
            fn()
        except Exception:  # noqa: BLE001 - a failed flush is retried next period; the bot keeps serving
            log.exception("msmon bot: %s failed; retrying in %.0f s", getattr(fn, "__name__", fn), period)


LAG_PERIOD = 0.05  # seconds between two samples of the backlog and of the event loop's lag
LAG_SAMPLES = 40  # the signals are the medians of the last 40 (2 s when on time): a backlog that lasts, not a burst
JOB_WORK = ("/v1/ingest", "/v1/heartbeat")  # the requests whose wait in the bot is its ingest backlog


async def watch_lag(ingest: Ingest, metrics: BotMetrics, stop: asyncio.Event, period: float = LAG_PERIOD) -> None:
    """How long the bot's own waiting work waits (and, while some waits, how late the event loop runs a timer) sets
    what the ingest sheds (bot/ingest/overload.py); a change of level is logged once, with what was shed in the last
    minute (never a line per request)."""
    loop = asyncio.get_running_loop()
    overload, lags, waits = ingest.overload, Median(LAG_SAMPLES), Median(LAG_SAMPLES)
    backlogs = overload.backlogs
    while not stop.is_set():
        t0 = loop.time()
        await asyncio.sleep(period)
        lag = lags(max(0.0, loop.time() - t0 - period))
        changed = overload.observe(waits(backlogs.age(overload.clock())), lag, backlogs.depth)
        if changed is not None:
            metrics.overload.set(int(changed))
            (log.warning if changed else log.info)("msmon bot: %s", overload.say())


def create_app(cfg: BotConfig, *, clock: Callable[[], float] = time.time,
               receivers: dict[str, Receiver] | None = None, delivery: Policy | None = None,
               escalation_period: float = 1.0) -> web.Application:
    app = web.Application(client_max_size=cfg.max_request_bytes, middlewares=[guard])
    store = open_store(cfg)  # SQLite (bot.state_path) or PostgreSQL (bot.store.url), migrated (bot/store)
    m = BotMetrics()
    state = BotState(cfg, store, m, clock)
    m.watch(state)  # per-run gauges and delivery figures at /metrics
    rl = cfg.rate_limit
    if delivery is None:
        dc = cfg.delivery
        delivery = Policy(base=dc.backoff_base, cap=dc.backoff_max, max_attempts=dc.max_attempts,
                          max_error_attempts=dc.max_error_attempts, max_retry_after=dc.max_retry_after)
    chat = chat_integrations()  # Slack, Matrix, Feishu, DingTalk, WeCom (bot/integrations.py)
    receivers = _extra_receivers(cfg, receivers or build_receivers(cfg, chat), store, clock)
    outbox = Outbox(store, receivers, RateLimiter(rl.per_channel, rl.per_run, rl.global_rate, rl.burst), m, clock,
                    policy=delivery, lane=Lane("email", only=False))
    mailbox = Outbox(store, receivers, RateLimiter(rl.per_channel, rl.per_run, rl.global_rate, rl.burst), m, clock,
                     policy=delivery, lane=Lane("email", only=True)) if "email" in receivers else None

    def ring() -> None:
        outbox.wake()
        if mailbox is not None:
            mailbox.wake()

    state.doorbell = ring
    outbox.link = console_link(cfg)  # "open in msmon": each message links to its run's console page (bot/web)
    outbox.given_up = lambda rows: nflog.given_up(state, rows)  # a dead letter's alerts are not notified
    if mailbox is not None:
        mailbox.link = outbox.link
    app[CONFIG], app[STORE], app[METRICS], app[INGEST], app[OUTBOX] = cfg, store, m, Ingest(state), outbox
    overload = app[INGEST].overload
    outbox.shedding = lambda: overload.level > Level.NORMAL  # overloaded: an ERROR's text goes without its chart
    charts_waiting = overload.backlogs["charts"]

    def chart_waits() -> Callable[[], None]:
        token = charts_waiting.enter(overload.clock())
        return lambda: charts_waiting.leave(token)

    outbox.chart_waits = chart_waits  # a chart waiting for the drawing executor is the bot's backlog too
    app[TOKENS] = _tokens(cfg)
    app[DRAINING] = asyncio.Event()
    app[REFUSED] = Counter("msmon_cross_project_refused_total", "job requests refused for another project's run, "
                           "by route", ["route"], registry=m.registry)
    svc = CommandService(state)
    app[COMMANDS], app[STATE] = svc, state
    escalator = Escalator(state, clock, period=escalation_period, links=_ack_links(cfg))
    escalator.on_ack = lambda run, rule, who, now: svc.tell_job_acked(run, rule, None, Origin(source="email", user=who),
                                                                       now)
    app[ESCALATOR] = escalator
    digests = app[DIGESTS] = Digests(state, clock)
    app.router.add_post("/v1/ingest", ingest)
    app.router.add_post("/v1/heartbeat", heartbeat)
    app.router.add_get("/v1/runs", runs)
    app.router.add_get("/v1/runs/{run_id}", run_detail)
    app.router.add_post("/v1/commands", post_command)
    app.router.add_get("/v1/commands/{command_id}", get_command)
    app.router.add_post("/v1/commands/poll", poll_commands)
    app.router.add_post("/v1/actions/request", rule_action)
    app.router.add_get("/v1/outbox/dead", dead_letters)
    ctx = Context(cfg, clock, svc)
    for integration in chat:  # each platform's way in: /slack/..., /feishu/events, /dingtalk/callback
        integration.routes(app, ctx)
    add_chart_route(app, chart_links(cfg, clock))  # GET /charts/<signed token> (bot/charts/links.py)
    add_console_routes(app, cfg, state, svc, app[TOKENS])  # the web console at /console (bot/web/)
    add_alertmanager_route(app, cfg, state, clock)
    app.router.add_get("/ack/{token}", ack_page)
    app.router.add_post("/ack/{token}", ack_link)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics)
    watchdog = Watchdog(cfg, store, app[INGEST], clock)
    def rank_event(ev: Event, project: str, labels: dict[str, str], now: float, rank: int | None = None) -> int:
        queued = app[INGEST].event(ev, project, labels, now, rank)
        if ev.rule == MISSING_RULE and ev.status is Status.FIRING:
            app[INGEST].runs.settle(ev.run_id)  # the others may have ended: the run died (bot/ingest/runs.py)
        return queued

    ranks = RankWatch(state.ranks, cfg.ranks, rank_event, store.run, clock, state.wake_outbox)  # bot/ranks

    async def background(app: web.Application) -> Any:
        chat_tasks: list[Task] = []  # Slack's Socket Mode, Matrix's /sync loop
        for integration in chat:
            task = integration.task(ctx)
            if task is not None:
                await task.start()
                chat_tasks.append(task)
        nats_in = None
        if cfg.nats.url:  # jobs' envelopes over NATS JetStream too (bot/ingest/nats.py)
            from bot.ingest.nats import NatsIngest

            nats_in = NatsIngest(cfg.nats, state, app[INGEST], lambda given: token_holder(app[TOKENS], given),
                                 lambda token, run, claimed: run_owner(store, token, run, claimed),
                                 lambda beats: runs_ended(app[INGEST], beats), svc.apply_step)
            await nats_in.start()
        stop = asyncio.Event()
        escalator.start()
        digests.start(escalator.scheduler)
        tasks = [asyncio.create_task(outbox.run(stop)), asyncio.create_task(watchdog.run(stop)),
                 asyncio.create_task(_every(60.0, lambda: prune_old_runs(state), stop)),
                 asyncio.create_task(_every(1.0, state.flush, stop)),
                 asyncio.create_task(_every(1.0, lambda: state.owns("command-expiry") and jobs.expire(state), stop)),
                 asyncio.create_task(store.listen(state.command_queued, stop))]  # other replicas' commands
        if mailbox is not None:
            tasks.append(asyncio.create_task(mailbox.run(stop)))
        if "alertmanager_api" in receivers:  # firing alerts pushed again, as Prometheus does (alertmanager/push.py)
            from bot.receivers.alertmanager.push import AlertmanagerRefresh

            refresh = AlertmanagerRefresh(state, receivers["alertmanager_api"], cfg.alertmanager.resend_interval)
            tasks.append(asyncio.create_task(refresh.run(stop)))
        if cfg.ranks.enable:
            tasks.append(asyncio.create_task(_every(cfg.ranks.period, ranks.check, stop)))
        if cfg.overload.enable:
            tasks.append(asyncio.create_task(watch_lag(app[INGEST], m, stop)))
        yield
        for task in chat_tasks:
            await task.stop()  # first: no command arrives while the rest shuts down
        if nats_in is not None:
            await nats_in.stop()  # what it took and did not commit goes to another replica after ack_wait
        escalator.stop()
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        try:
            state.flush()
        except store.Error as exc:  # the database is away at shutdown: stop all the same
            log.warning("msmon bot: stopping while the state store at %s fails (%s); the alerts' last steps held in "
                        "memory are not written (their jobs' next envelopes write them again)", store.where,
                        str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
        store.close()

    async def drain(app: web.Application) -> None:
        """Shutting down: the jobs' long polls are answered now with what is there (usually nothing) and new
        ones at once, so the bot stops in about a second instead of after the longest poll; a job polls again
        later (from this bot when it is back)."""
        app[DRAINING].set()
        polls = list(state.waiters.events)
        for run_id in polls:
            state.waiters.wake(run_id)
        log.info("msmon bot: shutting down; %d job long poll(s) answered", len(polls))

    app.on_shutdown.append(drain)
    app.cleanup_ctx.append(background)
    return app
