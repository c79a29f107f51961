"""Chaos: a real Monitor raises ERRORs while a raw loopback server answers the job's transport with
every kind of broken reply a network, a proxy or a sick bot can produce, then answers properly.

`FaultyBot` speaks HTTP on a real socket by hand (so it can also not speak it): each request to
/v1/ingest takes the next reply of its script; when the script is spent it answers as the bot does
(202 and a JSON object) and records the envelope. Only envelopes answered properly count as
received: whatever the job sent into a broken answer must come again.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from msmon.contract.wire import Severity, Status
from notifier.monitor import Monitor
from notifier.transport import BotTransport
from tests.fakes.faulty_bot import FAULTS, FaultyBot
from tests.fakes.helpers import wait_for


@pytest.fixture
def faulty():
    # a hang outlasts the job's timeout below; both well above what a busy 2-core CI machine can delay a proper
    # answer by (a 202 read after the timeout is resent, rightly, and would count here as a duplicate)
    b = FaultyBot(hang_s=3.0)
    yield b
    b.stop()


def chaos_monitor(bot: FaultyBot, tmp_path: Any, **kw: Any) -> Monitor:
    transport = BotTransport(bot.url, "chaos", "0", token="t", spool_dir=str(tmp_path / "spool"),
                             flush_interval=0.05, heartbeat_interval=0.1, timeout=2.0,
                             backoff=(0.05, 0.3), **kw)
    transport.listen(lambda cmds: None)  # the command long-poll thread runs too
    cfg = {"monitor_config": {"monitor_on": True, "step_interval": 1, "csv": {"enable": False},
                              "alert": {"grad_norm_threshold": 10.0, "baseline_steps": 0, "alert_interval": 0,
                                        "resolve_after": 1}}}
    return Monitor(cfg, "chaos", transport=transport)


def test_every_error_arrives_once_through_every_broken_answer(faulty, tmp_path):
    """ERRORs raised while the peer answers with each broken reply in turn: once it answers properly,
    the bot has every one of them, none twice, and the job's threads are all alive."""
    faulty.script.extend(FAULTS)  # each broken reply once, in turn
    faulty.script.extend(["reset", "not-http", "hang", "500-html", "truncated-body", "200-garbage-json"])
    faulty.side.extend([*FAULTS, *FAULTS])  # heartbeats and command polls get them too
    mon = chaos_monitor(faulty, tmp_path)
    tr = mon.transport
    assert tr is not None
    raised: list[int] = []
    step = 0
    deadline = time.monotonic() + 15.0
    while (faulty.script or step < 200) and time.monotonic() < deadline:
        for ev in mon.step(step, loss=2.0, grad_norm=100.0 if step % 3 != 2 else 1.0):
            if ev.severity is Severity.ERROR and ev.status is Status.FIRING:
                raised.append(ev.step)
        step += 1
        time.sleep(0.005)
    assert not faulty.script, f"the sender stopped asking: {len(faulty.script)} replies never given"
    assert wait_for(lambda: not faulty.side, timeout=10), "the heartbeat or poll thread stopped asking"
    seen = len(faulty.requests)
    assert wait_for(lambda: {p for p, r in faulty.requests[seen:] if r == "ok"} >= {"/v1/heartbeat",
                                                                                    "/v1/commands/poll"})
    assert wait_for(lambda: len(faulty.errors()) >= len(raised), timeout=10)
    threads = {t.name: t.is_alive() for t in (tr._sender, tr._beater, tr._poller) if t is not None}
    t0 = time.monotonic()
    mon.close()
    close_s = time.monotonic() - t0
    got = [e.step for e in faulty.errors()]
    print(f"\nchaos: {len(raised)} ERRORs raised, {len(set(got))} received, {len(got) - len(set(got))} duplicates, "
          f"{len(raised) - len(set(got) & set(raised))} lost; {len(faulty.requests)} requests; close {close_s:.2f} s")
    assert threads == {"msmon-sender": True, "msmon-heartbeat": True, "msmon-commands": True}
    assert len(raised) > 50
    assert sorted(got) == sorted(raised)  # every ERROR, none twice
    assert got == sorted(got)  # in the order they were raised
    assert tr.dropped.get("errors", 0) == 0


def test_an_error_in_an_outage_arrives_within_2s_of_the_bot_answering(faulty, tmp_path):
    """The bot is down long enough for the backoff to grow; an ERROR raised then goes out within 2 s
    of the bot answering again (it rings the sender, and high items are probed often)."""
    faulty.answer_ok = False  # every ingest: connection closed without an answer
    t = BotTransport(faulty.url, "chaos", "0", token="t", spool_dir=str(tmp_path / "spool"),
                     flush_interval=0.05, heartbeat_interval=60.0, timeout=0.5, backoff=(1.0, 30.0))
    from tests.fakes.records import ev, sample

    for i in range(100):
        t.sample(sample(i))
    time.sleep(4.0)  # failures at ~0, 1, 3 s: the backoff is now 4-12 s
    t.event(ev(7))
    time.sleep(0.3)
    faulty.answer_ok = True
    up = time.monotonic()
    assert wait_for(lambda: faulty.errors(), timeout=30)
    arrived = time.monotonic() - up
    t.close()
    print(f"\nrecovery: first ERROR {arrived:.2f} s after the bot answered again")
    assert arrived < 2.0
    assert [e.step for e in faulty.errors()] == [7]
