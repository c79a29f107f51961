"""Jobs over NATS JetStream: the real bot consuming the real NATS (the machine's on 127.0.0.1:4222, each
test with its own stream and subject prefix, deleted after; or a private nats-server that the test
restarts), the local Slack API receiving the posts, and the job's real transport (a Monitor job, or
BotTransport itself) publishing. Skipped, with the reason, where NATS is absent."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.request
import uuid
from typing import Any

import pytest

pytest.importorskip("nats")
pytest.importorskip("aiohttp")

from bot.app import METRICS  # noqa: E402
from msmon.contract.subjects import (  # noqa: E402
    ACTION,
    COMMANDS,
    ENVELOPE,
    POLL,
    STATUS_HEADER,
    TOKEN_HEADER,
    subject,
    token,
)
from msmon.contract.wire import Envelope, Poll, encode  # noqa: E402
from notifier import JobControl, Monitor  # noqa: E402
from notifier.nats_transport import nats_transport  # noqa: E402
from tests.fakes.bot_server import BotServer, send, wait_for  # noqa: E402
from tests.fakes.nats_server import SHARED, NatsServer, delete_streams, private_problem, shared_problem  # noqa: E402
from tests.fakes.records import event  # noqa: E402
from tests.fakes.serve_process import ServeProcess  # noqa: E402

_SHARED_PROBLEM = shared_problem()
needs_shared = pytest.mark.skipif(_SHARED_PROBLEM is not None, reason=str(_SHARED_PROBLEM))
needs_private = pytest.mark.skipif(private_problem() is not None, reason=str(private_problem()))


def test_subject_tokens_are_one_to_one_and_never_hold_what_nats_forbids():
    names = ["run-1", "run.1", "run_1", "run_2E1", "a b", "*", ">", "", "ünï", "x" * 3]
    tokens = [token(n) for n in names]
    assert len(set(tokens)) == len(names)  # one-to-one: no two runs share a subject
    for t in tokens:
        assert t and not any(c in t for c in ".*> \t")
    assert subject("msmon", "llm", "run.1", COMMANDS, "0") == "msmon.llm.run_2E1.cmd.0"


@pytest.mark.parametrize(("url", "says"), [("nats://", "has no host"), ("nats://h:99999", "invalid port"),
                                          ("redis://h:6379", "must start with")])
def test_a_bad_nats_address_or_prefix_is_a_config_error_naming_the_key(tmp_path, url, says):
    from bot.config import load_bot_config
    from msmon.config.errors import ConfigError
    from notifier.config import load_config

    job = tmp_path / "job.yaml"
    job.write_text(f"monitor_config:\n  monitor_on: true\n  bot:\n    url: {url}\n    nats_prefix: a.*\n")
    with pytest.raises(ConfigError) as err:
        load_config(str(job))
    text = str(err.value)
    assert "monitor_config.bot.url" in text and says in text and "bot.nats_prefix" in text and "job.yaml:4" in text
    with pytest.raises(ConfigError) as err:
        load_bot_config({"bot": {"nats": {"url": url, "stream": "A.B", "batch": 0}}})
    text = str(err.value)
    assert "bot.nats.url" in text and "bot.nats.stream" in text and "bot.nats.batch" in text


def _bot_config(tmp_path, slack, nats_url: str, prefix: str, stream: str, **nats: Any) -> dict[str, Any]:
    return {"bot": {
        "port": 0, "state_path": str(tmp_path / "bot.sqlite"),
        "tokens": [{"project": "llm", "env": "MSMON_TEST_TOKEN"}, {"project": "other", "env": "MSMON_OTHER_TOKEN"}],
        "routes": [{"receiver": "slack", "channel": "C0ALERTS"}],
        "slack": {"base_url": slack.base_url, "max_retries": 3},
        "pipeline": {"group_wait": 0.2, "heartbeat_timeout": 60},
        "rate_limit": {"per_channel": 100, "per_run": 100, "burst": 50},
        "console": {"charts_dir": str(tmp_path / "charts"), "charts": False},
        "commands": {"allow": [{"project": "llm", "users": ["cli:carol"]}],
                     "operators": [{"user": "cli:carol", "env": "MSMON_OPERATOR"}]},
        "nats": {"url": nats_url, "prefix": prefix, "stream": stream, "durable": f"bot-{prefix}", "ack_wait": 5,
                 **nats}}}


@pytest.fixture
def names(monkeypatch):
    monkeypatch.setenv("MSMON_TEST_TOKEN", "job-token")
    monkeypatch.setenv("MSMON_OTHER_TOKEN", "other-token")
    monkeypatch.setenv("MSMON_OPERATOR", "operator-token")
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-test-token")
    tag = uuid.uuid4().hex[:8]
    return f"t{tag}", f"T{tag}"


def _outcomes(bot: BotServer) -> dict[str, float]:
    out = {}
    for metric in bot.app[METRICS].registry.collect():
        if metric.name == "msmon_nats_messages":
            for s in metric.samples:
                if s.name.endswith("_total"):
                    out[s.labels["outcome"]] = s.value
    return out


def _consumer(url: str, stream: str, durable: str) -> Any:
    async def run() -> Any:
        import nats

        nc = await nats.connect(url, allow_reconnect=False)
        try:
            return await nc.jetstream().consumer_info(stream, durable)
        finally:
            await nc.close()

    return asyncio.run(run())


def _error_posts(slack) -> list[str]:
    return [m["text"] for m in slack.messages() if m["text"].startswith("ERROR")]


@needs_shared
def test_a_monitor_job_over_nats_pages_once_and_a_command_reaches_it_over_nats(tmp_path, slack, names, bot_server):
    prefix, stream = names
    bot = bot_server(_bot_config(tmp_path, slack, SHARED, prefix, stream))
    stop = threading.Event()
    applied: list[str] = []
    try:
        assert wait_for(lambda: _consumer_ready(SHARED, stream, f"bot-{prefix}"), timeout=20)
        cfg = {"monitor_config": {
            "monitor_on": True, "step_interval": 1, "log_interval": 0,
            "alert": {"grad_norm_threshold": 10.0, "alert_interval": 100_000,
                      "rules": {"grad_norm_spike": {"enable": False}, "loss_spike": {"enable": False},
                                "grad_norm_creep": {"enable": False}, "convergence": {"enable": False}}},
            "bot": {"url": SHARED, "nats_prefix": prefix, "token_env": "MSMON_TEST_TOKEN", "project": "llm",
                    "heartbeat_interval": 0.2, "spool_dir": str(tmp_path / "spool")}}}

        def job() -> None:
            with Monitor(cfg, run_id="run.n-1") as mon:  # a run id with a dot: encoded in the subjects
                control = JobControl(mon)
                control.listen()
                step = 0
                while not stop.is_set() and step < 20_000:
                    step += 1
                    mon.step(step, loss=2.0, grad_norm=12.0 if 40 <= step < 60 else 1.0)
                    if control.has_pending:
                        applied.extend(r.action for r in control.apply(step))
                    time.sleep(0.005)

        trainer = threading.Thread(target=job, name="test-job")
        trainer.start()
        assert wait_for(lambda: len(_error_posts(slack)) == 1, timeout=30), slack.messages()
        assert _error_posts(slack)[0].startswith("ERROR grad_norm: run run.n-1")

        code, body = bot.request("POST", "/v1/commands", json.dumps({"text": "loosen-threshold run.n-1 grad_norm 15"})
                                 .encode(), token="operator-token")
        assert code == 200, body
        cid = body["command"]["id"]
        assert wait_for(lambda: bot.store.commands.get(cid)["status"] in ("done", "failed"), timeout=30), \
            bot.store.commands.get(cid)
        assert bot.store.commands.get(cid)["status"] == "done"
        assert applied == ["loosen_threshold"]  # the job applied it once, at a step boundary

        stop.set()
        trainer.join(30)
        assert not trainer.is_alive()
        time.sleep(1.0)
        assert len(_error_posts(slack)) == 1  # and nothing twice
        outcomes = _outcomes(bot)
        assert outcomes.get("ingested", 0) >= 2 and set(outcomes) == {"ingested"}, outcomes  # envelopes, heartbeats
        http = bot.app[METRICS].registry.get_sample_value("msmon_requests_total", {"endpoint": "/v1/ingest",
                                                                                   "status": "202"})
        assert http is None  # nothing came over HTTP
        assert bot.store.run("run.n-1")["project"] == "llm"
    finally:
        stop.set()
        bot.stop()
        delete_streams(SHARED, stream)


def _consumer_ready(url: str, stream: str, durable: str) -> bool:
    try:
        _consumer(url, stream, durable)
        return True
    except Exception:  # noqa: BLE001 - not there yet
        return False


@needs_private
@pytest.mark.slow
def test_nats_restarted_mid_run_the_job_spools_nothing_is_lost_nothing_is_posted_twice(tmp_path, slack, names,
                                                                                       bot_server):
    prefix, stream = names
    with NatsServer(tmp_path / "nats") as server:
        bot_server(_bot_config(tmp_path, slack, server.url, prefix, stream))
        t = nats_transport(server.url, "run-r", "0", "job-token", project="llm", prefix=prefix,
                           spool_dir=str(tmp_path / "spool"), backoff=(0.05, 0.5), probe_interval=0.1,
                           heartbeat_interval=0.5, timeout=2.0)
        try:
            assert wait_for(lambda: _consumer_ready(server.url, stream, f"bot-{prefix}"), timeout=20)
            for k in range(10):
                t.event(event(run="run-r", rule=f"rule{k}", step=100 + k))
            assert wait_for(lambda: len(_error_posts(slack)) == 10, timeout=30), _error_posts(slack)

            server.stop()  # NATS goes away in the middle of the run
            for k in range(10, 20):
                t.event(event(run="run-r", rule=f"rule{k}", step=100 + k))
            assert wait_for(lambda: t.connected is False and not t.spool.empty(), timeout=20), t.stats()
            time.sleep(1.0)
            assert len(_error_posts(slack)) == 10  # nothing arrives while NATS is down

            server.start()  # the same port and store: the stream and the durable consumer are still there
            assert wait_for(lambda: len(_error_posts(slack)) == 20, timeout=60), _error_posts(slack)
            assert t.flush(20)
            time.sleep(2.0)
            posts = _error_posts(slack)
            assert len(posts) == 20 and len(set(posts)) == 20  # every alert once, none twice
            assert {p.split(":")[0] for p in posts} == {f"ERROR rule{k}" for k in range(20)}
            assert t.spool.empty()
            info = _consumer(server.url, stream, f"bot-{prefix}")
            assert info.num_ack_pending == 0 and info.num_pending == 0
        finally:
            t.close(timeout=3)


@needs_shared
def test_poison_messages_are_refused_once_counted_and_never_redelivered(tmp_path, slack, names, bot_server):
    prefix, stream = names
    bot = bot_server(_bot_config(tmp_path, slack, SHARED, prefix, stream))
    good = Envelope(run_id="run-p", device="0", sent_at=time.time(), project="llm", events=[event(run="run-p")])

    async def publish() -> dict[str, Any]:
        import nats

        nc = await nats.connect(SHARED)
        js = nc.jetstream()
        env_subject = subject(prefix, "llm", "run-p", ENVELOPE)
        ok = {TOKEN_HEADER: "job-token"}
        await js.publish(env_subject, b"{not json", headers=ok)
        await js.publish(env_subject, encode(good), headers={TOKEN_HEADER: "stolen"})
        await js.publish(env_subject, b'{"run_id": "run-p"}', headers=ok)  # not the schema
        await js.publish(subject(prefix, "other", "run-p", ENVELOPE), encode(good), headers=ok)  # wrong subject
        await js.publish(env_subject, encode(good), headers={TOKEN_HEADER: "other-token"})  # another project's token
        await js.publish(env_subject, encode(good), headers={**ok, "Nats-Msg-Id": "one"})
        await js.publish(env_subject, encode(good), headers={**ok, "Nats-Msg-Id": "one"})  # stored once
        alias = Envelope(run_id="run-p@vision", device="0", sent_at=time.time(), project="llm",
                         events=[event(run="run-p@vision")])  # a run id like the bot's alias of vision's run-p
        await js.publish(subject(prefix, "llm", "run-p@vision", ENVELOPE), encode(alias), headers=ok)
        # command polls: a wrong token is answered 401 on the rank's command subject; a reply subject
        # outside msmon's command subjects gets nothing
        replies = await nc.subscribe(subject(prefix, "llm", "run-p", COMMANDS, "0"))
        elsewhere = await nc.subscribe("somewhere.else")
        poll = encode(Poll(run_id="run-p", device="0", after=0, wait=0))
        await nc.publish(subject(prefix, "llm", "run-p", POLL), poll, reply=subject(prefix, "llm", "run-p", COMMANDS,
                                                                                    "0"), headers={TOKEN_HEADER: "x"})
        refused = await replies.next_msg(timeout=10)
        await nc.publish(subject(prefix, "llm", "run-p", POLL), poll, reply="somewhere.else", headers=ok)
        await nc.publish(subject(prefix, "llm", "run-p", POLL), poll, reply=subject(prefix, "llm", "run-p", COMMANDS,
                                                                                    "0"), headers=ok)
        answer = await replies.next_msg(timeout=10)
        with pytest.raises(Exception):  # noqa: B017 - nats' TimeoutError
            await elsewhere.next_msg(timeout=1)
        await nc.close()
        return {"refused": (refused.headers or {}).get(STATUS_HEADER), "answer": json.loads(answer.data),
                "answer_status": (answer.headers or {}).get(STATUS_HEADER)}

    try:
        assert wait_for(lambda: _consumer_ready(SHARED, stream, f"bot-{prefix}"), timeout=20)
        got = asyncio.run(publish())
        assert got["refused"] == "401" and got["answer_status"] == "200"
        assert got["answer"] == {"commands": [], "cursor": 0}
        assert wait_for(lambda: len(_error_posts(slack)) == 1, timeout=20)
        assert wait_for(lambda: sum(_outcomes(bot).values()) >= 7, timeout=20), _outcomes(bot)
        time.sleep(6.0)  # past ack_wait (5 s): nothing comes back
        outcomes = _outcomes(bot)
        assert outcomes == {"json": 1, "token": 1, "schema": 2, "subject": 1, "project": 1, "ingested": 1,
                            "poll-token": 1, "poll-subject": 1}, outcomes
        info = _consumer(SHARED, stream, f"bot-{prefix}")
        assert info.num_ack_pending == 0 and info.num_pending == 0 and info.num_redelivered == 0
        assert len(_error_posts(slack)) == 1
    finally:
        bot.stop()
        delete_streams(SHARED, stream)


@needs_shared
def test_a_rank_s_configured_action_reaches_the_bot_over_nats_as_one_command(tmp_path, slack, names, bot_server):
    from msmon.contract.wire import ActionRequest, Sample, Severity

    prefix, stream = names
    bot = bot_server(_bot_config(tmp_path, slack, SHARED, prefix, stream))
    ranks = [nats_transport(SHARED, "run-a", str(d), "job-token", project="llm", prefix=prefix,
                            spool_dir=str(tmp_path / f"spool{d}"), backoff=(0.05, 0.5), heartbeat_interval=0.5)
             for d in range(2)]
    try:
        assert wait_for(lambda: _consumer_ready(SHARED, stream, f"bot-{prefix}"), timeout=20)
        for d, r in enumerate(ranks):
            r.sample(Sample(run_id="run-a", device=str(d), step=10, time=time.time(), loss=2.0))
            assert r.flush(10)
        assert wait_for(lambda: bot.store.run("run-a") is not None, timeout=10)
        for d, r in enumerate(ranks):  # both ranks' rule fires: one pause for the run
            r.ask(ActionRequest(run_id="run-a", device=str(d), step=10, time=time.time(), rule="nonfinite",
                                severity=Severity.ERROR, action="pause", rank=d))
        assert wait_for(lambda: len(bot.store.commands.open_for("run-a")) == 1, timeout=20)
        time.sleep(1.0)  # the second rank's request, too, is answered with the same command
        (cmd,) = bot.store.commands.open_for("run-a")
        assert cmd["action"] == "pause" and cmd["source"].startswith("rule nonfinite on rank")
        assert len(bot.store.commands.open_for("run-a")) == 1 and all(r.asks_lost == 0 for r in ranks)
    finally:
        for r in ranks:
            r.close(timeout=2)
        bot.stop()
        delete_streams(SHARED, stream)


class _Replica(ServeProcess):
    """One `msmon serve` process on the PostgreSQL schema, consuming NATS (SIGKILL-able); ready once its
    /metrics answers."""

    def __init__(self, tmp_path, name: str, cfg: dict[str, Any]) -> None:
        super().__init__(tmp_path, name, cfg, ready=lambda p: p.metric("ingested") is not None)

    def metric(self, outcome: str) -> float | None:
        """msmon_nats_messages_total{outcome} from /metrics (None: no answer yet; 0: not counted yet)."""
        try:
            req = urllib.request.Request(self.url + "/metrics", headers={"Authorization": "Bearer operator-token"})
            with urllib.request.urlopen(req, timeout=2) as r:
                text = r.read().decode()
        except OSError:
            return None
        for line in text.splitlines():
            if line.startswith(f'msmon_nats_messages_total{{outcome="{outcome}"}}'):
                return float(line.split()[-1])
        return 0.0

    def command(self, text: str) -> dict[str, Any]:
        req = urllib.request.Request(self.url + "/v1/commands", data=json.dumps({"text": text}).encode(),
                                     method="POST", headers={"Content-Type": "application/json",
                                                             "Authorization": "Bearer operator-token"})
        code, body = send(req)
        assert code == 200, body
        command: dict[str, Any] = body["command"]
        return command


@needs_private
@pytest.mark.slow
def test_two_replicas_on_postgres_share_the_nats_consumer_through_a_nats_restart_and_a_sigkill(tmp_path, slack, names):
    """Issue 18's replica tests with the jobs on NATS: 1,000 envelopes for 50 alerts consumed by both replicas
    are 50 posts; NATS restarted in the middle (a real transport spools, then delivers); a replica SIGKILLed
    with messages in hand leaves them to the other (ack_wait), none posted twice; a command submitted on one
    replica reaches the job's NATS poll, whichever replica holds it."""
    from tests.fakes import postgres

    postgres.required()
    prefix, stream = names
    with postgres.fresh_schema() as schema, NatsServer(tmp_path / "nats") as server:
        cfg = _bot_config(tmp_path, slack, server.url, prefix, stream, ack_wait=3)
        cfg["bot"]["store"] = {"url": postgres.PG_URL, "schema": schema, "lease": 4}
        cfg["bot"]["commands"]["long_poll"] = 30
        cfg["bot"]["delivery"] = {"backoff_base": 0.2, "backoff_max": 1.0, "max_attempts": 100}
        a = _Replica(tmp_path, "a", cfg)
        b = _Replica(tmp_path, "b", cfg)
        job = nats_transport(server.url, "run-r", "0", "job-token", project="llm", prefix=prefix,
                             spool_dir=str(tmp_path / "spool"), backoff=(0.05, 0.5), probe_interval=0.1,
                             heartbeat_interval=0.5, timeout=2.0)
        got: list[str] = []
        job.listen(lambda cmds: got.extend(c.id for c in cmds))

        async def publish(envelopes: list[Envelope]) -> None:
            import nats

            nc = await nats.connect(server.url)
            js = nc.jetstream()
            for i, env in enumerate(envelopes):
                await js.publish(subject(prefix, "llm", env.run_id, ENVELOPE), encode(env),
                                 headers={TOKEN_HEADER: "job-token", "Nats-Msg-Id": f"{env.run_id}/{i}"})
            await nc.close()

        def envelopes(n: int, first_step: int) -> list[Envelope]:
            return [Envelope(run_id=f"run-{i % 50}", device="0", sent_at=time.time(), project="llm",
                             events=[event(run=f"run-{i % 50}", step=first_step + i // 50)]) for i in range(n)]

        def posts() -> list[str]:
            return [m["text"].split(",")[0] for m in slack.messages() if m["text"].startswith("ERROR")
                    and not m.get("thread_ts")]

        try:
            assert wait_for(lambda: _consumer_ready(server.url, stream, f"bot-{prefix}"), timeout=30)
            asyncio.run(publish(envelopes(1000, 100)))
            assert wait_for(lambda: len(posts()) >= 50, timeout=90), len(posts())
            assert wait_for(lambda: (a.metric("ingested") or 0) + (b.metric("ingested") or 0) >= 1000, timeout=60)
            assert (a.metric("ingested") or 0) > 0 and (b.metric("ingested") or 0) > 0  # both replicas consumed

            server.stop()  # NATS restarted in the middle of the run
            for k in range(5):
                job.event(event(run="run-r", rule=f"rule{k}", step=200 + k))
            assert wait_for(lambda: job.connected is False and not job.spool.empty(), timeout=20)
            server.start()
            assert wait_for(lambda: len(posts()) >= 55, timeout=90), posts()

            # a burst, and a replica SIGKILLed with what it fetched not yet acked: the other gets it after ack_wait.
            # Slack holds the burst's posts meanwhile, so the kill never falls between a post and its record
            # (the store's one documented window for a duplicate, not NATS's)
            assert wait_for(lambda: b.health().get("outbox_depth") == 0, timeout=30)
            hold = threading.Event()
            hold.set()
            slack.fail("chat.postMessage", status=503, times=10_000, when=lambda p: hold.is_set())
            burst = [Envelope(run_id=f"run-k{i}", device="0", sent_at=time.time(), project="llm",
                              events=[event(run=f"run-k{i}", step=300)]) for i in range(20)]
            asyncio.run(publish(burst))
            a.kill()
            time.sleep(1.0)
            hold.clear()
            assert wait_for(lambda: len(posts()) >= 75, timeout=90), len(posts())

            cid = b.command("loosen-threshold run-r grad_norm 15")["id"]
            assert wait_for(lambda: cid in got, timeout=40), got  # over NATS, from whichever replica polls

            assert job.flush(10)
            time.sleep(2.0)
            final = posts()
            twice = sorted(p for p in set(final) if final.count(p) > 1)
            assert len(final) == 75 and len(set(final)) == 75, (twice, len(final))  # every alert once, none twice
        finally:
            job.close(timeout=3)
            a.stop()
            b.stop()


def test_a_batch_sent_again_has_the_same_message_id_and_another_batch_another():
    """The Nats-Msg-Id JetStream deduplicates by: a digest of what the batch carries, so a retry of the same
    items (a lost PubAck, a restart from the spool) is stored once, and any other content is a new message."""
    import random

    from notifier.sendq import Limits, SendQueue
    from notifier.transport import batch_key
    from tests.fakes.records import ev

    def first_batch(items: list[Any]) -> Any:
        q = SendQueue(Limits(), random.Random(0))
        for i, item in enumerate(items):
            q.enqueue(item, float(i), 100)
        return q.take(100.0)

    one = [ev(1), ev(2)]
    assert batch_key("run-1", "0", first_batch(one)) == batch_key("run-1", "0", first_batch([ev(1), ev(2)]))
    assert batch_key("run-1", "0", first_batch(one)) != batch_key("run-1", "0", first_batch([ev(1), ev(3)]))
    assert batch_key("run-1", "0", first_batch(one)) != batch_key("run-1", "1", first_batch(one))  # another rank
    assert batch_key("run-1", "0", first_batch(one)) != batch_key("run-2", "0", first_batch(one))


@needs_shared
def test_an_action_request_for_a_run_not_reported_yet_is_answered_409_with_the_retry_hint_as_over_http(
        tmp_path, slack, names, bot_server):
    """The 'run not reported yet' answer carries Retry-After over NATS as over HTTP, so the rank asks again
    after the hinted second rather than on its own backoff."""
    import urllib.error

    from msmon.contract.wire import ActionRequest, Severity

    prefix, stream = names
    bot = bot_server(_bot_config(tmp_path, slack, SHARED, prefix, stream))
    req = encode(ActionRequest(run_id="run-new", device="0", step=10, time=time.time(), rule="nonfinite",
                               severity=Severity.ERROR, action="pause", rank=0))

    async def over_nats() -> tuple[str | None, str | None, dict[str, Any]]:
        import nats

        nc = await nats.connect(SHARED)
        try:
            msg = await nc.request(subject(prefix, "llm", "run-new", ACTION), req, timeout=10,
                                   headers={TOKEN_HEADER: "job-token"})
        finally:
            await nc.close()
        headers = msg.headers or {}
        return headers.get(STATUS_HEADER), headers.get("Retry-After"), json.loads(msg.data)

    try:
        assert wait_for(lambda: _consumer_ready(SHARED, stream, f"bot-{prefix}"), timeout=20)
        http = urllib.request.Request(bot.url + "/v1/actions/request", data=req, method="POST",
                                      headers={"Content-Type": "application/json",
                                               "Authorization": "Bearer job-token"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(http, timeout=10)
        assert refused.value.code == 409 and refused.value.headers.get("Retry-After") == "1"
        status, retry, answer = asyncio.run(over_nats())
        assert (status, retry) == ("409", "1"), answer
        assert "has not reported yet" in answer["error"]
        assert bot.store.commands.open_for("run-new") == []
    finally:
        bot.stop()
        delete_streams(SHARED, stream)
