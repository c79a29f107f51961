"""Runs, attempts and ranks that tell the truth (docs/runs-and-ranks.md), against the real bot on loopback
with the real notifier transport (BotTransport, its threads and its close()), ranks in processes of their
own where one is SIGKILLed, and a real Monitor in a custom loop under RANK_ID."""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from msmon.contract.wire import Envelope, Event, Heartbeat, Sample, Severity, Status, encode
from notifier.transport import BotTransport
from tests.bot.test_project_isolation import A as TOKEN
from tests.bot.test_project_isolation import B as VISION
from tests.bot.test_project_isolation import env  # noqa: F401 - the job, vision, operator and Slack tokens
from tests.bot.web.test_console_http import Client
from tests.fakes.bot_server import wait_for
from tests.fakes.process import terminate
from tests.fakes.recording_bot import RecordingBot

pytest.importorskip("aiohttp")
pytestmark = pytest.mark.usefixtures("env")


def config(tmp_path, slack, token_project="llm", **ranks):
    return {"bot": {
        "port": 0, "state_path": str(tmp_path / "bot.sqlite"),
        "tokens": [{"project": token_project, "env": "MSMON_TEST_TOKEN"}, {"project": "vision", "env": "MSMON_VISION"}],
        "routes": [{"receiver": "slack", "channel": "C0ALERTS"}],
        "slack": {"base_url": slack.base_url, "max_retries": 3},
        "pipeline": {"group_wait": 0.2, "heartbeat_timeout": 60},
        "rate_limit": {"per_channel": 100, "per_run": 100, "burst": 50},
        "console": {"charts": False, "charts_dir": str(tmp_path / "charts")},
        "commands": {"operators": [{"user": "cli:ops", "env": "MSMON_OPERATOR"}],
                     "allow": [{"project": "*", "users": ["cli:ops"]}]},
        "ranks": {"period": 0.2, "missing_after": 1.5, **ranks}}}


def job(bot, run, tmp_path, *, project="llm", token=TOKEN, rank=None, world=None, device="0", **kw):
    kw.setdefault("heartbeat_interval", 0.1)
    kw.setdefault("flush_interval", 0.05)
    return BotTransport(bot.url, run, device, token, project=project, rank=rank, world=world,
                        spool_dir=str(tmp_path / f"spool-{run}-{device}"), **kw)


def error(run, step, rule="nonfinite", device="0"):
    return Event(run_id=run, device=device, step=step, time=time.time(), rule=rule, severity=Severity.ERROR,
                 status=Status.FIRING, value=math.nan, threshold=0.0, message=f"loss is NaN at step {step}")


def run_view(bot, run, token=TOKEN):
    code, body = bot.request("GET", f"/v1/runs/{run}", token=token)
    return body if code == 200 else None


def texts(slack):
    return [(slack.message(m["ts"]) or m)["text"] for m in slack.messages()]


# -- ownership ----------------------------------------------------------------------------------------


def test_a_heartbeat_first_job_with_a_token_of_every_project_delivers_every_error(tmp_path, slack, bot_server):
    """A job compiling its first step heartbeats before its first envelope: its run is its project's (not
    'default'), and every ERROR it then sends is accepted and posted."""
    bot = bot_server(config(tmp_path, slack, token_project="*"))
    old = Heartbeat(run_id="other", device="0", time=time.time(), step=None)  # an older notifier: no project
    code, answer = bot.request("POST", "/v1/heartbeat", encode(old))
    assert code == 202 and answer["recorded"] is False and bot.store.run("other") is None
    t = job(bot, "compiling", tmp_path, heartbeat_interval=0.05)
    assert wait_for(lambda: bot.store.run("compiling") is not None, timeout=10)
    assert bot.store.run("compiling")["project"] == "llm"
    rules = [f"rule_{i}" for i in range(5)]
    for i, rule in enumerate(rules):
        t.event(error("compiling", 10 + i, rule))
    assert t.flush(10)
    assert wait_for(lambda: {a["rule"] for a in run_view(bot, "compiling")["firing"]} == set(rules), timeout=10)
    assert slack.wait_for(lambda s: all(any(r in x for x in texts(s)) for r in rules), timeout=15), texts(slack)
    t.close(final=True)


def test_another_project_cannot_squat_a_run_id_a_job_then_uses(tmp_path, slack, bot_server):
    bot = bot_server(config(tmp_path, slack))
    squat = Heartbeat(run_id="llm-7b", device="0", time=time.time(), step=1, project="vision")
    assert bot.request("POST", "/v1/heartbeat", encode(squat), token=VISION)[0] == 202
    t = job(bot, "llm-7b", tmp_path)
    t.event(error("llm-7b", 5))
    assert t.flush(10)
    mine = run_view(bot, "llm-7b")
    assert mine["project"] == "llm" and [a["rule"] for a in mine["firing"]] == ["nonfinite"]
    assert run_view(bot, "llm-7b", token=VISION)["firing"] == []  # vision's run of that id is its own
    assert slack.wait_for(lambda s: any("nonfinite" in x for x in texts(s)), timeout=15)
    t.close(final=True)


# -- ends and attempts ---------------------------------------------------------------------------------


def test_a_run_that_ends_while_an_error_fires_failed_keeps_its_alerts_and_a_rerun_is_a_new_attempt(tmp_path, slack,
                                                                                                   bot_server):
    bot = bot_server(config(tmp_path, slack))
    first = job(bot, "rerun", tmp_path)
    for s in range(1, 9):
        first.sample(Sample(run_id="rerun", device="0", step=s * 100, time=time.time(), loss=2.0 + s / 100))
    first.sample(Sample(run_id="rerun", device="0", step=850, time=time.time(), loss=math.nan))
    first.event(error("rerun", 850))
    assert first.flush(10)
    assert wait_for(lambda: run_view(bot, "rerun")["firing"], timeout=10)
    first.close(final=True)  # NaN to its last step: it died of it, it did not end normally
    assert wait_for(lambda: run_view(bot, "rerun")["state"] == "failed", timeout=30)
    view = run_view(bot, "rerun")
    assert view["ended"] and view["end_reason"].startswith("failed: while ERRORs fired: nonfinite on device 0")
    assert sorted(a["rule"] for a in view["firing"]) == ["nonfinite", "run_failed"]  # kept: why it died
    assert slack.wait_for(lambda s: any("run_failed" in x for x in texts(s)), timeout=15), texts(slack)
    said = [x for x in texts(slack) if "run_failed" in x]
    assert "rerun FAILED at step 850" in said[0] and "last finite loss 2.08 at step 800" in said[0], said
    assert not any("run ended" in x for x in texts(slack))  # nothing says it ended normally
    _, listed = bot.request("GET", "/v1/runs")
    assert [(r["run_id"], r["state"], r["gone"]) for r in listed["runs"]] == [("rerun", "failed", False)]
    console = Client(bot)  # the console says so too, and keeps the whole curve (its window may hold only NaN)
    assert console.login(os.environ["MSMON_OPERATOR"])[0] == 303
    code, _, raw, _ = console("GET", "/console/api/runs/rerun")
    shown = json.loads(raw)
    assert code == 200 and shown["run"]["state"] == "failed"
    whole = shown["series"]["whole run"]
    assert whole["steps"] == [100, 200, 300, 400, 500, 600, 700, 800, 850] and whole["loss"][-2:] == [2.08, "NaN"]
    assert shown["run"]["last_finite"]["loss"] == {"step": 800, "value": 2.08}
    _, _, page, _ = console("GET", "/console/runs/rerun")
    assert 'class="state state-failed">failed' in page and "last finite loss 2.08 at step 800" in page

    second = job(bot, "rerun", tmp_path)  # the same run id again (custom_loop.py run twice; a resume)
    second.sample(Sample(run_id="rerun", device="0", step=1, time=time.time(), loss=3.0))
    assert second.flush(10)
    assert wait_for(lambda: run_view(bot, "rerun")["attempt"] == 2, timeout=10)
    view = run_view(bot, "rerun")
    assert (view["state"], view["firing"], view["last_step"]) == ("running", [], 1)  # clean, its own series
    assert [(a["attempt"], a["end_reason"][:6] if a["end_reason"] else None, a["last_step"])
            for a in view["attempts"]] == [(1, "failed", 850), (2, None, None)]
    assert [s["step"] for s in view["latest"].values()] == [1]
    late = Envelope(run_id="rerun", device="0", sent_at=time.time(), project="llm", proc=first.proc,
                    samples=[Sample(run_id="rerun", device="0", step=900, time=time.time(), loss=9.0)],
                    heartbeats=[Heartbeat(run_id="rerun", device="0", time=time.time(), step=900, proc=first.proc,
                                          seq=10**6, final=True)])
    assert bot.request("POST", "/v1/ingest", encode(late))[0] == 202  # the first job's, sent late
    view = run_view(bot, "rerun")
    assert (view["attempt"], view["state"], view["last_step"]) == (2, "running", 1)  # moves nothing
    assert [s["step"] for s in view["latest"].values()] == [1]
    second.event(error("rerun", 2))  # the new attempt's own NaN pages again
    assert second.flush(10)
    assert slack.wait_for(lambda s: any(x.startswith("ERROR nonfinite") and "step 2" in x for x in texts(s)),
                          timeout=15), texts(slack)
    second.close(final=True)
    assert wait_for(lambda: run_view(bot, "rerun")["state"] == "failed", timeout=30)


def test_a_run_that_ends_with_no_error_firing_ended_normally_and_its_warnings_close(tmp_path, slack, bot_server):
    bot = bot_server(config(tmp_path, slack))
    t = job(bot, "fine", tmp_path)
    for s in range(1, 5):
        t.sample(Sample(run_id="fine", device="0", step=s, time=time.time(), loss=2.0))
    t.event(Event(run_id="fine", device="0", step=4, time=time.time(), rule="loss_spike", severity=Severity.WARNING,
                  status=Status.FIRING, value=3.0, threshold=2.5, message="loss spiked"))
    assert t.flush(10)
    assert wait_for(lambda: run_view(bot, "fine")["firing"], timeout=10)
    t.close(final=True)
    assert wait_for(lambda: run_view(bot, "fine")["state"] == "ended", timeout=30)
    view = run_view(bot, "fine")
    assert (view["end_reason"], view["firing"]) == ("ended normally", [])
    assert [a["status"] for a in view["alerts"]] == ["resolved"]


def test_32_ranks_closing_together_page_no_missing_rank_and_end_the_run_once(tmp_path, slack, caplog, bot_server):
    caplog.set_level(logging.INFO, "msmon.bot")
    bot = bot_server(config(tmp_path, slack, missing_after=1.0))
    ranks = [job(bot, "dp-32", tmp_path, rank=r, world=32, device=str(r), heartbeat_interval=0.05) for r in range(32)]
    try:
        for step in range(1, 4):
            for r, t in enumerate(ranks):
                t.sample(Sample(run_id="dp-32", device=str(r), step=step, time=time.time(), loss=2.0, step_time=0.1))
            time.sleep(0.2)
        assert all(t.flush(10) for t in ranks)
        closers = [threading.Thread(target=t.close, kwargs={"final": True}) for t in ranks]
        for c in closers:
            c.start()
        for c in closers:
            c.join(15)
        assert wait_for(lambda: run_view(bot, "dp-32")["state"] == "ended", timeout=30)
        time.sleep(3.0)  # three times missing_after: a rank overtaken in flight would be missing by now
        view = run_view(bot, "dp-32")
        assert [a for a in view["alerts"] if a["rule"] == "rank_missing"] == []
        ends = [r.getMessage() for r in caplog.records if "ended normally" in r.getMessage()]
        assert len(ends) == 1 and "32 ranks" in ends[0], ends
    finally:
        for t in ranks:
            t.close()


RANK_JOB = """
import os, sys, time
from msmon.contract.wire import Sample
from notifier.transport import BotTransport
url, run, rank, world, stop = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
t = BotTransport(url, run, str(rank), os.environ["MSMON_TEST_TOKEN"], project="llm", rank=rank, world=world,
                 heartbeat_interval=0.1, flush_interval=0.05, spool_dir=stop + f"-spool{rank}")
step = 0
while not os.path.exists(stop):
    step += 1
    t.sample(Sample(run_id=run, device=str(rank), step=step, time=time.time(), loss=2.0, step_time=0.1))
    time.sleep(0.1)
t.close(final=True)
"""


def rank_jobs(bot, run: str, world: int, stop: Path) -> list[subprocess.Popen]:
    """`world` ranks of `run`, each a process of its own (RANK_JOB), until `stop` exists; returns once the bot has
    heard every rank."""
    procs = [subprocess.Popen([sys.executable, "-c", RANK_JOB, bot.url, run, str(r), str(world), str(stop)],
                              env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[3])}, start_new_session=True)
             for r in range(world)]
    heard = wait_for(lambda: (v := run_view(bot, run)) is not None and len(v["devices"]) == world, timeout=30)
    if not heard:
        stop.write_text("")
        for p in procs:
            terminate(p, 10)
    assert heard, run_view(bot, run)
    return procs


def test_a_killed_rank_stays_missing_when_the_others_finish(tmp_path, slack, bot_server):
    bot = bot_server(config(tmp_path, slack))
    stop = tmp_path / "stop"
    procs = rank_jobs(bot, "dp-4", 4, stop)
    try:
        time.sleep(0.5)
        procs[2].send_signal(signal.SIGKILL)
        procs[2].wait(10)

        def missing():
            return [a for a in run_view(bot, "dp-4")["firing"] if a["rule"] == "rank_missing"]
        assert wait_for(lambda: [a["device"] for a in missing()] == ["2"], timeout=15), run_view(bot, "dp-4")
        stop.write_text("")  # the others finish normally
        for r in (0, 1, 3):
            assert procs[r].wait(30) == 0
        assert wait_for(lambda: run_view(bot, "dp-4")["state"] == "failed", timeout=30)  # it died with its rank
        time.sleep(3.0)  # many rank checks after the others' final heartbeats
        view = run_view(bot, "dp-4")
        assert [a["device"] for a in missing()] == ["2"]  # still dead: never "back to normal"
        assert view["state"] == "failed" and "rank 2" in view["end_reason"] and "missing" in view["end_reason"]
        assert slack.wait_for(lambda s: any("dp-4 FAILED" in x for x in texts(s)), timeout=15), texts(slack)
        assert not any("rank_missing" in x and "resolved" in x.lower() for x in texts(slack))
    finally:
        stop.write_text("")
        for p in procs:
            terminate(p, 10)


# -- the job side ------------------------------------------------------------------------------------


def test_close_ends_the_heartbeats_before_the_final_one(tmp_path):
    bot = RecordingBot()
    try:
        t = BotTransport(bot.url, "run-1", "0", "tok", heartbeat_interval=0.01, spool_dir=str(tmp_path / "s"),
                         project="llm", rank=0, world=2)
        assert bot.wait_for(lambda: len(bot.heartbeats) >= 5)
        t.close(final=True)
        time.sleep(0.3)
        beats = list(bot.heartbeats)
        assert beats[-1].final and not any(b.final for b in beats[:-1])  # nothing after the final one
        assert beats[-1].seq == max(b.seq for b in beats)
        assert {(b.project, b.rank, b.world, b.proc) for b in beats} == {("llm", 0, 2, t.proc)}
    finally:
        bot.stop()


def test_a_refused_job_does_not_flood_the_bot_on_close(tmp_path, slack, caplog, bot_server):
    """Envelopes the bot refuses (a token of project vision for a job saying llm): close() keeps the backoff."""
    bot = bot_server(config(tmp_path, slack))
    caplog.set_level(logging.WARNING, "msmon")
    t = job(bot, "refused", tmp_path, token=VISION, heartbeat_interval=60.0, backoff=(0.5, 30.0))
    for i in range(300):
        t.event(error("refused", i, rule=f"r{i % 7}"))
    t.close(timeout=5.0)
    refused = [r for r in caplog.records if "REFUSED" in r.getMessage()]
    assert 1 <= len(refused) <= 12, len(refused)  # backoff 0.5 s doubling over 5 s: a handful, not hundreds


def test_a_custom_loop_under_rank_id_3_reports_rank_3(tmp_path, slack, monkeypatch, bot_server):
    from notifier.monitor import Monitor

    monkeypatch.setenv("RANK_ID", "3")
    monkeypatch.setenv("RANK_SIZE", "4")
    monkeypatch.setenv("DEVICE_ID", "3")
    bot = bot_server(config(tmp_path, slack))
    mon = Monitor.from_config({"monitor_on": True, "step_interval": 1,
                               "bot": {"url": bot.url, "token_env": "MSMON_TEST_TOKEN", "project": "llm",
                                       "spool_dir": str(tmp_path / "spool"), "heartbeat_interval": 0.1}},
                              "custom-3")
    for step in range(1, 6):
        mon.step(step, loss=2.0)
    assert mon.transport is not None and mon.transport.flush(10)
    assert wait_for(lambda: (v := run_view(bot, "custom-3")) is not None and v["devices"] == ["3"], timeout=10)
    from bot.app import STATE

    ranks = bot.app[STATE].ranks.run("custom-3")
    assert ranks is not None and list(ranks.members) == ["3"] and ranks.members["3"].rank == 3
    assert wait_for(lambda: ranks.world == 4 and ranks.members["3"].life.seq is not None, timeout=10)
    mon.close()


def test_save_checkpoint_while_paused_is_written_at_the_paused_step_within_10_s(tmp_path, slack, bot_server):
    """pause, then save-checkpoint (the natural thing while a run diverges): written at once at the paused step,
    not after the resume; status says what is queued meanwhile."""
    ms = pytest.importorskip("mindspore")
    from notifier import Monitor
    from notifier.control import JobControl
    from notifier.mindspore import MindSporeBackend
    from tests.fakes.ms_helpers import MLP

    bot = bot_server(config(tmp_path, slack))
    net = MLP()
    backend = MindSporeBackend(str(tmp_path / "ckpt"))
    backend.bind(net, ms.nn.SGD(net.trainable_params(), 0.01))
    mon = Monitor({"monitor_on": True, "step_interval": 1, "log_interval": 0,
                   "bot": {"url": bot.url, "token_env": "MSMON_TEST_TOKEN", "project": "llm",
                           "spool_dir": str(tmp_path / "spool"), "heartbeat_interval": 0.2}}, "paused-run")
    control = JobControl(mon, backend, heartbeat_every=0.2)
    control.listen()
    assert mon.transport is not None
    mon.transport.poll_wait = 1.0
    done = threading.Event()

    def train() -> None:
        step = 0
        while not done.is_set():
            step += 1
            mon.step(step, loss=1.0 / step)
            control.apply(step)
            time.sleep(0.05)

    loop = threading.Thread(target=train, daemon=True)
    loop.start()

    def operator(text: str) -> dict:
        code, body = bot.request("POST", "/v1/commands", json.dumps({"text": text}).encode(), token="operator-token")
        assert code == 200, body
        return dict(body["command"])

    def status(cid: str) -> dict:
        return dict(bot.request("GET", f"/v1/commands/{cid}", token="operator-token")[1])

    try:
        assert wait_for(lambda: (r := bot.store.run("paused-run")) is not None and (r["last_step"] or 0) > 10,
                        timeout=30)
        pause = operator("pause paused-run")
        assert wait_for(lambda: status(pause["id"])["status"] == "done", timeout=30)
        assert control.paused
        paused_at = control.last_step
        asked = time.time()
        ckpt = operator("save-checkpoint paused-run")
        queued = bot.request("POST", "/v1/commands", json.dumps({"text": "status paused-run"}).encode(),
                             token="operator-token")[1]
        assert wait_for(lambda: status(ckpt["id"])["status"] == "done", timeout=10), status(ckpt["id"])
        took = time.time() - asked
        (result,) = status(ckpt["id"])["results"].values()
        assert result["step"] == paused_at and result["path"].endswith(f"step{paused_at}.ckpt"), result
        assert Path(result["path"]).exists() and control.paused and took < 10
        text = json.dumps(queued)
        assert "paused" in text.lower()
        resume = operator("resume paused-run")
        assert wait_for(lambda: status(resume["id"])["status"] == "done", timeout=30)
    finally:
        done.set()
        control.request("resume")
        loop.join(10)
        mon.close()


def test_a_bot_outage_pages_nothing_for_the_runs_that_went_on(tmp_path, slack, bot_server):
    """The bot is down for longer than heartbeat_timeout while a healthy job goes on: on its start it judges
    the run's silence from its own start (the lifecycle's bot restart), so no job_gone."""
    from tests.fakes.serve_process import free_port

    cfg = config(tmp_path, slack)
    cfg["bot"]["port"] = free_port()
    cfg["bot"]["pipeline"]["heartbeat_timeout"] = 1.5
    bot = bot_server(cfg)
    t = job(bot, "healthy", tmp_path, heartbeat_interval=0.1, backoff=(0.05, 0.2))
    try:
        t.sample(Sample(run_id="healthy", device="0", step=1, time=time.time(), loss=2.0))
        assert t.flush(10)
        assert wait_for(lambda: (r := bot.store.run("healthy")) is not None and r["last_heartbeat"], timeout=10)
        bot.stop()
        time.sleep(3.0)  # twice heartbeat_timeout: the store's last heartbeat is old
        bot = bot_server(cfg)
        time.sleep(3.0)  # the watchdog checks at once, then every 2 s
        assert [a["rule"] for a in run_view(bot, "healthy")["alerts"]] == []
        assert not any("job_gone" in x for x in texts(slack))
    finally:
        t.close(final=True)


def test_a_job_resumed_after_it_was_gone_is_a_new_attempt_whose_gone_alert_closes_once(tmp_path, slack, bot_server):
    cfg = config(tmp_path, slack)
    cfg["bot"]["pipeline"]["heartbeat_timeout"] = 1.5
    bot = bot_server(cfg)
    stop = tmp_path / "stop"

    def start() -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", RANK_JOB, bot.url, "resumed", "0", "1", str(stop)],
                                env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[3])},
                                start_new_session=True)
    procs = [start()]
    try:
        assert wait_for(lambda: (v := run_view(bot, "resumed")) is not None and v["last_step"], timeout=30)
        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait(10)
        assert wait_for(lambda: [a["rule"] for a in run_view(bot, "resumed")["firing"]] == ["job_gone"], timeout=15)
        procs.append(start())  # the job resumed under the same run id (from its checkpoint)
        assert wait_for(lambda: run_view(bot, "resumed")["attempt"] == 2, timeout=30)
        view = run_view(bot, "resumed")
        assert view["firing"] == [] and view["state"] == "running"
        assert [(a["attempt"], a["end_reason"]) for a in view["attempts"]] == [(1, "gone"), (2, None)]
        time.sleep(3.0)  # the watchdog's checks after the new attempt's heartbeats: nothing more about job_gone
        gone = [x for x in texts(slack) if "job_gone" in x]
        # the post (updated) and its thread's reply say why it closed; no "back to normal" from the watchdog after
        assert gone and all("closed, run ended: a new attempt (2)" in x for x in gone), gone
        stop.write_text("")
        assert procs[1].wait(30) == 0
        assert wait_for(lambda: run_view(bot, "resumed")["state"] == "ended", timeout=30)
    finally:
        stop.write_text("")
        for p in procs:
            terminate(p, 10)


def test_msmon_serve_a_heartbeat_first_job_then_another_projects_squat_then_its_end(tmp_path, slack):
    """The same on a real `msmon serve` process: a '*' token's heartbeat-first job keeps its run and its
    ERROR; a heartbeat of another project naming the run id first squats nothing; the end shows at once."""
    from tests.fakes.serve_process import ServeProcess

    cfg = config(tmp_path, slack, token_project="*")
    serve = ServeProcess(tmp_path, "serve", cfg, env={k: os.environ[k] for k in (
        "MSMON_TEST_TOKEN", "MSMON_VISION", "SLACK_BOT_TOKEN", "MSMON_OPERATOR")})
    try:
        squat = Heartbeat(run_id="served", device="0", time=time.time(), step=1, project="vision")
        assert serve.request("POST", "/v1/heartbeat", encode(squat), token=VISION)[0] == 202
        t = job(serve, "served", tmp_path, heartbeat_interval=0.05)
        time.sleep(0.3)  # heartbeats first, as a job compiling its first step
        t.event(error("served", 7))
        assert t.flush(10)
        mine = run_view(serve, "served@llm")
        assert mine["project"] == "llm" and [a["rule"] for a in mine["firing"]] == ["nonfinite"]
        assert run_view(serve, "served", token=VISION)["project"] == "vision"
        assert slack.wait_for(lambda s: any("nonfinite" in x for x in texts(s)), timeout=15), texts(slack)
        t.close(final=True)
        assert wait_for(lambda: run_view(serve, "served@llm")["state"] == "failed", timeout=30)  # its ERROR fired
        assert sorted(a["rule"] for a in run_view(serve, "served@llm")["firing"]) == ["nonfinite", "run_failed"]
    finally:
        serve.stop()


def test_processes_without_a_rank_on_two_hosts_are_not_restarts_of_each_other(tmp_path, slack, bot_server):
    """A launcher msmon does not know (no RANK_ID): two hosts' processes both say device 0, no rank. They
    are one attempt, not a new attempt at every message."""
    bot = bot_server(config(tmp_path, slack))
    for k in range(1, 6):
        for host in ("node-a", "node-b"):
            sent = Envelope(run_id="no-rank", device="0", sent_at=time.time(), project="llm", host=host,
                            proc=f"{host}-proc", samples=[Sample(run_id="no-rank", device="0", step=k,
                                                                 time=time.time(), loss=2.0)])
            assert bot.request("POST", "/v1/ingest", encode(sent))[0] == 202
    assert run_view(bot, "no-rank")["attempt"] == 1


def test_a_real_monitor_whose_loss_is_nan_to_its_end_is_shown_failed_with_its_whole_curve(tmp_path, slack,
                                                                                          bot_server):
    """The issue's demo job: a real Monitor (config/monitor.yaml) whose loss went NaN and stayed NaN for longer than
    the bot's window until the job ended normally (close()): not "ended normally" with its alerts closed, a green
    badge and empty panels, but failed, its NaN alert firing, the failure said in chat, its curve kept."""
    from notifier import Monitor
    from notifier.config import load_config

    bot = bot_server(config(tmp_path, slack))
    cfg = load_config(str(Path(__file__).parents[3] / "config" / "monitor.yaml"))
    cfg.bot.url, cfg.bot.token_env, cfg.bot.project = bot.url, "MSMON_TEST_TOKEN", "llm"
    cfg.bot.spool_dir = str(tmp_path / "spool-nan")
    cfg.tensorboard.enable = cfg.csv.enable = False
    mon = Monitor(cfg, "nan-demo", transport=job(bot, "nan-demo", tmp_path))
    for step in range(1, 1601):
        mon.step(step, loss=3.0 - step / 1000 if step <= 800 else math.nan, lr=1e-4, grad_norm=1.0)
    mon.close()  # the job's own end: its final heartbeat
    assert wait_for(lambda: run_view(bot, "nan-demo")["state"] == "failed", timeout=60), run_view(bot, "nan-demo")
    view = run_view(bot, "nan-demo")
    firing = {a["rule"]: a["severity"] for a in view["firing"]}
    assert firing.pop("run_failed") == "ERROR" and "ERROR" in firing.values(), view["firing"]
    assert not any(a["status"] == "resolved" and "run ended" in str(a) for a in view["alerts"])
    assert slack.wait_for(lambda s: any("nan-demo FAILED at step 1,600" in x for x in texts(s)), timeout=20), \
        texts(slack)
    said = next(x for x in texts(slack) if "nan-demo FAILED" in x)
    assert "last finite loss 2.2" in said and "at step 800" in said, said
    console = Client(bot)
    assert console.login(os.environ["MSMON_OPERATOR"])[0] == 303
    shown = json.loads(console("GET", "/console/api/runs/nan-demo")[2])
    whole = shown["series"]["whole run"]
    assert any(isinstance(v, float) for v in whole["loss"]) and whole["steps"][0] < 100 < 1500 < whole["steps"][-1]
    kept = [s for d in shown["series"].values() for s, v in zip(d["steps"], d["loss"], strict=True)
            if isinstance(v, float) and d is not whole]
    assert not kept or max(kept) <= 800  # the window itself holds only NaN by then: the whole curve is what shows


def test_a_rank_killed_just_before_the_others_finish_is_missing_and_the_run_failed(tmp_path, slack, bot_server):
    """Killed a moment before the others' final heartbeats: it was never silent while the others went on, and the
    watchdog raises no job_gone for a run that said it ended; it was late for ever and the run never ended. Now the
    others outlived it: it is missing, and the run failed."""
    bot = bot_server(config(tmp_path, slack))
    stop = tmp_path / "stop"
    procs = rank_jobs(bot, "dp-k", 3, stop)
    try:
        procs[1].send_signal(signal.SIGKILL)
        procs[1].wait(10)
        stop.write_text("")  # the others finish at once, well inside missing_after
        for r in (0, 2):
            assert procs[r].wait(30) == 0
        assert wait_for(lambda: run_view(bot, "dp-k")["state"] == "failed", timeout=30), run_view(bot, "dp-k")
        view = run_view(bot, "dp-k")
        assert [a["device"] for a in view["firing"] if a["rule"] == "rank_missing"] == ["1"]
        assert "rank 1" in view["end_reason"] and "missing" in view["end_reason"], view["end_reason"]
    finally:
        stop.write_text("")
        for p in procs:
            terminate(p, 10)


def test_a_job_gone_still_firing_when_the_job_speaks_again_and_ends_does_not_fail_the_run(tmp_path, slack,
                                                                                          bot_server):
    """A job silent past heartbeat_timeout (a long checkpoint save) is job_gone; when it comes back and ends at once,
    the job_gone may still be firing (the watchdog has not run since): that is liveness, stale by the final heartbeat
    itself, not what the run died of. It ended normally, and the job_gone closes with it."""
    cfg = config(tmp_path, slack)
    cfg["bot"]["pipeline"]["heartbeat_timeout"] = 0.5
    bot = bot_server(cfg)
    now = time.time()
    beat = Heartbeat(run_id="slow-save", device="0", time=now, step=5, proc="p1", seq=1, project="llm")
    assert bot.request("POST", "/v1/ingest", encode(Envelope(run_id="slow-save", device="0", sent_at=now,
                                                             project="llm", proc="p1", heartbeats=[beat])))[0] == 202
    assert wait_for(lambda: [a["rule"] for a in run_view(bot, "slow-save")["firing"]] == ["job_gone"], timeout=15)
    final = Heartbeat(run_id="slow-save", device="0", time=time.time(), step=6, proc="p1", seq=2, final=True,
                      project="llm")
    assert bot.request("POST", "/v1/heartbeat", encode(final))[0] == 202
    assert wait_for(lambda: run_view(bot, "slow-save")["state"] == "ended", timeout=15), run_view(bot, "slow-save")
    assert run_view(bot, "slow-save")["end_reason"] == "ended normally"
