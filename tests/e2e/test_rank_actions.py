"""Configured actions (monitor_config `actions:`) in a multi-rank run go through the bot: the rank whose rule
fired asks (POST /v1/actions/request), the bot queues one command that every rank applies at the same step,
recorded in the audit as "rule R on rank N". Without a bot such a run is refused at start-up.

The bot's side with the real wire schema over loopback HTTP; the job's side with the real notifier (Monitor,
JobControl, BotTransport) in process; and a real 2-rank data-parallel MindSpore run under msrun."""

from __future__ import annotations

import csv
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("aiohttp")

from msmon.contract.wire import ActionRequest, Envelope, Poll, PollAnswer, Sample, Severity, decode, encode  # noqa: E402
from tests.fakes.bot_server import wait_for  # noqa: E402
from tests.fakes.process import terminate_group  # noqa: E402

JOB = Path(__file__).parents[1] / "fakes" / "jobs" / "data_parallel_job.py"


def config(tmp_path, project="llm", **commands):
    return {"bot": {"port": 0, "state_path": str(tmp_path / "bot.sqlite"),
                    "tokens": [{"project": project, "env": "MSMON_TEST_TOKEN"},
                               {"project": "other", "env": "MSMON_OTHER_TOKEN"}],
                    "console": {"charts": False},
                    "commands": {"operators": [{"user": "cli:ops", "env": "MSMON_OPERATOR"}],
                                 "allow": [{"users": ["cli:ops"]}], **commands}}}


@pytest.fixture
def env(monkeypatch):
    monkeypatch.setenv("MSMON_TEST_TOKEN", "job-token")
    monkeypatch.setenv("MSMON_OTHER_TOKEN", "other-token")
    monkeypatch.setenv("MSMON_OPERATOR", "operator-token")


@pytest.fixture
def bot(tmp_path, env, bot_server):
    b = bot_server(config(tmp_path))
    yield b


def report(bot, run="dp", step=100, devices=("0", "1")) -> None:
    now = time.time()
    for rank, d in enumerate(devices):
        samples = [Sample(run_id=run, device=d, step=step - 10 * k, time=now - k, loss=2.0) for k in range(20, -1, -1)]
        body = encode(Envelope(run_id=run, device=d, sent_at=now, project="llm", rank=rank, host=f"node-{rank}",
                               samples=samples))
        assert bot.request("POST", "/v1/ingest", body)[0] == 202


def ask(bot, action="pause", rank=1, run="dp", token="job-token", **params):
    req = ActionRequest(run_id=run, device=str(rank), step=100, time=time.time(), rule="loss_spike",
                        severity=Severity.ERROR, action=action, params=params, rank=rank, host=f"node-{rank}")
    return bot.request("POST", "/v1/actions/request", encode(req), token=token)


def poll(bot, device: str, run="dp") -> PollAnswer:
    code, body = bot.request("POST", "/v1/commands/poll", encode(Poll(run_id=run, device=device, wait=0.0)))
    assert code == 200, body
    return decode(json.dumps(body).encode(), PollAnswer)


def test_a_rule_fired_on_one_rank_is_one_command_every_rank_applies_at_one_step(bot):
    report(bot)
    code, body = ask(bot, rank=1)
    assert code == 202 and body["new"] is True, body
    cmd = body["command"]
    assert cmd["source"] == cmd["user"] == "rule loss_spike on rank 1" and cmd["action"] == "pause"
    assert cmd["text"] == "pause dp (loss_spike ERROR on rank 1 at step 100)" and cmd["apply_step"] > 100
    (c0,), (c1,) = poll(bot, "0").commands, poll(bot, "1").commands
    assert c0 == c1 and c0.id == cmd["id"] and c0.apply_step == cmd["apply_step"]
    assert c0.issued_by == "rule loss_spike on rank 1"
    # the same rule on the other rank while the pause waits: the same command, not a second pause
    code, again = ask(bot, rank=0)
    assert code == 200 and again["new"] is False and again["command"]["id"] == cmd["id"]
    # another action is another command, after the first
    code, lr = ask(bot, "scale_lr", rank=0, factor=0.5)
    assert code == 202 and lr["command"]["params"] == {"factor": 0.5}
    assert lr["command"]["apply_step"] >= cmd["apply_step"] and lr["command"]["source"] == "rule loss_spike on rank 0"
    assert [c.id for c in poll(bot, "1").commands] == [cmd["id"], lr["command"]["id"]]
    code, audit = bot.request("GET", f"/v1/commands/{cmd['id']}", token="operator-token")
    assert code == 200 and audit["status"] == "pending"


def test_what_the_bot_will_not_queue_is_a_clear_4xx(tmp_path, env, bot, bot_server):
    report(bot)
    code, body = ask(bot, "resume")
    assert code == 422 and "not an action a rule may run" in body["error"]
    for params, why in (({"factor": 0.5}, "pause takes no parameter 'factor'"), ({"timeout": "x"}, "timeout must be"),
                        ({"timeout": float("inf")}, "timeout must be")):
        code, body = ask(bot, **params)
        assert code == 422 and why in body["error"], body
    code, body = ask(bot, "scale_lr")
    assert code == 422 and "scale_lr needs a factor" in body["error"]
    code, body = ask(bot, "scale_lr", factor=1e9)
    assert code == 422 and "factor must be a number in (0, 100]" in body["error"]
    code, body = ask(bot, run="never-seen")
    assert code == 409 and "has not reported yet" in body["error"]  # the job asks again (Retry-After 1)
    # another project's token reaches only its own project's run of that id (run ids are per project), which
    # has not reported: nothing is queued on this one
    assert ask(bot, token="other-token")[0] == 409
    assert ask(bot, token="operator-token")[0] == 403  # not a job's token
    assert bot.request("POST", "/v1/actions/request", b'{"run_id": "dp"}')[0] == 422
    (tmp_path / "off").mkdir()
    off = bot_server(config(tmp_path / "off", enable=False))
    report(off)
    code, body = ask(off)
    assert code == 403 and "commands.enable" in body["error"]


def test_the_notifier_asks_the_bot_instead_of_pausing_its_rank_alone(bot, tmp_path):
    from notifier import Monitor
    from notifier.control import JobControl
    from notifier.transport import BotTransport
    from notifier.world import World
    from tests.fakes.helpers import config as monitor_config

    report(bot)
    world = World(rank=1, size=2, host="node-1")
    tr = BotTransport(bot.url, "dp", "1", token="job-token", project="llm", spool_dir=str(tmp_path / "spool"),
                      flush_interval=0.05, heartbeat_interval=60.0, rank=world.rank, host=world.host,
                      poll_wait=1.0, backoff=(0.05, 0.2))
    mon = Monitor(monitor_config(alert={"baseline_steps": 0, "rules": {"loss_spike": {"consecutive": 1}}},
                                 actions=[{"rule": "loss_spike", "severity": "ERROR", "action": "pause"}]),
                  "dp", device="1", sinks=[], transport=tr, world=world)
    control = JobControl(mon)
    try:
        fired = []
        for step in range(120):
            for ev in mon.step(step, loss=50.0 if step >= 110 else 2.0 + 0.01 * (step % 3), time=1000.0 + step):
                fired.append(ev)
                control.take_event(ev)
        assert any(e.rule == "loss_spike" and e.actions == [{"action": "pause"}] for e in fired)
        assert not control.has_pending  # nothing applied on this rank alone
        assert wait_for(lambda: bot.store.db.execute(
            "SELECT count(*) FROM commands WHERE source='rule loss_spike on rank 1'").fetchone()[0] == 1)
        control.listen()  # this rank gets the command back, like every other rank, with the apply step
        assert wait_for(lambda: control.has_pending)
        (pending,) = control._order.pending
        assert pending.action == "pause" and pending.command_id == "c1" and pending.at_step is not None
        assert tr.asks_lost == 0
    finally:
        mon.close()


# -- a real 2-rank data-parallel run under msrun ------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _msrun() -> str:
    pytest.importorskip("mindspore")
    msrun = shutil.which("msrun", path=os.path.dirname(sys.executable))
    if msrun is None:
        pytest.skip("msrun (MindSpore's launcher) is not installed")
    return msrun


def _launch(msrun: str, tmp_path: Path, bot_url: str, **knobs: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"],
           "MSMON_BOT_URL": bot_url, "MSMON_JOB_TOKEN": "job-token", "MSMON_CKPT_DIR": str(tmp_path / "ckpt"),
           "MSMON_SPOOL_DIR": str(tmp_path / "spool"), "PYTHONPATH": str(JOB.parents[2]), **knobs}
    return subprocess.Popen([msrun, "--worker_num=2", "--local_worker_num=2", f"--master_port={free_port()}",
                             f"--log_dir={tmp_path / 'logs'}", "--join=True", str(JOB)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # its own process group: a failed test ends the ranks too


def _end(job: subprocess.Popen[str]) -> None:
    """msrun and its workers, whatever is left of them (a paused rank outlives a killed or dead msrun otherwise;
    msrun starts each in a session of its own, so its process group alone is not enough)."""
    terminate_group(job, grace=0)


PAUSE_ON_SPIKE = json.dumps([{"rule": "loss_spike", "severity": "ERROR", "action": "pause"}])


def _command(bot, text: str) -> dict:
    code, answer = bot.request("POST", "/v1/commands", json.dumps({"text": text}).encode(), token="operator-token")
    assert code == 200, answer
    cid = answer["command"]["id"]
    assert wait_for(lambda: bot.store.commands.get(cid)["status"] in ("done", "failed"), timeout=60)
    view: dict = bot.request("GET", f"/v1/commands/{cid}", token="operator-token")[1]
    assert view["status"] == "done", view
    return view


@pytest.mark.mindspore
@pytest.mark.slow
@pytest.mark.timing  # both ranks at the apply step: the bot's lead over the run's pace, on a loaded machine too
def test_a_pause_fired_on_one_ranks_alert_pauses_every_rank_at_the_same_step(tmp_path, env, bot_server):
    msrun = _msrun()
    bot = bot_server(config(tmp_path, project="*", apply_lead=0.5))  # margin for a 2-core CI machine
    job = _launch(msrun, tmp_path, bot.url, MSMON_DP_ACTIONS=PAUSE_ON_SPIKE, MSMON_DP_SPIKE="1:300:5",
                  MSMON_DP_CSV=str(tmp_path / "csv"))
    try:
        def rule_command() -> dict | None:
            row = bot.store.db.execute("SELECT id FROM commands WHERE source LIKE 'rule %'").fetchone()
            return bot.store.commands.get(row[0]) if row else None

        assert wait_for(lambda: rule_command() is not None, timeout=240), job.poll()
        cmd = rule_command()
        assert cmd is not None and cmd["source"] == "rule loss_spike on rank 1" and cmd["action"] == "pause"
        assert wait_for(lambda: bot.store.commands.get(cmd["id"])["status"] in ("done", "failed"), timeout=60)
        done = bot.store.commands.get(cmd["id"])
        assert done["status"] == "done", done
        assert {dev: r["step"] for dev, r in done["results"].items()} == {"0": cmd["apply_step"],
                                                                            "1": cmd["apply_step"]}, done
        assert all(r["detail"].startswith(f"paused at step {cmd['apply_step']}") for r in done["results"].values())
        time.sleep(1.0)  # both ranks stay at the paused step
        run = bot.store.run("dp-run")
        assert run["paused"] and run["last_step"] == cmd["apply_step"]
        # each rank reports its own grad norm before the all-reduce beside the reduced one (the same on both)
        by_rank = []
        for dev in ("0", "1"):
            with open(tmp_path / "csv" / f"dp-run-{dev}.csv", encoding="utf-8") as f:
                by_rank.append({int(r["step"]): r for r in csv.DictReader(f) if r["local_grad_norm"]})
        common = sorted(set(by_rank[0]) & set(by_rank[1]))
        assert len(common) > 200, len(common)
        for step in common:
            assert float(by_rank[0][step]["grad_norm"]) == pytest.approx(float(by_rank[1][step]["grad_norm"]), rel=1e-4)
        local = [{st: float(r["local_grad_norm"]) for st, r in rows.items()} for rows in by_rank]
        assert any(local[0][st] != pytest.approx(local[1][st], rel=1e-3) for st in common[:50])  # own shards differ
        # the bad shard's first steps: rank 1's own norm stands out (the next steps move rank 0's weights too)
        assert all(local[1][st] > 3 * local[0][st] for st in (300, 301)), [(local[0][s], local[1][s]) for s in common]
        resumed = _command(bot, "resume dp-run")
        assert set(resumed["results"]) == {"0", "1"}
        assert all("resumed at step" in r["detail"] for r in resumed["results"].values())
        assert wait_for(lambda: (bot.store.run("dp-run")["last_step"] or 0) > cmd["apply_step"] + 5, timeout=60)
        stopped = _command(bot, "stop dp-run confirm")
        assert len({r["step"] for r in stopped["results"].values()}) == 1
        out, _ = job.communicate(timeout=120)
        assert job.returncode == 0, out[-3000:]
        n = bot.store.db.execute("SELECT count(*) FROM commands WHERE source LIKE 'rule %'").fetchone()[0]
        assert n == 1  # one pause for the run, not one per rank
    finally:
        _end(job)


@pytest.mark.mindspore
@pytest.mark.slow
def test_without_a_bot_the_same_config_is_refused_at_start_up(tmp_path):
    msrun = _msrun()
    job = _launch(msrun, tmp_path, "", MSMON_DP_ACTIONS=PAUSE_ON_SPIKE)
    try:
        out, _ = job.communicate(timeout=240)
    finally:
        _end(job)
    logs = out + "".join(p.read_text(errors="replace") for p in (tmp_path / "logs").glob("*.log"))
    assert job.returncode != 0, out[-3000:]
    assert "monitor_config.actions[0].action: pause cannot run in this 2-rank run" in logs, logs[-3000:]
    assert "no bot.url is set" in logs and "finished at step" not in logs


def test_a_request_before_the_runs_first_report_is_asked_again(bot, tmp_path):
    from notifier.transport import BotTransport

    tr = BotTransport(bot.url, "dp", "1", token="job-token", project="llm", spool_dir=str(tmp_path / "spool"),
                      heartbeat_interval=60.0, rank=1, host="node-1", backoff=(0.05, 0.2))
    try:
        tr.ask(ActionRequest(run_id="dp", device="1", step=100, time=time.time(), rule="nonfinite",
                             severity=Severity.ERROR, action="pause", rank=1, host="node-1"))
        time.sleep(0.5)  # answered 409 (the bot knows no run dp yet), asked again with backoff
        assert bot.store.run("dp") is None and tr.asks_lost == 0
        report(bot)
        assert wait_for(lambda: bot.store.db.execute(
            "SELECT count(*) FROM commands WHERE source='rule nonfinite on rank 1'").fetchone()[0] == 1)
    finally:
        tr.close()
    assert tr.asks_lost == 0
