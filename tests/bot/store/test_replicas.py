"""Two real `msmon serve` processes on one PostgreSQL (a fresh schema) and the local Slack API: what several
replicas behind a load balancer promise. Each alert is posted once however its events are spread; a
replica SIGKILLed while delivering leaves its claimed rows to the other after the lease, none sent twice;
a command submitted on one replica reaches a job long-polling the other, and its result comes back; one
escalation chain escalates once. Skipped with the reason when PostgreSQL does not answer."""

from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from msmon.contract.wire import Envelope, Severity, encode
from tests.fakes import postgres
from tests.fakes.bot_server import wait_for
from tests.fakes.records import event
from tests.fakes.serve_process import ServeProcess
from tests.fakes.slack_api import SlackAPIServer

pytestmark = pytest.mark.slow

LEASE = 4.0
ENV = {"MSMON_TEST_TOKEN": "job-token", "MSMON_OPERATOR": "operator-token", "SLACK_BOT_TOKEN": "xoxb-test"}
ESCALATE = {"levels": [{"after": 0, "mention": ["U0ONCALL"]}, {"after": 3, "mention": ["U0LEAD"]}]}


def replica(tmp: Path, name: str, schema: str, slack_url: str, escalation: bool = False) -> ServeProcess:
    """One replica: a `msmon serve` process on the PostgreSQL schema, posting to `slack_url`."""
    route: dict[str, Any] = {"receiver": "slack", "channel": "C0ALERTS"}
    if escalation:
        route["escalation"] = "oncall"
    cfg = {"bot": {
        "state_path": str(tmp / f"{name}.unused.sqlite"),
        "store": {"url": postgres.PG_URL, "schema": schema, "lease": LEASE},
        "tokens": [{"project": "llm", "env": "MSMON_TEST_TOKEN"}],
        "routes": [route], "escalations": {"oncall": ESCALATE},
        "slack": {"base_url": slack_url, "max_retries": 0},
        "console": {"charts": False},
        "pipeline": {"group_wait": 0.2},
        "rate_limit": {"per_channel": 1000, "per_run": 1000, "global_rate": 1000, "burst": 100},
        "commands": {"allow": [{"project": "llm", "users": ["cli:carol"]}],
                     "operators": [{"user": "cli:carol", "env": "MSMON_OPERATOR"}], "long_poll": 30}}}
    return ServeProcess(tmp, name, cfg, ENV)


class BlackHole:
    """A 'Slack' that accepts connections and never answers: a replica delivering to it hangs mid-post."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.held: list[socket.socket] = []
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/api/"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)

    def close(self) -> None:
        self.sock.close()
        for c in self.held:
            c.close()


def db(sql: str, schema: str) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(postgres.PG_URL, options=f"-c search_path={schema}") as conn:
        return list(conn.execute(sql))


def post(replica: ServeProcess, run: str, step: int, sev: Severity = Severity.ERROR) -> int:
    body = encode(Envelope(run_id=run, device="0", sent_at=time.time(), project="llm",
                           events=[event(run=run, step=step, sev=sev)]))
    return replica.request("POST", "/v1/ingest", body)[0]


def alert_posts(slack: SlackAPIServer) -> list[str]:
    """The run of each alert message posted (not escalation notes or replies)."""
    return [m["text"].split(",")[0] for m in slack.messages() if "escalation step" not in m.get("text", "")
            and not m.get("thread_ts")]


def test_1000_events_over_two_replicas_for_50_alerts_are_50_posts(tmp_path, schema):
    with SlackAPIServer() as slack:
        a = replica(tmp_path, "a", schema, slack.base_url)
        b = replica(tmp_path, "b", schema, slack.base_url)
        try:
            jobs = [(f"run-{i % 50}", 100 + i // 50, (a, b)[(i // 7) % 2]) for i in range(1000)]
            with ThreadPoolExecutor(8) as pool:
                codes = list(pool.map(lambda j: post(j[2], j[0], j[1]), jobs))
            assert codes == [202] * 1000
            assert wait_for(lambda: len(alert_posts(slack)) >= 50, timeout=60)
            assert wait_for(lambda: a.health().get("outbox_depth") == 0, timeout=30)
            time.sleep(1.5)  # both workers have had rounds since: nothing more goes out
            posts = alert_posts(slack)
            assert len(posts) == 50 and len(set(posts)) == 50, sorted(posts)
            assert db("SELECT COUNT(*) FROM alerts", schema) == [(50,)]
        finally:
            a.stop()
            b.stop()


def test_a_replica_killed_while_delivering_leaves_its_rows_to_the_other_after_the_lease(tmp_path, schema):
    hole = BlackHole()
    with SlackAPIServer() as slack:
        a = replica(tmp_path, "a", schema, hole.url)  # its Slack never answers: it hangs in its first post
        b = None
        try:
            for i in range(5):
                assert post(a, f"run-{i}", 100) == 202
            assert wait_for(lambda: db("SELECT COUNT(*) FROM outbox WHERE claimed_by IS NOT NULL", schema)[0][0] > 0,
                            timeout=20)
            claimed = db("SELECT id, run_id, claim_until FROM outbox WHERE claimed_by IS NOT NULL", schema)
            assert len({r[1] for r in claimed}) == 1  # one group at a time: the one in flight
            a.kill()  # SIGKILL with its rows claimed
            b = replica(tmp_path, "b", schema, slack.base_url)
            assert wait_for(lambda: len(alert_posts(slack)) >= 5, timeout=30)
            time.sleep(1.5)
            posts = alert_posts(slack)
            assert sorted(posts) == [f"ERROR grad_norm: run run-{i}" for i in range(5)]  # every one, none twice
            (done,) = {r[0] for r in db(f"SELECT delivered_at FROM outbox WHERE id={claimed[0][0]}", schema)}
            assert done >= claimed[0][2]  # taken over only once the dead replica's lease had run out
        finally:
            a.stop()
            if b is not None:
                b.stop()
            hole.close()


def test_a_command_on_replica_a_reaches_a_job_long_polling_replica_b_and_its_result_comes_back(tmp_path, schema):
    from tests.bot.commands import test_commands as tc

    with SlackAPIServer() as slack:
        a = replica(tmp_path, "a", schema, slack.base_url)
        b = replica(tmp_path, "b", schema, slack.base_url)
        try:
            tc.report(b)
            got: list[Any] = []
            started = time.monotonic()
            poller = threading.Thread(target=lambda: got.append((tc.poll(b, wait=30.0), time.monotonic())))
            poller.start()
            time.sleep(1.0)  # the job is waiting in its long poll on B
            code, body = a.request("POST", "/v1/commands", b'{"text": "pause run-42"}', token="operator-token")
            assert code in (200, 202), body
            poller.join(35)
            (answer, at) = got[0]
            assert [c.action for c in answer.commands] == ["pause"]
            assert at - started < 25  # woken by A's NOTIFY, not by the end of its 30 s wait
            (cmd,) = answer.commands
            tc.answer(b, cmd, detail="paused at step 103")  # the job answers on B
            status = lambda: a.request("GET", f"/v1/commands/{cmd.id}", token="operator-token")[1]  # noqa: E731
            assert wait_for(lambda: status().get("status") == "done", timeout=10), status()
        finally:
            a.stop()
            b.stop()


def test_one_escalation_chain_escalates_once_with_two_replicas(tmp_path, schema):
    with SlackAPIServer() as slack:
        a = replica(tmp_path, "a", schema, slack.base_url, escalation=True)
        b = replica(tmp_path, "b", schema, slack.base_url, escalation=True)
        try:
            assert post(a, "run-42", 100) == 202
            assert post(b, "run-42", 101) == 202
            notes = lambda: [m["text"] for m in slack.messages() if "escalation step" in m.get("text", "")]  # noqa: E731
            assert wait_for(lambda: len(notes()) >= 2, timeout=30), notes()
            time.sleep(3.0)  # several escalator ticks on both replicas since
            assert len(notes()) == 2 and "U0ONCALL" in notes()[0] and "U0LEAD" in notes()[1], notes()
            assert db("SELECT COUNT(*) FROM escalations", schema) == [(1,)]
            assert len(alert_posts(slack)) == 1
        finally:
            a.stop()
            b.stop()
