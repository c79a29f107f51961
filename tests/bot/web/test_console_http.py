"""The web console over HTTP against the real bot on loopback: nothing without a login, the login form
and its cookie, CSRF on every POST, job data rendered inert, the command service's permissions, and
the live stream's bounds (a client that stops reading is dropped; shutdown ends the streams)."""

from __future__ import annotations

import http.client
import json
import re
import socket
import time
from typing import Any
from urllib.parse import quote, urlencode

import pytest

pytest.importorskip("aiohttp")

from msmon.contract.wire import Sample  # noqa: E402
from tests.fakes.bot_server import BotServer, wait_for  # noqa: E402
from tests.fakes.records import envelope, event  # noqa: E402

XSS_RUN = '<script>alert("run")</script>'
XSS_RULE = '<img src=x onerror=alert(1)>'


class Client:
    """A browser's side of the console: a cookie jar, no redirect followed."""

    def __init__(self, bot: BotServer) -> None:
        self.port = bot.port
        self.cookies: dict[str, str] = {}

    def __call__(self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
                 ) -> tuple[int, dict[str, str], str, list[str]]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        h = dict(headers or {})
        if self.cookies:
            h["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        conn.request(method, path, body=body, headers=h)
        resp = conn.getresponse()
        raw = resp.read().decode()
        set_cookies = resp.msg.get_all("Set-Cookie") or []
        for c in set_cookies:
            name, _, rest = c.partition("=")
            value = rest.split(";")[0]
            if value in ('""', "") or "Max-Age=0" in c:
                self.cookies.pop(name, None)
            else:
                self.cookies[name] = value
        conn.close()
        return resp.status, {k: v for k, v in resp.getheaders()}, raw, set_cookies

    def form(self, path: str, fields: dict[str, str], headers: dict[str, str] | None = None) -> Any:
        return self("POST", path, urlencode(fields).encode(),
                    {"Content-Type": "application/x-www-form-urlencoded", **(headers or {})})

    def login(self, token: str) -> tuple[int, dict[str, str], str, list[str]]:
        _, _, page, _ = self("GET", "/console/login")
        csrf = re.search(r'name="csrf" value="([^"]+)"', page)
        assert csrf, page
        return self.form("/console/login", {"csrf": csrf.group(1), "token": token, "next": "/console/"})

    def csrf(self) -> str:
        _, _, page, _ = self("GET", "/console/")
        m = re.search(r'data-csrf="([^"]+)"', page)
        assert m, page
        return m.group(1)


@pytest.fixture
def bot(tmp_path, monkeypatch, bot_server):
    monkeypatch.setenv("MSMON_TEST_TOKEN", "job-token")
    monkeypatch.setenv("ALICE_TOKEN", "alice-token")
    monkeypatch.setenv("VIEWER_TOKEN", "viewer-token")
    b = bot_server({"bot": {
        "port": 0, "state_path": str(tmp_path / "bot.sqlite"),
        "tokens": [{"project": "llm", "env": "MSMON_TEST_TOKEN"}],
        "console": {"charts_dir": str(tmp_path / "charts"), "charts": False,
                    "web": {"stream_interval": 0.1, "stream_write_timeout": 1.0}},
        "pipeline": {"group_wait": 0},
        "commands": {"operators": [{"user": "cli:alice", "env": "ALICE_TOKEN"},
                                   {"user": "cli:viewer", "env": "VIEWER_TOKEN"}],
                     "allow": [{"project": "llm", "users": ["cli:alice"]}]}}})
    yield b


def report(bot: BotServer, run: str = "run-42", rule: str = "grad_norm", steps: range = range(1, 31)) -> None:
    samples = [Sample(run_id=run, device="0", step=s, time=time.time(), loss=3.0 - s / 100, learning_rate=1e-3,
                      grad_norm=1.0, samples_per_s=250.0) for s in steps]
    code, body = bot.request("POST", "/v1/ingest", envelope([event(run=run, rule=rule, step=steps[-1])], run=run,
                                                             samples=samples))
    assert code == 202, body


ROUTES = [("GET", "/console/"), ("GET", "/console/alerts"), ("GET", "/console/runs/run-42")]
API = [("GET", "/console/api/runs"), ("GET", "/console/api/runs/run-42"), ("GET", "/console/api/alerts"),
       ("GET", "/console/api/stream?run=run-42"), ("POST", "/console/commands"), ("POST", "/console/logout")]


def test_nothing_without_a_login(bot):
    report(bot)
    c = Client(bot)
    for method, path in ROUTES:
        code, headers, _, _ = c(method, path)
        assert code == 302 and headers["Location"].startswith("/console/login?next="), (path, code)
    for method, path in API:
        code, _, body, _ = c(method, path, b'{"text": "pause run-42"}', {"Content-Type": "application/json"})
        assert code == 401 and "log in" in body, (path, code, body)
    # a job's token is no operator's: it opens nothing, and does not log in
    for method, path in API[:3]:
        code, _, _, _ = c(method, path, headers={"Authorization": "Bearer job-token"})
        assert code == 401
    code, _, page, _ = c.login("job-token")
    assert code == 401 and "not an operator" in page and "msmon_console" not in c.cookies
    assert bot.store.commands.recent() == []  # nothing reached the command service


def test_login_sets_a_strict_http_only_cookie_and_logout_ends_it(bot):
    c = Client(bot)
    code, headers, _, set_cookies = c.login("alice-token")
    assert code == 303 and headers["Location"] == "/console/"
    cookie = next(s for s in set_cookies if s.startswith("msmon_console="))
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/console" in cookie
    code, headers, page, _ = c("GET", "/console/")
    assert code == 200 and "cli:alice" in page
    csp = headers["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "default-src 'none'" in csp and "unsafe-inline" not in csp
    assert headers["X-Frame-Options"] == "DENY" and headers["X-Content-Type-Options"] == "nosniff"
    code, _, _, _ = c.form("/console/logout", {"csrf": c.csrf()})
    assert code == 303
    assert c("GET", "/console/")[0] == 302
    # the login form's own token: a forged login (no form cookie) is refused
    fresh = Client(bot)
    code, _, page, _ = fresh.form("/console/login", {"csrf": "guess", "token": "alice-token"})
    assert code == 403 and "msmon_console" not in fresh.cookies
    # a login's `next` never leaves the console
    _, _, page, _ = fresh("GET", "/console/login")
    csrf = re.search(r'name="csrf" value="([^"]+)"', page).group(1)  # type: ignore[union-attr]
    code, headers, _, _ = fresh.form("/console/login", {"csrf": csrf, "token": "alice-token",
                                                        "next": "//evil.example/"})
    assert code == 303 and headers["Location"] == "/console/"


def test_guessing_tokens_is_throttled(bot):
    c = Client(bot)
    codes = [c.login(f"guess-{i}")[0] for i in range(11)]
    assert codes == [401] * 10 + [429]
    code, headers, page, _ = c.login("alice-token")  # even the right one waits out the minute
    assert code == 429 and int(headers["Retry-After"]) > 0 and "try again in" in page


def test_every_post_needs_the_csrf_token(bot):
    report(bot)
    c = Client(bot)
    c.login("alice-token")
    text = json.dumps({"text": "pause run-42"}).encode()
    for headers in ({}, {"X-CSRF-Token": "wrong"}, {"X-CSRF-Token": ""}):
        code, _, body, _ = c("POST", "/console/commands", text, {"Content-Type": "application/json", **headers})
        assert code == 403 and "CSRF" in body, (headers, code, body)
    code, _, body, _ = c.form("/console/commands", {"text": "pause run-42"})  # a form from another site
    assert code == 403
    assert c.form("/console/logout", {})[0] == 403
    assert bot.store.commands.recent() == []  # refused before the command service: nothing queued, nothing audited
    code, _, body, _ = c("POST", "/console/commands", text, {"Content-Type": "application/json",
                                                             "X-CSRF-Token": c.csrf()})
    answer = json.loads(body)
    assert code == 200 and answer["ok"] and "queued as c1" in answer["text"], answer
    (cmd,) = bot.store.commands.recent()
    assert cmd["source"] == "console" and cmd["user"] == "cli:alice" and cmd["verb"] == "pause"
    # a bearer token is not sent by a browser on its own: a script using one needs no CSRF token
    code, _, body, _ = c("POST", "/console/commands", json.dumps({"text": "status run-42"}).encode(),
                         {"Content-Type": "application/json", "Authorization": "Bearer alice-token"})
    assert code == 200 and "run-42" in json.loads(body)["text"]


def test_a_viewer_reads_but_cannot_pause(bot):
    """An operator whom commands.allow does not list: the same refusal and audit row as in chat."""
    report(bot)
    c = Client(bot)
    c.login("viewer-token")
    code, _, page, _ = c("GET", "/console/runs/run-42")
    assert code == 200 and "grad_norm" in page
    csrf = c.csrf()
    code, _, body, _ = c("POST", "/console/commands", b'{"text": "pause run-42"}',
                         {"Content-Type": "application/json", "X-CSRF-Token": csrf})
    answer = json.loads(body)
    assert code == 403 and not answer["ok"] and "may not `pause`" in answer["text"] and "cli:alice" in answer["text"]
    (denied,) = bot.store.commands.recent()
    assert denied["status"] == "denied" and denied["user"] == "cli:viewer" and denied["source"] == "console"
    assert bot.store.commands.open_for("run-42") == []
    code, _, body, _ = c("POST", "/console/commands", b'{"text": "status run-42"}',
                         {"Content-Type": "application/json", "X-CSRF-Token": csrf})
    assert code == 200 and "FIRING ERROR grad_norm" in json.loads(body)["text"]
    # the ack button (a form) works for a viewer, as `ack` does in chat
    code, _, page, _ = c.form("/console/commands", {"csrf": csrf, "verb": "ack", "run": "run-42", "rule": "grad_norm",
                                                    "device": "0"})
    assert code == 200 and "acknowledged grad_norm" in page
    assert bot.store.alerts("run-42", "firing")[0]["acked_by"] == "cli:viewer"
    code, _, page, _ = c.form("/console/commands", {"csrf": csrf, "verb": "silence", "run": "run-42",
                                                    "rule": "grad_norm", "duration": "1h"})
    assert code == 200 and "Silenced grad_norm alerts of run run-42 for 1h" in page


def test_job_data_is_rendered_inert(bot):
    report(bot, run=XSS_RUN, rule=XSS_RULE)
    c = Client(bot)
    c.login("alice-token")
    for path in ("/console/", "/console/alerts", f"/console/runs/{quote(XSS_RUN, safe='')}"):
        code, _, page, _ = c("GET", path)
        assert code == 200, (path, page)
        assert "<script>alert" not in page and "<img src=x" not in page, path
        assert "&lt;script&gt;alert(&quot;run&quot;)&lt;/script&gt;" in page or path == "/console/alerts"
        scripts = re.findall(r"<script[^>]*>", page)
        assert all('src="/console/static/' in s for s in scripts), scripts  # only the console's own code
    _, _, page, _ = c("GET", "/console/alerts")
    assert "&lt;img src=x onerror=alert(1)&gt;" in page
    code, _, body, _ = c("GET", f"/console/api/runs/{quote(XSS_RUN, safe='')}")
    assert code == 200 and json.loads(body)["run"]["run_id"] == XSS_RUN  # JSON carries it as data
    code, _, page, _ = c("GET", f"/console/runs/{quote('<b>nope</b>', safe='')}")
    assert code == 404 and "<b>nope" not in page and "&lt;b&gt;nope" in page


def _stream_events(port: int, path: str, headers: str, until: str, timeout: float = 10.0) -> str:
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n{headers}\r\n".encode())
    got = b""
    deadline = time.monotonic() + timeout
    while until.encode() not in got and time.monotonic() < deadline:
        chunk = s.recv(65536)
        if not chunk:
            break
        got += chunk
    s.close()
    return got.decode(errors="replace")


def test_the_stream_sends_samples_and_alerts_as_they_arrive(bot):
    report(bot, steps=range(1, 11))
    auth = "Authorization: Bearer alice-token\r\n"
    first = _stream_events(bot.port, "/console/api/stream?run=run-42", auth, "event: commands")
    assert "text/event-stream" in first and "event: samples" in first and "event: alerts" in first
    data = json.loads(first.split("event: samples\ndata: ")[1].split("\n")[0])
    assert data["0"]["steps"] == list(range(1, 11)) and data["0"]["throughput_unit"] == ["samples_per_s"]
    assert data["0"]["loss"][0] == pytest.approx(2.99)
    assert _stream_events(bot.port, "/console/api/stream?run=nope", auth, "}").startswith("HTTP/1.1 404")


def test_a_client_that_stops_reading_is_dropped_and_holds_no_memory(tmp_path, monkeypatch, bot_server):
    """The stream writes at the client's pace: with the client's socket full, its one pending write times out
    (console.web.stream_write_timeout, 1 s here) and the stream ends; the bot keeps serving. The flood of
    samples that fills the socket would, on a busy machine, put the ingest into overload, which sheds samples
    before they reach the stream (bot/ingest/overload.py): shedding is off here so the stream has data to write."""
    monkeypatch.setenv("MSMON_TEST_TOKEN", "job-token")
    monkeypatch.setenv("ALICE_TOKEN", "alice-token")
    bot = _console_bot(bot_server, tmp_path, {"stream_interval": 0.1, "stream_write_timeout": 1.0},
                       overload={"enable": False})
    report(bot, steps=range(1, 2))
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", bot.port))
    s.sendall(b"GET /console/api/stream?run=run-42 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer alice-token\r\n\r\n")
    streams = _console(bot).streams
    assert wait_for(lambda: len(streams) == 1, timeout=10)
    step, deadline = 2, time.monotonic() + 60
    while streams and time.monotonic() < deadline:  # samples for 16 ranks the client never reads
        samples = [Sample(run_id="run-42", device=str(d), step=s, time=time.time(), loss=1.0 + d / 7 + s / 1e6,
                          grad_norm=0.5, learning_rate=1e-3) for d in range(16) for s in range(step, step + 300)]
        code, _ = bot.request("POST", "/v1/ingest", envelope([], samples=samples))
        assert code == 202
        step += 300
        time.sleep(0.05)
    assert wait_for(lambda: not streams, timeout=15), "the stalled stream was not dropped"
    s.close()
    assert bot.request("GET", "/healthz", token=None)[0] == 200


def test_live_pages_are_bounded(tmp_path, monkeypatch, bot_server):
    monkeypatch.setenv("MSMON_TEST_TOKEN", "job-token")
    monkeypatch.setenv("ALICE_TOKEN", "alice-token")
    b = _console_bot(bot_server, tmp_path, {"max_streams": 1})
    s = socket.create_connection(("127.0.0.1", b.port), timeout=10)
    try:
        s.sendall(b"GET /console/api/stream HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer alice-token\r\n\r\n")
        assert wait_for(lambda: len(_console(b).streams) == 1, timeout=10)
        second = _stream_events(b.port, "/console/api/stream", "Authorization: Bearer alice-token\r\n", "}")
        assert second.startswith("HTTP/1.1 503") and "max_streams" in second
    finally:
        s.close()


def test_per_rank_series_and_a_login_that_comes_back_to_the_page(bot):
    samples = [Sample(run_id="a&b/c", device=str(d), step=s, time=time.time(), loss=2.0 + d, tokens_per_s=1e4 + d)
               for s in range(1, 6) for d in (0, 1, 10)]
    assert bot.request("POST", "/v1/ingest", envelope([], run="a&b/c", samples=samples))[0] == 202
    c = Client(bot)
    path = f"/console/runs/{quote('a&b/c', safe='')}"
    code, headers, _, _ = c("GET", path)
    assert code == 302
    login = headers["Location"]
    _, _, page, _ = c("GET", login)
    csrf = re.search(r'name="csrf" value="([^"]+)"', page).group(1)  # type: ignore[union-attr]
    nxt = re.search(r'name="next" value="([^"]+)"', page).group(1)  # type: ignore[union-attr]
    code, headers, _, _ = c.form("/console/login", {"csrf": csrf, "token": "alice-token", "next": nxt})
    assert code == 303 and headers["Location"] == path  # back where the login began, the id intact
    code, _, body, _ = c("GET", f"/console/api/runs/{quote('a&b/c', safe='')}")
    series = json.loads(body)["series"]
    assert list(series) == ["0", "1", "10"]  # per rank, in rank order
    assert series["10"]["loss"] == [12.0] * 5 and series["1"]["throughput"] == [10001.0] * 5
    assert series["0"]["throughput_unit"] == ["tokens_per_s"]


def test_shutdown_ends_open_streams_promptly(tmp_path, monkeypatch, bot_server):
    monkeypatch.setenv("ALICE_TOKEN", "alice-token")
    b = bot_server({"bot": {"port": 0, "state_path": str(tmp_path / "bot.sqlite"),
                            "console": {"charts_dir": str(tmp_path), "web": {"stream_interval": 5}},
                            "commands": {"operators": [{"user": "cli:alice", "env": "ALICE_TOKEN"}]}}})
    s = socket.create_connection(("127.0.0.1", b.port), timeout=20)
    s.sendall(b"GET /console/api/stream HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer alice-token\r\n\r\n")
    assert wait_for(lambda: len(_console(b).streams) == 1, timeout=10)
    t0 = time.monotonic()
    b.stop()
    took = time.monotonic() - t0
    assert took < 10, took  # the stream ends at once, not after its 5 s interval or aiohttp's 60 s grace
    got = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        got += chunk
    assert b"event: runs" in got  # the client got its data, then the end of the stream
    s.close()


def _console(bot: BotServer) -> Any:
    from bot.web import Console

    for sig in bot.app.on_shutdown:
        owner = getattr(sig, "__self__", None)
        if isinstance(owner, Console):
            return owner
    raise AssertionError("no console on this app")


def test_the_console_can_be_switched_off(tmp_path, bot_server):
    b = bot_server({"bot": {"port": 0, "state_path": str(tmp_path / "bot.sqlite"),
                            "console": {"charts_dir": str(tmp_path), "web": {"enabled": False}}}})
    assert b.request("GET", "/console/", token=None)[0] == 404


def test_static_files_are_served_from_the_package(bot):
    c = Client(bot)
    code, headers, js, _ = c("GET", "/console/static/uPlot.iife.min.js")
    assert code == 200 and headers["Content-Type"].startswith("text/javascript") and "uPlot" in js
    assert c("GET", "/console/static/..%2Fsession.py")[0] == 404
    assert c("GET", "/console/static/console.js")[0] == 200


def _console_bot(bot_server: Any, tmp_path: Any, web: dict[str, Any], **bot: Any) -> BotServer:
    return bot_server({"bot": {
        **bot, "port": 0, "state_path": str(tmp_path / "bot.sqlite"),
        "tokens": [{"project": "llm", "env": "MSMON_TEST_TOKEN"}], "pipeline": {"group_wait": 0},
        "console": {"charts_dir": str(tmp_path), "charts": False, "web": web},
        "commands": {"operators": [{"user": "cli:alice", "env": "ALICE_TOKEN"}]}}})


@pytest.mark.parametrize("public_url", ["https://msmon.example.org/", None])
def test_messages_link_to_the_run_console_page_when_public_url_is_set(tmp_path, monkeypatch, capsys, public_url,
                                                                      bot_server):
    """The embedded default (console receiver) prints the run's console link under each alert; the run id
    is percent-encoded in it, and the link opens that run's page (after the login). No public_url: no link."""
    monkeypatch.setenv("MSMON_TEST_TOKEN", "job-token")
    monkeypatch.setenv("ALICE_TOKEN", "alice-token")
    run = "exp/7 <b>"
    b = _console_bot(bot_server, tmp_path, {"public_url": public_url})
    code, _ = b.request("POST", "/v1/ingest", envelope([event(run=run)], run=run))
    assert code == 202
    out: list[str] = []
    assert wait_for(lambda: "what to do: Save a checkpoint now." in _seen(capsys, out), timeout=10)
    link = "https://msmon.example.org/console/runs/exp%2F7%20%3Cb%3E"
    if public_url is None:
        assert "open in msmon" not in _seen(capsys, out)
        return
    assert f"open in msmon: {link}" in _seen(capsys, out)
    c = Client(b)
    c.login("alice-token")
    code, _, page, _ = c("GET", link.removeprefix("https://msmon.example.org"))
    assert code == 200 and "exp/7 &lt;b&gt;" in page


def _seen(capsys: Any, out: list[str]) -> str:
    out.append(capsys.readouterr().out)
    return "".join(out)


def test_an_alerts_ack_button_acknowledges_that_alert_only_whatever_its_run_is_named(bot, monkeypatch):
    """Project B's run `fz-a grad_norm` with a rule `0`: its ack button (the form the alerts page shows,
    posted as a browser would) acknowledges B's alert, never project A's run fz-a's grad_norm."""
    import html

    monkeypatch.setenv("MSMON_TEST_TOKEN", "job-token")
    report(bot, run="fz-a", rule="grad_norm")
    code, body = bot.request("POST", "/v1/ingest", envelope([event(run="fz-a grad_norm", rule="0")],
                                                             run="fz-a grad_norm"))
    assert code == 202, body
    c = Client(bot)
    c.login("viewer-token")
    _, _, page, _ = c("GET", "/console/alerts")
    (row,) = [r for r in re.findall(r"<tr class=\"alert.*?</tr>", page) if ">fz-a grad_norm</a>" in r]
    form = re.search(r'<form method="post" action="/console/commands" class="cmd">(.*?)</form>', row)
    assert form, row
    b_ack = {k: html.unescape(v) for k, v in re.findall(r'name="(\w+)" value="([^"]*)"', form.group(1))}
    code, _, answer, _ = c.form("/console/commands", b_ack)
    assert code == 200 and "acknowledged 0" in html.unescape(answer), answer
    assert bot.store.alerts("fz-a", "firing")[0]["acked_by"] is None
    assert bot.store.alerts("fz-a grad_norm", "firing")[0]["acked_by"] == "cli:viewer"
    # the same as JSON (what console.js sends), and a run out of sight or a bad field is a 4xx
    csrf = c.csrf()
    headers = {"Content-Type": "application/json", "X-CSRF-Token": csrf}
    code, _, body, _ = c("POST", "/console/commands", json.dumps(
        {"verb": "silence", "run": "fz-a grad_norm", "rule": "0", "duration": "1h"}).encode(), headers)
    assert code == 200 and "Silenced 0 alerts of run fz-a grad_norm for 1h" in json.loads(body)["text"]
    for bad in ({"verb": "ack", "run": "nope", "rule": "x"}, {"verb": "ack", "run": "fz-a"},
                {"verb": "silence", "run": "fz-a", "duration": "forever"}, {"verb": "ack", "run": ["fz-a"]}):
        code, _, _, _ = c("POST", "/console/commands", json.dumps(bad).encode(), headers)
        assert 400 <= code < 500, bad


@pytest.mark.parametrize("bad", ["/console/\r\nSet-Cookie: x=1", "/console/\x00", "/console/\n", "/console/\u2028x",
                                 "/console/ a", "/console/" + "x" * 5000, "/console/\x7f"])
def test_a_login_next_with_cr_lf_nul_or_odd_characters_goes_to_the_runs_page(bot, bad):
    c = Client(bot)
    code, _, page, _ = c("GET", "/console/login?" + urlencode({"next": bad}))
    assert code == 200 and "Set-Cookie: x" not in page
    _, _, page, _ = c("GET", "/console/login")
    csrf = re.search(r'name="csrf" value="([^"]+)"', page)
    assert csrf
    code, headers, _, cookies = c.form("/console/login", {"csrf": csrf.group(1), "token": "alice-token", "next": bad})
    assert code == 303 and headers["Location"] == "/console/", headers
    assert not any(k.startswith("x=") for k in cookies)


def test_bearer_guesses_on_the_console_api_are_limited_per_address(bot):
    """Wrong bearer tokens on /console/api/* count as wrong logins: after ten, that address waits (429 with
    Retry-After), even with a right token, until the window passes; the login cookie is not affected."""
    c = Client(bot)
    c.login("alice-token")
    answers = [c("GET", "/console/api/runs", headers={"Authorization": f"Bearer guess-{i}"})[0] for i in range(12)]
    assert answers[:10] == [401] * 10 and answers[10:] == [429, 429]
    code, headers, _, _ = c("GET", "/console/api/runs", headers={"Authorization": "Bearer alice-token"})
    assert code == 429 and int(headers["Retry-After"]) >= 1
    assert c("GET", "/console/api/runs")[0] == 200  # the logged-in cookie still reads
