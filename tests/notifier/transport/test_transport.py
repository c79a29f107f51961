"""The job -> bot transport against a real HTTP peer on loopback: batching, NaN on the wire, retries,
the disk spool while the bot is down, drop priorities, heartbeats, and a training thread never held up."""

from __future__ import annotations

import logging
import math
import os
import subprocess
import sys
import threading
import time

import pytest

from msmon.contract.wire import ActionResult, Envelope, Event, Sample, Severity, Status, decode, encode
from notifier.transport import BotTransport, SpoolRecord
from tests.fakes.faulty_bot import FAULTS, FaultyBot
from tests.fakes.helpers import wait_for
from tests.fakes.recording_bot import RecordingBot
from tests.fakes.records import ev, sample


@pytest.fixture
def bot():
    b = RecordingBot()
    yield b
    b.stop()


def transport(bot, tmp_path, **kw):
    kw.setdefault("flush_interval", 0.05)
    kw.setdefault("heartbeat_interval", 60.0)
    kw.setdefault("backoff", (0.05, 0.2))
    return BotTransport(bot.url, "run-1", "0", token="s3cret-token", spool_dir=str(tmp_path / "spool"), **kw)


def test_nan_and_inf_survive_the_wire():
    e = ev(1, value=math.nan)
    e.threshold = math.inf
    e.message = "NaN"  # a string that reads NaN stays a string
    s = Sample(run_id="r", device="0", step=1, time=0.0, loss=-math.inf, grad_norm=math.nan)
    raw = encode(Envelope(run_id="r", device="0", sent_at=0.0, events=[e], samples=[s]))
    assert b'"value":"NaN"' in raw and b'"threshold":"Infinity"' in raw and b'"loss":"-Infinity"' in raw
    back = decode(raw, Envelope)
    assert math.isnan(back.events[0].value) and back.events[0].threshold == math.inf
    assert back.events[0].message == "NaN"
    assert back.samples[0].loss == -math.inf and math.isnan(back.samples[0].grad_norm)


def test_events_samples_and_actions_arrive_with_the_token(bot, tmp_path):
    t = transport(bot, tmp_path)
    for i in range(50):
        t.sample(sample(i, loss=math.nan if i == 7 else 2.0))
    t.event(ev(50))
    t.event(ev(51, Severity.WARNING))
    t.action(ActionResult(run_id="run-1", device="0", step=52, time=0.0, action="save_checkpoint", ok=True,
                          detail="written", path="/ckpt/x.ckpt"))
    assert bot.wait_for(lambda: len(bot.samples()) == 50 and len(bot.events()) == 2 and bot.actions())
    t.close()
    assert [s.step for s in bot.samples()] == list(range(50))
    assert math.isnan(bot.samples()[7].loss)
    assert {a for a in bot.auth} == {"Bearer s3cret-token"}


def test_the_training_thread_is_never_held_up(bot, tmp_path):
    bot.mode = "hang"  # the bot accepts the connection and never answers
    t = transport(bot, tmp_path, timeout=0.5, max_queue=1000)

    def train() -> None:
        for i in range(100_000):
            t.sample(sample(i))
            if i % 1000 == 0:
                t.event(ev(i))

    trainer = threading.Thread(target=train)
    trainer.start()
    trainer.join(60)  # a deadlock guard, not a speed limit
    assert not trainer.is_alive() and not bot.hang.is_set()  # done while the peer still hangs
    assert t.dropped.get("samples", 0) > 0  # bounded memory: samples went first
    bot.mode = "ok"
    bot.hang.set()
    t.close(timeout=10)


def test_bot_down_then_up_delivers_the_spool_and_reports_drops(bot, tmp_path, caplog):
    port_url = bot.url
    bot.stop()
    t = transport(bot, tmp_path, spool_max_bytes=20_000)
    with caplog.at_level(logging.WARNING, logger="msmon"):
        for i in range(2000):
            t.sample(sample(i))
            if i % 100 == 0:
                t.event(ev(i))  # 20 ERRORs
            if i % 10 == 0:
                t.event(ev(i, Severity.WARNING))
        deadline = time.monotonic() + 5
        while t.spool.empty() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        assert not t.spool.empty()
        assert "cannot reach the bot" in caplog.text
        bot.start()
        assert bot.url == port_url
        assert bot.wait_for(lambda: sum(e.severity is Severity.ERROR for e in bot.events()) == 20, timeout=15)
    t.close()
    errors = sorted(e.step for e in bot.events() if e.severity is Severity.ERROR)
    assert errors == list(range(0, 2000, 100))  # every ERROR, none twice
    dropped = {k: v for env in bot.envelopes for k, v in env.dropped.items()}
    assert dropped.get("samples", 0) > 0  # the 20 kB spool could not hold all samples: they went first
    assert "errors" not in dropped
    assert "were dropped while it was not" in caplog.text


@pytest.mark.parametrize("mode", ["500", "429"])
def test_server_errors_and_rate_limits_are_retried(bot, tmp_path, mode):
    bot.mode = mode
    t = transport(bot, tmp_path)
    t.event(ev(1))
    time.sleep(0.5)
    assert bot.events() == []
    bot.mode = "ok"
    assert bot.wait_for(lambda: [e.step for e in bot.events()] == [1], timeout=10)
    t.close()


def test_a_refused_token_is_said_once_without_the_token_and_data_is_kept(bot, tmp_path, caplog):
    bot.mode = "401"
    with caplog.at_level(logging.ERROR, logger="msmon"):
        t = transport(bot, tmp_path)
        t.event(ev(1))
        time.sleep(0.6)
    assert caplog.text.count("refused run run-1") == 1
    assert "s3cret-token" not in caplog.text
    bot.mode = "ok"
    assert bot.wait_for(lambda: [e.step for e in bot.events()] == [1], timeout=10)
    t.close()


def test_a_heartbeat_due_rides_in_the_envelope_going_anyway(bot, tmp_path):
    """While samples flow, the heartbeats go inside envelopes (no request of their own); once the job goes quiet
    the heartbeat thread sends them on their own again; the numbers keep rising across both."""
    t = transport(bot, tmp_path, heartbeat_interval=0.4, flush_interval=0.1)
    t0 = time.monotonic()
    step = 0
    while time.monotonic() - t0 < 2.5:
        t.sample(sample(step))
        step += 1
        time.sleep(0.02)
    folded = [hb for env in bot.envelopes for hb in env.heartbeats]
    assert len(folded) >= 3 and len(bot.heartbeats) <= 1  # one may go before the first envelope carries one
    alone = len(bot.heartbeats)
    assert bot.wait_for(lambda: len(bot.heartbeats) >= alone + 2, timeout=10)  # quiet: on their own again
    t.close()
    seqs = [hb.seq for hb in sorted([*folded, *bot.heartbeats], key=lambda hb: hb.time)]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


def test_heartbeats_carry_the_last_step(bot, tmp_path):
    t = transport(bot, tmp_path, heartbeat_interval=0.1)
    t.progress(41)
    assert bot.wait_for(lambda: bot.heartbeats and bot.heartbeats[-1].step == 41)
    t.progress(42, paused=True)
    assert bot.wait_for(lambda: bot.heartbeats[-1].step == 42 and bot.heartbeats[-1].paused)
    t.close()
    hb = bot.heartbeats[-1]
    assert hb.run_id == "run-1" and hb.device == "0" and hb.pid > 0


def test_a_new_process_delivers_the_spool_left_by_the_last(bot, tmp_path):
    bot.stop()
    first = transport(bot, tmp_path)
    for i in range(5):
        first.event(ev(i))
    first.close(timeout=0.5)  # bot down: kept on disk
    assert not first.spool.empty()
    bot.start()
    second = transport(bot, tmp_path)  # same run id and device: same spool
    second.event(ev(99))
    assert bot.wait_for(lambda: sorted(e.step for e in bot.events()) == [0, 1, 2, 3, 4, 99], timeout=10)
    second.close()
    assert second.spool.empty()


def test_commands_come_by_the_long_poll_only_never_in_an_ingest_answer(bot, tmp_path):
    """The bot's answer to an envelope carries no commands; one that does (a bot of another make, or an old one's
    field) is not read: a command reaches a job one way, its long poll (checked there by run, device and cursor)."""
    got = []
    bot.commands = [{"id": "c1", "run_id": "run-1", "action": "pause", "apply_step": 5}]
    t = transport(bot, tmp_path, on_commands=got.extend)
    t.event(ev(1))
    t.event(ev(2))
    assert bot.wait_for(lambda: len(bot.events()) == 2)
    assert t.flush(5.0)
    t.close()
    assert got == []


# -- delivery you can trust: each of these failed on the transport before sendq ----------------------


@pytest.mark.parametrize("fault", list(FAULTS))
def test_the_sender_survives_each_broken_answer_and_logs_it_once(tmp_path, fault, caplog):
    """Each broken reply three times, then proper answers: the ERROR arrives once, the sender lives,
    and what was wrong is logged once (not per retry)."""
    peer = FaultyBot([fault] * 3, hang_s=0.8)
    try:
        with caplog.at_level(logging.WARNING, logger="msmon"):
            t = BotTransport(peer.url, "run-1", "0", token="t", spool_dir=str(tmp_path / "spool"),
                             flush_interval=0.05, heartbeat_interval=60.0, timeout=0.5, backoff=(0.05, 0.2))
            t.event(ev(1))
            assert wait_for(lambda: peer.errors(), timeout=15)
            time.sleep(0.2)
            assert t._sender.is_alive()
            t.close()
        assert [e.step for e in peer.errors()] == [1]
        assert [r for _, r in peer.requests if r != "ok"] == [fault] * 3
        faults = [r for r in caplog.records if r.levelno >= logging.WARNING and "reachable again" not in r.message]
        assert len(faults) == 1, [r.message for r in faults]
    finally:
        peer.stop()


def test_1200_items_with_failing_posts_after_the_first_arrive_once_each(tmp_path):
    """1,200 items queued, a first POST accepted and the next ones failing: an item leaves the queue
    only when the bot took it, so nothing vanishes and nothing comes twice."""
    peer = FaultyBot(["gate", "ok", "500-html", "500-html", "500-html"])
    try:
        t = BotTransport(peer.url, "run-1", "0", token="t", spool_dir=str(tmp_path / "spool"),
                         flush_interval=0.05, heartbeat_interval=60.0, timeout=2.0, backoff=(0.05, 0.2))
        t.event(ev(0))
        assert wait_for(lambda: peer.requests)  # the first POST waits at the gate ...
        for i in range(1, 1200):  # ... while 1,199 more are queued
            t.event(ev(i, Severity.ERROR if i % 3 == 0 else Severity.WARNING))
        peer.gate.set()
        assert wait_for(lambda: len(peer.events()) >= 1200, timeout=15)
        time.sleep(0.2)
        t.close()
        steps = [e.step for e in peer.events()]
        assert steps == list(range(1200))  # each once, in order
        assert t.dropped == {}
    finally:
        peer.stop()


def test_episodes_keep_their_order_across_an_outage(bot, tmp_path):
    """Firing and resolved events of several alerts, through an outage with a spool too small for all:
    each alert's events arrive in the order raised, and no resolution is lost while its firing arrives."""
    bot.stop()
    t = transport(bot, tmp_path, spool_max_bytes=30_000)
    raised = []
    for i in range(300):
        t.sample(sample(i))
        if i % 10 == 0:
            rule = f"r{i % 40}"
            sev = Severity.ERROR if i % 20 == 0 else Severity.WARNING
            for status in (Status.FIRING, Status.RESOLVED):
                e = Event(run_id="run-1", device="0", step=i, time=float(i), rule=rule, severity=sev,
                          status=status, value=1.0, threshold=1.0, message="m")
                t.event(e)
                raised.append((rule, i, status))
    assert wait_for(lambda: not t.spool.empty(), timeout=5)
    bot.start()
    assert wait_for(lambda: sum(e.severity is Severity.ERROR for e in bot.events()) == 30, timeout=15)
    t.close()
    got = [(e.rule, e.step, e.status) for e in bot.events()]
    assert got == [x for x in raised if x in set(got)]  # order kept
    for rule, step, status in got:
        if status is Status.FIRING:
            assert (rule, step, Status.RESOLVED) in got  # a kept firing keeps its resolution
    assert all(x in got for x in raised if x[0] in ("r0", "r20"))  # ERROR episodes: all of them


def test_close_returns_within_its_timeout_against_a_hanging_bot(bot, tmp_path):
    bot.mode = "hang"
    t = transport(bot, tmp_path, timeout=5.0)
    t.event(ev(1))
    time.sleep(0.2)  # the first POST hangs
    t0 = time.monotonic()
    t.close(timeout=1.0)
    took = time.monotonic() - t0
    print(f"\nclose() against a hanging bot: {took:.2f} s (timeout 1.0 s)")
    assert took < 1.3
    assert not t.spool.empty()  # the ERROR waits on disk for the next start
    bot.mode = "ok"
    bot.hang.set()


@pytest.mark.parametrize("url", ["http://bot host:8080", "ftp://bot:21", "bot:8080", "http://", "http://b\x00t"])
def test_an_unusable_url_is_refused_at_construction(tmp_path, url):
    with pytest.raises(ValueError, match="bot.url"):
        BotTransport(url, "run-1", "0", spool_dir=str(tmp_path / "spool"))


def test_spool_files_are_named_safely_and_distinctly(bot, tmp_path):
    bot.stop()
    spool = tmp_path / "spool"
    ts = [BotTransport(bot.url, run, dev, spool_dir=str(spool), flush_interval=0.05, heartbeat_interval=60.0,
                       backoff=(0.05, 0.1)) for run, dev in [("../../escape", "0"), ("a/b", "0"), ("a_b", "0")]]
    for t in ts:
        t.event(ev(1))
    for t in ts:
        t.close(timeout=0.3)
    paths = {t.spool.path for t in ts}
    assert len(paths) == 3
    assert all(os.path.dirname(p) == os.path.realpath(spool) for p in paths)
    assert not (tmp_path.parent / "escape").exists() and not any(tmp_path.parent.glob("escape*"))
    for p in paths:  # one wire-codec record a line, no hand-built JSON
        with open(p, "rb") as f:
            lines = f.read().splitlines()
        for line in lines:
            rec = decode(line, SpoolRecord)
            assert rec.event is not None and rec.event.step == 1


def test_an_item_that_cannot_be_encoded_is_counted_and_the_rest_goes_on(bot, tmp_path, caplog):
    t = transport(bot, tmp_path)
    bad = ev(1)
    bad.actions = [{"callback": object()}]  # job data msgspec cannot encode
    with caplog.at_level(logging.ERROR, logger="msmon"):
        t.event(bad)  # the training thread: never raises
        t.event(ev(2))
        assert bot.wait_for(lambda: [e.step for e in bot.events()] == [2])
    t.close()
    assert t.dropped == {"errors": 1}
    assert caplog.text.count("could not be encoded") == 1


def test_a_job_that_exits_without_close_keeps_its_errors_in_the_spool(bot, tmp_path):
    """The training script dies with an ERROR in flight to a hanging bot: at exit it is spooled."""
    bot.mode = "hang"
    spool = tmp_path / "spool"
    script = (
        "import time\n"
        "from notifier.transport import BotTransport\n"
        "from tests.fakes.records import ev\n"
        f"t = BotTransport({bot.url!r}, 'run-1', '0', spool_dir={str(spool)!r}, timeout=30.0)\n"
        "t.event(ev(7))\n"
        "time.sleep(0.5)\n"
        "raise SystemExit(3)  # no close()\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], cwd=os.getcwd(), timeout=30, capture_output=True)
    assert proc.returncode == 3, proc.stderr.decode()
    files = list(spool.glob("*.spool.jsonl"))
    assert len(files) == 1
    assert [decode(line, SpoolRecord).event.step for line in files[0].read_bytes().splitlines()] == [7]
    bot.mode = "ok"
    bot.hang.set()


@pytest.mark.parametrize("kw", [{"heartbeat_interval": 1e12}, {"heartbeat_interval": float("nan")},
                                {"poll_wait": 1e9}, {"timeout": float("inf")}, {"backoff": (1e300, 1e308)}])
def test_no_interval_given_in_code_can_kill_a_thread(tmp_path, kw, caplog):
    """Config ranges guard the YAML; a transport built in code bounds its own waits (Event.wait(1e12)
    raises OverflowError inside the thread)."""
    t = BotTransport("http://127.0.0.1:9", "run-x", spool_dir=str(tmp_path), **kw)
    try:
        t.listen(lambda cmds: None)
        time.sleep(0.3)
        assert all(th.is_alive() for th in (t._sender, t._beater, t._poller))
        assert "BotTransport" in caplog.text
    finally:
        t.close(timeout=1.0)
