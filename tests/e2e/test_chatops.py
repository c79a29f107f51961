"""The whole chatops loop with real parts: a real MindSpore training on the CPU reports to the real
bot on loopback; signed Slack slash commands and a button click on the bot's alert message travel
back to the job, are applied at a step boundary, and their results appear in the local Slack API."""

from __future__ import annotations

import json
import threading
import time

import pytest

ms = pytest.importorskip("mindspore")
pytest.importorskip("aiohttp")

from notifier.mindspore import MonitorCallback  # noqa: E402
from tests.fakes.bot_server import wait_for  # noqa: E402
from tests.fakes.ms_helpers import dataset, model, regression_data  # noqa: E402
from tests.fakes.slack_api import SlackAPIServer  # noqa: E402
from tests.fakes.slack_signing import SECRET, click, slash  # noqa: E402

pytestmark = pytest.mark.mindspore


class Pace(ms.train.Callback):
    """Keeps the tiny model at about 100 steps/s (a real job's steps are slower still), and ends a run
    that a failed test would leave going."""

    def __init__(self, limit_s: float = 120.0) -> None:
        super().__init__()
        self.deadline = time.monotonic() + limit_s
        self.steps: list[tuple[int, float]] = []

    def on_train_step_end(self, run_context):
        self.steps.append((run_context.original_args().cur_step_num, time.monotonic()))
        time.sleep(0.01)
        if time.monotonic() > self.deadline:
            run_context.request_stop()


@pytest.fixture
def setup(tmp_path, monkeypatch, bot_server):
    monkeypatch.setenv("MSMON_TEST_TOKEN", "job-token")
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-test-token")
    monkeypatch.setenv("SLACK_SIGNING_SECRET", SECRET)
    with SlackAPIServer() as slack:
        bot = bot_server({"bot": {
            "port": 0, "state_path": str(tmp_path / "bot.sqlite"),
            "tokens": [{"project": "llm", "env": "MSMON_TEST_TOKEN"}],
            "routes": [{"receiver": "slack", "channel": "C0ALERTS"}],
            "slack": {"base_url": slack.base_url, "max_retries": 2},
            "pipeline": {"group_wait": 0.2, "heartbeat_timeout": 30},
            "rate_limit": {"per_channel": 50, "per_run": 50, "burst": 20},
            "console": {"charts_dir": str(tmp_path / "charts")},
            "commands": {"allow": [{"project": "llm", "users": ["U0ALICE"]}]}}})
        yield bot, slack, tmp_path


def job_config(bot, tmp_path):
    return {"monitor_config": {
        "monitor_on": True, "step_interval": 1, "log_interval": 0,
        "alert": {"baseline_steps": 50, "grad_norm_threshold": 10.0, "alert_interval": 10_000,
                  "rules": {"grad_norm_spike": {"enable": False}, "loss_spike": {"enable": False},
                            "grad_norm_creep": {"enable": False}, "convergence": {"enable": False}}},
        "bot": {"url": bot.url, "token_env": "MSMON_TEST_TOKEN", "project": "llm", "heartbeat_interval": 0.2,
                "spool_dir": str(tmp_path / "spool")}}}


def command_done(bot, cid: str, timeout: float = 20.0) -> dict:
    assert wait_for(lambda: bot.store.commands.get(cid)["status"] in ("done", "failed"), timeout=timeout), \
        bot.store.commands.get(cid)
    cmd: dict = bot.store.commands.get(cid)
    return cmd


def test_chat_commands_reach_a_real_mindspore_job(setup):
    bot, slack, tmp_path = setup
    x, y = regression_data()
    m, net, _ = model(lr=0.02)
    ckpt_dir = tmp_path / "ckpt"
    cb = MonitorCallback(job_config(bot, tmp_path), run_id="run-x", checkpoint_dir=str(ckpt_dir))
    pace = Pace()
    trainer = threading.Thread(target=lambda: m.train(1, dataset(x, y, 256, 100_000), callbacks=[pace, cb],
                                                      dataset_sink_mode=False))
    trainer.start()
    try:
        assert wait_for(lambda: ((bot.store.run("run-x") or {}).get("last_step") or 0) > 60, timeout=60)

        # 1. save-checkpoint: a checkpoint of a step at or after the apply step, that loads back, reported in Slack
        code, body = slash(bot.url, "save-checkpoint run-x", response_url=slack.response_url("ckpt"))
        assert code == 200 and "queued as c1" in body["text"], body
        cmd = command_done(bot, "c1")
        (res,) = cmd["results"].values()
        assert res["ok"] and res["step"] >= cmd["apply_step"]
        assert res["path"].endswith(f"step{res['step']}.ckpt")
        params = ms.load_checkpoint(res["path"])
        assert "l1.weight" in params and int(params["global_step"].asnumpy().reshape(-1)[0]) >= cmd["apply_step"]
        assert slack.wait_for(lambda s: len(s.responses("ckpt")) == 1, timeout=10)
        assert res["path"] in slack.responses("ckpt")[0]["text"]

        # 2. pause: no step progress while the job still reports itself alive; resume restarts it
        slash(bot.url, "pause run-x")
        cmd = command_done(bot, "c2")
        paused_at = cmd["results"]["0"]["step"]
        assert wait_for(lambda: bot.store.run("run-x")["paused"], timeout=5)
        beat = bot.store.run("run-x")["last_heartbeat"]
        time.sleep(1.5)
        assert max(s for s, _ in pace.steps) == paused_at  # not a step more
        run = bot.store.run("run-x")
        assert run["last_heartbeat"] > beat and run["paused"] and not run["gone"]
        slash(bot.url, "resume run-x")
        cmd = command_done(bot, "c3")
        assert "resumed at step" in cmd["results"]["0"]["detail"]
        assert wait_for(lambda: max(s for s, _ in pace.steps) > paused_at + 20, timeout=10)

        # 3. loosen-threshold: the next alert reports the new level
        slash(bot.url, "loosen-threshold run-x grad_norm 15")
        cmd = command_done(bot, "c4")
        assert "ERROR 10 -> 15" in cmd["results"]["0"]["detail"]
        slash(bot.url, "scale-lr run-x 40")  # make it diverge
        command_done(bot, "c5")
        assert wait_for(lambda: any(a["rule"] == "grad_norm" for a in bot.store.alerts("run-x")), timeout=60)
        assert slack.wait_for(lambda s: any(m.get("blocks") for m in s.messages("C0ALERTS")), timeout=10)
        alert = next(m for m in slack.messages("C0ALERTS") if m.get("blocks"))
        (row,) = bot.store.db.execute("SELECT event FROM alerts WHERE run_id='run-x' AND rule='grad_norm'")
        ev = json.loads(row["event"])
        assert ev["threshold"] == (15.0 if ev["severity"] == "ERROR" else 7.5)

        # 4. the Pause button on the alert message works like the command, answered in its thread
        button = next(b for b in alert["blocks"][-1]["elements"] if b["text"]["text"] == "Pause")
        code, _ = click(bot.url, button["value"], message_ts=alert["ts"])
        assert code == 200
        cmd = command_done(bot, "c6")
        assert cmd["source"] == "slack-button" and "paused at step" in cmd["results"]["0"]["detail"]
        assert slack.wait_for(lambda s: any("c6" in m.get("text", "") and "device 0 OK" in m.get("text", "")
                                            and m.get("thread_ts") == alert["ts"] for m in s.messages()),
                              timeout=10)
        slash(bot.url, "resume run-x")
        command_done(bot, "c7")
        slash(bot.url, "stop run-x confirm")
        cmd = command_done(bot, "c8")
        assert "stopping after step" in cmd["results"]["0"]["detail"]
        trainer.join(30)
        assert not trainer.is_alive()
    finally:
        cb.control.request("resume")
        cb.control.request("stop")
        trainer.join(30)
