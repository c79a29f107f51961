"""The job's spool within its bounds (issue 27): spool_max_mb holds ERRORs too, and spools of runs that
never came back are removed. A real BotTransport, its bot unreachable (nothing listens on the port)."""

from __future__ import annotations

import os
import socket
import time

from notifier.transport import SPOOL_MAX_AGE, BotTransport
from tests.fakes.records import ev, sample


def _nobody() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_the_spool_stays_within_spool_max_bytes_with_errors_and_the_refused_are_counted(tmp_path):
    cap = 200_000
    t = BotTransport(_nobody(), "run-1", "0", token="t", spool_dir=str(tmp_path / "spool"), spool_max_bytes=cap,
                     flush_interval=0.05, heartbeat_interval=60.0, backoff=(0.05, 0.2))
    for i in range(2000):
        e = ev(i)
        e.message = "x" * 2000  # 2 KB an ERROR: 4 MB in all, twenty times the cap
        t.event(e)
        t.sample(sample(i))
    t.close(timeout=2.0)
    size = os.path.getsize(t.spool.path)
    assert 0 < size <= cap * 1.05, size  # the records' own framing aside
    assert t.dropped["errors"] > 1000 and t.dropped["samples"] > 0


def test_spools_of_runs_that_never_came_back_are_removed_and_fresh_ones_and_dead_letters_kept(tmp_path, caplog):
    spool = tmp_path / "spool"
    spool.mkdir()
    old, fresh, dead = spool / "gone-run@0.spool.jsonl", spool / "other-run@0.spool.jsonl", spool / "gone@0.dead.jsonl"
    for p in (old, fresh, dead):
        p.write_text("{}\n")
    past = time.time() - SPOOL_MAX_AGE - 3600
    os.utime(old, (past, past))
    os.utime(dead, (past, past))
    t = BotTransport(_nobody(), "run-1", "0", token="t", spool_dir=str(spool), heartbeat_interval=60.0)
    t.close(timeout=0.5)
    assert not old.exists() and fresh.exists() and dead.exists()
    assert "removed 1 spool(s) untouched for 7 days" in caplog.text and "gone-run@0.spool.jsonl" in caplog.text
