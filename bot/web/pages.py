"""The console's HTML, rendered on the server. Every value from a job or a user (run ids, rule names,
devices, messages, command texts) goes through `escape_html` (bot/receivers/render.py) by way of
`page()`: a template's `{name}` slots take text and escape it, only `Markup` (built here from
escaped pieces) goes in as is. No inline script or style: the page's code is /console/static/
console.js, which reads its settings from `data-` attributes, and the Content-Security-Policy
(routes.py) forbids anything else.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from bot.receivers.render import console_path, escape_html
from bot.runs.dropped import describe
from bot.web.views import CHARTS

BASE = "/console"


class Markup(str):
    """HTML already escaped (or msmon's own). Adding text to it escapes the text."""

    def __add__(self, other: str) -> Markup:
        return Markup(str.__add__(self, esc(other)))


def esc(value: Any) -> Markup:
    if isinstance(value, Markup):
        return value
    return Markup(escape_html("" if value is None else str(value)))


def page(template: str, **values: Any) -> Markup:
    """`template` with each `{name}` filled by its value, escaped unless it is Markup."""
    return Markup(template.format(**{k: esc(v) for k, v in values.items()}))


def join(parts: Iterable[Markup]) -> Markup:
    return Markup("".join(parts))


def run_href(run_id: str) -> str:
    """The run page's path; the id percent-encoded (a `/` or `?` in it stays part of the id)."""
    return console_path(run_id)


def ago(s: float | None) -> str:
    """`12 s ago`, `5 min ago`, `3.2 h ago` (by the bot's clock)."""
    if s is None:
        return "-"
    return f"{s:.0f} s ago" if s < 120 else f"{s / 60:.0f} min ago" if s < 7200 else f"{s / 3600:.1f} h ago"


_LAYOUT = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title} - msmon</title>
<link rel="stylesheet" href="{base}/static/uPlot.min.css"><link rel="stylesheet" href="{base}/static/console.css">
<script src="{base}/static/uPlot.iife.min.js" defer></script><script src="{base}/static/console.js" defer></script>
</head><body data-base="{base}" data-csrf="{csrf}">
<header><a class="brand" href="{base}/">msmon</a>{nav}</header>
<main>{body}</main>
</body></html>"""


def layout(title: str, body: Markup, user: str = "", csrf: str = "") -> Markup:
    nav = page('<nav><a href="{base}/">runs</a><a href="{base}/alerts">alerts</a>'
               '<form method="post" action="{base}/logout" class="logout"><input type="hidden" name="csrf" '
               'value="{csrf}"><span class="who">{user}</span><button type="submit">log out</button></form></nav>',
               base=BASE, csrf=csrf, user=user) if user else Markup("")
    return page(_LAYOUT, title=title, base=BASE, csrf=csrf, nav=nav, body=body)


def login(csrf: str, next_path: str, problem: str = "") -> Markup:
    body = page('<section class="login"><h1>msmon console</h1>{problem}'
                '<form method="post" action="{base}/login"><input type="hidden" name="csrf" value="{csrf}">'
                '<input type="hidden" name="next" value="{next}">'
                '<label>Operator token <input type="password" name="token" autocomplete="current-password" '
                'required autofocus></label><button type="submit">Log in</button></form>'
                '<p class="hint">The token is an operator\'s from <code>commands.operators</code> in the bot\'s '
                'bot.yaml (the one <code>msmon cmd</code> uses).</p></section>',
                base=BASE, csrf=csrf, next=next_path,
                problem=page('<p class="problem" role="alert">{p}</p>', p=problem) if problem else Markup(""))
    return layout("log in", body)


def _state_badge(r: dict[str, Any]) -> Markup:
    """The run's phase; its attempt when there was more than one (a re-run or a resume of the run id)."""
    attempt = r.get("attempt", 1)
    return page('<span class="state state-{s}">{s}{a}</span>', s=r["state"],
                a=f", attempt {attempt}" if attempt > 1 else "")


def _ended(r: dict[str, Any]) -> Markup:
    """How the run's attempt ended ("failed: while ERRORs fired: ..."), and each curve's last finite value."""
    if not r.get("end_reason"):
        return Markup("")
    last = "; ".join(f"last finite {f.replace('_', ' ')} {v['value']:.4g} at step {v['step']:,}"
                     for f, v in r.get("last_finite", {}).items())
    return page('<p class="ended state-{s}" id="run-end">{why}{last}</p>', s=r["state"], why=r["end_reason"],
                last=f" ({last})" if last else "")


def _progress(r: dict[str, Any]) -> Markup:
    if r["total_steps"]:
        return page('<progress max="{total}" value="{step}"></progress> {pct}', total=r["total_steps"],
                    step=r["step"], pct=f"{100 * (r['progress'] or 0):.0f} %")
    return Markup("")


def runs_page(rows: list[dict[str, Any]], user: str, csrf: str) -> Markup:
    trs = join(page('<tr data-run="{run}"><td><a href="{href}">{run}</a></td><td>{project}</td><td>{state}</td>'
                    '<td class="num">{step}</td><td>{progress}</td><td class="num">{firing}</td><td>{seen}</td></tr>',
                    run=r["run_id"], href=run_href(r["run_id"]), project=r["project"], state=_state_badge(r),
                    step=f"{r['step']:,}", progress=_progress(r), firing=_firing(r), seen=ago(r["seen_ago"]))
               for r in rows)
    empty = Markup("") if rows else Markup('<p class="empty">No run has reported to this bot yet. A job reports '
                                           'once its monitor_config has a <code>bot:</code> section.</p>')
    body = page('<h1>Runs</h1>{empty}<table class="runs" id="runs"><thead><tr><th>run</th><th>project</th>'
                '<th>state</th><th>step</th><th>progress</th><th>alerts firing</th><th>last report</th></tr></thead>'
                '<tbody>{trs}</tbody></table>{box}', empty=empty, trs=trs, box=command_box("", csrf))
    return layout("runs", page('<div id="page" data-page="runs">{body}</div>', body=body), user, csrf)


def _firing(r: dict[str, Any]) -> Markup:
    if not r["firing"]:
        return Markup("0")
    return page('<span class="firing{err}">{n}</span>', n=r["firing"], err=" error" if r["errors"] else "")


def alert_rows(rows: list[dict[str, Any]], csrf: str, with_run: bool) -> Markup:
    out = []
    for a in rows:
        actions = Markup("")
        if a["status"] == "firing":
            actions = page(
                '<form method="post" action="{base}/commands" class="cmd"><input type="hidden" name="csrf" '
                'value="{csrf}"><input type="hidden" name="verb" value="ack"><input type="hidden" name="run" '
                'value="{run}"><input type="hidden" name="rule" value="{rule}"><input type="hidden" name="device" '
                'value="{device}"><button type="submit">ack</button>'
                '</form><form method="post" action="{base}/commands" class="cmd silence"><input type="hidden" '
                'name="csrf" value="{csrf}"><input type="hidden" name="verb" value="silence"><input type="hidden" '
                'name="run" value="{run}"><input type="hidden" name="rule" value="{rule}"><select name="duration" '
                'aria-label="silence for"><option>30m</option><option>1h</option><option>4h</option><option>1d'
                '</option></select><button type="submit">silence</button></form>',
                base=BASE, csrf=csrf, run=a["run_id"], rule=a["rule"], device=a["device"])
        run_cell = page('<td><a href="{href}">{run}</a></td>', href=run_href(a["run_id"]), run=a["run_id"]) \
            if with_run else Markup("")
        out.append(page('<tr class="alert sev-{sev} st-{st}" data-rule="{rule}" data-device="{dev}">{run_cell}'
                        '<td>{rule}</td><td>{dev}</td><td>{sev}</td><td>{st}</td><td class="num">{first}</td>'
                        '<td class="num">{last}</td><td>{acked}</td><td class="actions">{actions}</td></tr>',
                        sev=a["severity"], st=a["status"], rule=a["rule"], dev=a["device"], run_cell=run_cell,
                        first=a["first_step"], last=a["last_step"], acked=a["acked_by"] or "", actions=actions))
    return join(out)


def alerts_table(rows: list[dict[str, Any]], csrf: str, with_run: bool) -> Markup:
    head = Markup("<th>run</th>") if with_run else Markup("")
    return page('<table class="alerts" id="alerts"><thead><tr>{head}<th>rule</th><th>device</th><th>severity</th>'
                '<th>status</th><th>from step</th><th>last step</th><th>acknowledged by</th><th></th></tr></thead>'
                '<tbody>{rows}</tbody></table>', head=head, rows=alert_rows(rows, csrf, with_run))


def alerts_page(rows: list[dict[str, Any]], user: str, csrf: str) -> Markup:
    body = page('<div id="page" data-page="alerts"><h1>Alerts</h1>{table}</div>',
                table=alerts_table(rows, csrf, with_run=True))
    return layout("alerts", body, user, csrf)


def command_rows(rows: list[dict[str, Any]]) -> Markup:
    return join(page('<tr><td>{id}</td><td>{user}</td><td><code>{text}</code></td><td>{status}</td><td>{detail}</td>'
                     '</tr>', id=c["id"], user=c["user"], text=c["text"], status=c["status"], detail=c["detail"])
                for c in rows)


def command_box(run_id: str, csrf: str) -> Markup:
    placeholder = f"status {run_id}" if run_id else "runs"
    return page('<section class="command"><h2>Command</h2><form method="post" action="{base}/commands" '
                'id="command-form" class="cmd"><input type="hidden" name="csrf" value="{csrf}">'
                '<input name="text" id="command-text" placeholder="{ph}" autocomplete="off" maxlength="4000" '
                'aria-label="command"><button type="submit">Send</button></form>'
                '<pre id="answer" aria-live="polite"></pre><p class="hint">The chat command language: '
                '<code>help</code>, <code>pause {run}</code>, <code>resume {run}</code>, <code>status {run}</code>... '
                'Same permissions and audit log as chat.</p></section>',
                base=BASE, csrf=csrf, ph=placeholder, run=run_id or "<run>")


def run_page(detail: dict[str, Any], user: str, csrf: str) -> Markup:
    r = detail["run"]
    charts = join(page('<figure class="chart" id="chart-{key}" data-key="{key}"><figcaption>{title}</figcaption>'
                       '<div class="plot"></div></figure>', key=key, title=title) for key, title, _ in CHARTS)
    eta = Markup("")
    if r["total_steps"] and r["steps_per_s"] and r["state"] == "running":
        left = max(r["total_steps"] - r["step"], 0) / r["steps_per_s"]
        eta = page(' <span class="eta">ETA {m} min</span>', m=f"{left / 60:.0f}")
    body = page(
        '<div id="page" data-page="run" data-run="{run}"><h1>Run <span class="run-id">{run}</span></h1>'
        '<p class="summary">project {project} &middot; <span id="run-state">{state}</span> &middot; step '
        '<span id="run-step">{step}</span>{progress}{eta} &middot; devices <span id="run-devices">{devices}</span>'
        '</p>{ended}{dropped}<section class="charts">{charts}</section><section><h2>Alerts</h2>{alerts}</section>{box}'
        '<section><h2>Commands</h2><table class="commands" id="commands"><thead><tr><th>id</th><th>who</th>'
        '<th>command</th><th>status</th><th>result</th></tr></thead><tbody>{cmds}</tbody></table></section></div>',
        run=r["run_id"], project=r["project"], state=_state_badge(r), step=f"{r['step']:,}",
        progress=_progress(r), eta=eta, devices=", ".join(r["devices"]), charts=charts, ended=_ended(r),
        dropped=_dropped(detail.get("dropped") or {}),
        alerts=alerts_table(detail["alerts"], csrf, with_run=False), box=command_box(r["run_id"], csrf),
        cmds=command_rows(detail["commands"]))
    return layout(f"run {r['run_id']}", body, user, csrf)


def _dropped(totals: dict[str, int]) -> Markup:
    """What the run's job dropped before the bot took it (bot/runs/dropped.py), when it reported any."""
    text = describe(totals)
    return page('<p class="dropped" id="run-dropped">{text}</p>', text=text) if text else Markup("")


def answer_page(text: str, ok: bool, back: str, user: str, csrf: str) -> Markup:
    body = page('<section><h1>{title}</h1><pre class="answer">{text}</pre><p><a href="{back}">back</a></p></section>',
                title="Done" if ok else "Not done", text=text, back=back)
    return layout("command", body, user, csrf)


def not_found(what: str, user: str, csrf: str) -> Markup:
    return layout("not found", page('<section><h1>Not found</h1><p>{what}</p><p><a href="{base}/">all runs</a></p>'
                                    '</section>', what=what, base=BASE), user, csrf)
