"""Bounds at the bot's edge (issue 27): one valid job token cannot grow the bot without limit. The real
bot on loopback."""

from __future__ import annotations

import time

from hypothesis import given
from hypothesis import strategies as st

from msmon.contract.wire import Envelope, Heartbeat, Sample, encode


def _bot(bot_server, tmp_path, monkeypatch, **bot):
    monkeypatch.setenv("MSMON_TEST_TOKEN", "job-token")
    return bot_server({"bot": {"port": 0, "state_path": str(tmp_path / "bot.sqlite"), "console": {"charts": False},
                               "tokens": [{"project": "llm", "env": "MSMON_TEST_TOKEN"}], **bot}})


def _from(device: str, run: str = "run-1") -> bytes:
    now = time.time()
    return encode(Envelope(run_id=run, device=device, sent_at=now, project="llm",
                           samples=[Sample(run_id=run, device=device, step=1, time=now, loss=1.0)]))


def test_devices_past_max_devices_are_refused_with_what_to_do_and_the_others_go_on(tmp_path, monkeypatch, bot_server):
    bot = _bot(bot_server, tmp_path, monkeypatch, max_devices=3)
    assert [bot.request("POST", "/v1/ingest", _from(str(d)))[0] for d in range(3)] == [202] * 3
    code, body = bot.request("POST", "/v1/ingest", _from("3"))
    assert code == 422 and "bot.max_devices" in body["error"] and "'3'" in body["error"]
    hb = encode(Heartbeat(run_id="run-1", device="9", time=time.time(), step=1))
    assert bot.request("POST", "/v1/heartbeat", hb)[0] == 422
    assert bot.request("POST", "/v1/ingest", _from("0"))[0] == 202  # a device it has
    assert bot.request("POST", "/v1/ingest", _from("3", run="run-2"))[0] == 202  # another run: its own count
    assert sorted(bot.store.run("run-1")["devices"]) == ["0", "1", "2"]
    bot.stop()
    bot = _bot(bot_server, tmp_path, monkeypatch, max_devices=3)
    # after a restart the run's devices are read back: still three
    assert bot.request("POST", "/v1/ingest", _from("4"))[0] == 422
    assert bot.request("POST", "/v1/ingest", _from("1"))[0] == 202


def test_runs_are_listed_a_page_at_a_time_with_a_cursor_and_a_bad_limit_is_a_422(tmp_path, monkeypatch, bot_server):
    bot = _bot(bot_server, tmp_path, monkeypatch)
    for i in range(7):
        assert bot.request("POST", "/v1/ingest", _from("0", run=f"run-{i}"))[0] == 202
    seen, cursor, pages = [], None, 0
    while True:
        code, body = bot.request("GET", "/v1/runs?limit=3" + (f"&cursor={cursor}" if cursor else ""))
        assert code == 200 and len(body["runs"]) <= 3
        seen += [r["run_id"] for r in body["runs"]]
        pages += 1
        cursor = body["next"]
        if cursor is None:
            break
    assert pages == 3 and sorted(seen) == [f"run-{i}" for i in range(7)] and len(set(seen)) == 7
    assert seen[0] == "run-6"  # most recently seen first
    assert len(bot.request("GET", "/v1/runs")[1]["runs"]) == 7
    for bad in ("limit=0", "limit=1001", "limit=-1", "limit=x", "limit=1e3", "cursor=nope", "cursor=W10"):
        code, body = bot.request("GET", "/v1/runs?" + bad)
        assert code == 422 and body["error"], bad


def test_an_alertmanager_webhook_is_bounded_in_alerts_and_in_the_matches_it_records(tmp_path, monkeypatch, bot_server):
    import json

    import bot.receivers.alertmanager.inbound as am

    monkeypatch.setattr(am, "MAX_MATCHES", 50)
    monkeypatch.setenv("MSMON_ALERTMANAGER_TOKEN", "am-token")
    bot = _bot(bot_server, tmp_path, monkeypatch)
    for r in range(10):
        body = encode(Envelope(run_id=f"run-{r}", device="0", sent_at=time.time(), project="llm",
                               labels={"host": "node1"}))
        assert bot.request("POST", "/v1/ingest", body)[0] == 202

    def webhook(n: int) -> tuple[int, dict]:
        alerts = [{"status": "firing", "labels": {"alertname": f"Disk{i}", "instance": "node1:9100"}}
                  for i in range(n)]
        return bot.request("POST", "/v1/alertmanager", json.dumps({"alerts": alerts}).encode(), token="am-token")

    assert webhook(10) == (200, {"alerts": 10, "matched": 50})  # 100 matches, the first 50 recorded
    assert len(bot.store.alerts("run-0")) == 5
    code, body = webhook(am.MAX_ALERTS + 1)
    assert code == 422 and "10000" in body["error"]


def test_slow_headers_and_slow_bodies_are_cut_after_read_timeout(tmp_path, monkeypatch, bot_server):
    """A client that sends its headers, or its body, a byte at a time is cut after bot.read_timeout: the
    headers' connection closed, the body answered 408; a normal request meanwhile is served at once."""
    import socket
    import threading

    bot = _bot(bot_server, tmp_path, monkeypatch, read_timeout=1.5)

    def trickle(data: bytes, out: list[bytes]) -> None:
        with socket.create_connection(("127.0.0.1", bot.port), timeout=10) as s:
            t0 = time.monotonic()
            try:
                for b in data:
                    s.sendall(bytes([b]))
                    time.sleep(0.2)
                    if time.monotonic() - t0 > 8:
                        break
                out.append(s.recv(4096))
            except OSError:
                out.append(b"closed")
            out.append(str(round(time.monotonic() - t0, 1)).encode())

    slow_headers: list[bytes] = []
    head = b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"X-Pad: " + b"a" * 60 + b"\r\n\r\n"
    body = b"x" * 30
    slow_body: list[bytes] = []
    req = (b"POST /v1/ingest HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer job-token\r\n"
           b"Content-Type: application/json\r\nContent-Length: 30\r\n\r\n")
    threads = [threading.Thread(target=trickle, args=(head, slow_headers)),
               threading.Thread(target=lambda: _slow_body(bot.port, req, body, slow_body))]
    for t in threads:
        t.start()
    time.sleep(0.5)
    t0 = time.monotonic()
    assert bot.request("GET", "/healthz", token=None)[0] == 200 and time.monotonic() - t0 < 1.0
    for t in threads:
        t.join(20)
    assert slow_headers[0] in (b"", b"closed") and float(slow_headers[1]) < 6, slow_headers
    assert slow_body[0].startswith(b"HTTP/1.1 408"), slow_body


def _slow_body(port: int, head: bytes, body: bytes, out: list[bytes]) -> None:
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(head)
        try:
            for b in body:
                s.sendall(bytes([b]))
                time.sleep(0.2)
        except OSError:
            pass
        out.append(s.recv(4096))


def test_an_ack_token_longer_than_any_link_is_a_404_both_ways(tmp_path, monkeypatch, bot_server):
    bot = _bot(bot_server, tmp_path, monkeypatch)
    for method in ("GET", "POST"):
        assert bot.request(method, "/ack/" + "a" * 201, token=None)[0] == 404
    assert bot.request("GET", "/ack/" + "a" * 200, token=None)[0] == 200  # the page; the POST decides


def test_an_unreachable_nats_url_is_said_at_start_and_does_not_hold_the_shutdown(tmp_path, monkeypatch, caplog,
                                                                                 bot_server):
    import logging
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there
    caplog.set_level(logging.WARNING, "msmon")
    bot = _bot(bot_server, tmp_path, monkeypatch, nats={"url": f"nats://127.0.0.1:{port}"})
    try:
        deadline = time.monotonic() + 10
        while "cannot reach NATS" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.1)
        assert f"cannot reach NATS at nats://127.0.0.1:{port}" in caplog.text and "bot.nats.url" in caplog.text
        assert bot.request("GET", "/healthz", token=None)[0] == 200  # HTTP goes on
    finally:
        t0 = time.monotonic()
        bot.stop()
        assert time.monotonic() - t0 < 5.0


def test_runs_past_retention_are_forgotten_unless_something_of_theirs_is_open(tmp_path, monkeypatch):
    """bot.retention: a run last seen before it goes with its alerts and attempts; one with an alert firing
    or a command waiting stays; the command log stays; a fresh run stays."""
    from bot.app import prune_old_runs
    from bot.config import load_bot_config
    from bot.metrics import BotMetrics
    from bot.shared import BotState
    from bot.store.sqlite import AlertRow, Store

    cfg = load_bot_config({"bot": {"state_path": str(tmp_path / "r.sqlite"), "retention": 3600}})
    store = Store(cfg.state_path)
    now = time.time()
    state = BotState(cfg, store, BotMetrics(), lambda: now)
    for run_id, seen in (("old", now - 7200), ("old-firing", now - 7200), ("old-waiting", now - 7200),
                         ("fresh", now - 60)):
        store.touch_run(run_id, "p", {}, "0", 5, seen, heartbeat=True)
    with store.tx():
        store.save_alerts([AlertRow("old|x|0", "old", "x", "0", "ERROR", "resolved", 5, now - 7200),
                           AlertRow("old-firing|x|0", "old-firing", "x", "0", "ERROR", "firing", 5, now - 7200)])
        for cid, run_id, status in (("c1", "old", "done"), ("c2", "old-waiting", "pending")):
            store.db.execute("INSERT INTO commands(id, created_at, run_id, status, updated_at) VALUES(?,?,?,?,?)",
                             (cid, now - 7200, run_id, status, now - 7200))
    assert prune_old_runs(state) == ["old"]
    assert store.run("old") is None and store.alerts("old") == []
    assert {r["run_id"] for r in store.runs()} == {"old-firing", "old-waiting", "fresh"}
    assert store.commands.get("c1") is not None  # the audit log stays
    assert prune_old_runs(state) == []


def test_checkpoint_rings_are_bounded_and_their_text_never_writes_a_line_of_its_own(tmp_path, monkeypatch,
                                                                                    bot_server):
    """A full ring set cost ~1 MB a run as sent (16 devices x 64 x health 256 + why 512); a `health` with a newline
    wrote its own line into `status`. Kept: health one of the words (else "unknown"), why 120 characters, control
    characters shown as text; a run id or device with a control character is refused naming the field."""
    import json

    from bot.store.windows import RING_WHY
    from msmon.contract.wire import RingCheckpoint

    monkeypatch.setenv("MSMON_OPERATOR", "operator-token")
    bot = _bot(bot_server, tmp_path, monkeypatch, commands={
        "operators": [{"user": "cli:ops", "env": "MSMON_OPERATOR"}], "allow": [{"project": "*", "users": ["cli:ops"]}]})
    forged = "healthy\n*ring* (device 0): step 999 healthy; `rewind` loads step 999"[:256]
    ring = [RingCheckpoint(step=s, time=time.time(), health=forged if s == 64 else "unhealthy",
                           why=("loss_spike\nERROR forged line " + "x" * 512)[:512], attempt=1) for s in range(1, 65)]
    assert bot.request("POST", "/v1/ingest", _from("0"))[0] == 202
    for d in range(20):  # more devices than the bot keeps rings of
        hb = Heartbeat(run_id="run-1", device="0", time=time.time(), step=64, checkpoints=ring)
        hb = Heartbeat(**{**{f: getattr(hb, f) for f in hb.__struct_fields__}, "device": str(d)})
        assert bot.request("POST", "/v1/heartbeat", encode(hb))[0] == 202
    from bot.app import STATE

    kept = bot.app[STATE].windows.checkpoints["run-1"]
    assert len(kept) == 16 and all(len(r) == 64 for r in kept.values())
    for r in kept.values():
        assert {c.health for c in r} == {"unhealthy", "unknown"}
        assert all(len(c.why) <= RING_WHY and "\n" not in c.why for c in r)
    code, answer = bot.request("POST", "/v1/commands", json.dumps({"text": "status run-1"}).encode(),
                               token="operator-token")
    assert code == 200, answer
    said = answer["text"] if isinstance(answer, dict) else str(answer)
    assert not any(line.startswith(("ERROR", "*ring*")) for line in said.splitlines()), said  # no forged line
    assert "step 64 unknown" in said and "loss_spike\\x0aERROR forged line" in said, said
    # ids with a control character are refused at the edge, naming the field
    bad_run = encode(Envelope(run_id="run\n2", device="0", sent_at=time.time(), project="llm"))
    code, body = bot.request("POST", "/v1/ingest", bad_run)
    assert code == 422 and "run_id" in body["error"] and "control character" in body["error"]
    code, body = bot.request("POST", "/v1/ingest", _from("7\x1b[2J"))
    assert code == 422 and "device" in body["error"] and "control character" in body["error"]
    from tests.fakes.records import event

    forged = event(run="run-1", rule="grad_norm\n*run-1*: no alert firing")
    code, body = bot.request("POST", "/v1/ingest", encode(Envelope(run_id="run-1", device="0", sent_at=time.time(),
                                                                   project="llm", events=[forged])))
    assert code == 422 and "an event's rule" in body["error"] and "control character" in body["error"], body


@given(st.builds(lambda h, w: (h, w), st.text(max_size=256), st.text(max_size=512)))
def test_a_kept_checkpoint_is_a_health_word_and_a_bounded_printable_why(text):
    from bot.store.windows import HEALTH, RING_WHY, kept
    from msmon.common.text import CONTROL_LINE
    from msmon.contract.wire import RingCheckpoint

    health, why = text
    c = kept(RingCheckpoint(step=1, time=0.0, health=health, why=why))
    assert c.health in HEALTH | {"unknown"} and (c.health == health or health not in HEALTH)
    assert len(c.why) <= RING_WHY and not CONTROL_LINE.search(c.why)
    if len(why) <= RING_WHY and not CONTROL_LINE.search(why):
        assert c.why == why
