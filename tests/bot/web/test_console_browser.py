"""The web console in a real browser (Playwright driving Debian's Chromium, headless) against the real bot
on loopback and a real MindSpore training on the CPU: the operator logs in through the form, sees the
run's loss curve drawn from the job's own values, an alert the job raises appears without a reload, and
a pause typed into the command box is applied by the job, which reports itself paused. A screenshot of
the run page is saved as a test artifact (under $MSMON_ARTIFACTS when set, else pytest's tmp dir)."""

from __future__ import annotations

import math
import os
import shutil
import threading
import time
from pathlib import Path
from urllib.parse import quote

import pytest

from tests.fakes.browser import CHROMIUM, CHROMIUM_ARGS, artifacts_dir, new_page

if not os.path.exists(CHROMIUM):
    pytest.skip(f"{CHROMIUM} is absent (apt-get install chromium; tools/test-services.sh does)",
                allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install msmon[dev])")
ms = pytest.importorskip("mindspore", reason="MindSpore is not installed (pip install msmon[mindspore])")

from msmon.contract.wire import Sample  # noqa: E402
from notifier.mindspore import MonitorCallback, parse_outputs  # noqa: E402
from tests.fakes.bot_server import wait_for  # noqa: E402
from tests.fakes.ms_helpers import model, regression_data  # noqa: E402
from tests.fakes.records import envelope, event  # noqa: E402

# the module stays on one xdist worker (make unit: --dist loadscope); xdist_group("chromium") would also keep the
# two browser modules on one, but pytest-xdist 3.8 cannot name groups under pytest 9.2 (Item._nodeid is gone)
pytestmark = [pytest.mark.slow, pytest.mark.mindspore, pytest.mark.xdist_group("chromium")]

XSS_RUN = '<script>alert("x")</script>'


class Job(ms.train.Callback):
    """Keeps the tiny model at about 50 steps/s, records every step's loss as the train step returned it,
    and ends a run that a failed test would leave going."""

    def __init__(self, limit_s: float = 240.0) -> None:
        super().__init__()
        self.deadline = time.monotonic() + limit_s
        self.losses: dict[int, float] = {}
        self.last_step = 0

    def on_train_step_end(self, run_context):
        c = run_context.original_args()
        loss, _, _ = parse_outputs(c.net_outputs)
        self.last_step = int(c.cur_step_num)
        self.losses[self.last_step] = float(loss)
        time.sleep(0.02)
        if time.monotonic() > self.deadline:
            run_context.request_stop()


def poisoned_dataset(x, y, batch: int, steps: int, poison: threading.Event):
    """Batches cycling through (x, y); once `poison` is set, the labels carry a NaN (corrupt data), so the
    loss is NaN: a fault as a real one happens, inside the job."""
    import mindspore.dataset as ds
    import numpy as np

    nb = len(x) // batch

    def gen():
        for i in range(steps):
            b = i % nb
            yb = y[b * batch:(b + 1) * batch]
            if poison.is_set():
                yb = yb.copy()
                yb[0, 0] = np.nan
            yield x[b * batch:(b + 1) * batch], yb

    return ds.GeneratorDataset(gen, column_names=["x", "y"], shuffle=False)


@pytest.fixture
def artifacts(tmp_path) -> Path:
    return artifacts_dir(tmp_path)


@pytest.fixture
def bot(tmp_path, monkeypatch, bot_server):
    monkeypatch.setenv("MSMON_TEST_TOKEN", "job-token")
    monkeypatch.setenv("ALICE_TOKEN", "alice-console-token")
    b = bot_server({"bot": {
        "port": 0, "host": "127.0.0.1", "state_path": str(tmp_path / "bot.sqlite"),
        "tokens": [{"project": "llm", "env": "MSMON_TEST_TOKEN"}],
        "console": {"charts_dir": str(tmp_path / "charts"), "charts": False, "web": {"stream_interval": 0.25}},
        "pipeline": {"group_wait": 0.2, "heartbeat_timeout": 60},
        "commands": {"operators": [{"user": "cli:alice", "env": "ALICE_TOKEN"}],
                     "allow": [{"project": "llm", "users": ["cli:alice"]}]}}})
    yield b


def job_config(bot, tmp_path):
    return {"monitor_config": {
        "monitor_on": True, "step_interval": 2, "log_interval": 0,
        "alert": {"baseline_steps": 40, "alert_interval": 10_000,
                  "rules": {"grad_norm_spike": {"enable": False}, "loss_spike": {"enable": False},
                            "grad_norm_creep": {"enable": False}, "convergence": {"enable": False}}},
        "bot": {"url": bot.url, "token_env": "MSMON_TEST_TOKEN", "project": "llm", "heartbeat_interval": 0.2,
                "spool_dir": str(tmp_path / "spool")}}}


def test_the_console_shows_a_real_job_live_and_pauses_it(bot, tmp_path, artifacts):
    x, y = regression_data()
    m, _, _ = model(lr=0.02)
    poison = threading.Event()
    job = Job()
    cb = MonitorCallback(job_config(bot, tmp_path), run_id="run-x", checkpoint_dir=str(tmp_path / "ckpt"))
    trainer = threading.Thread(target=lambda: m.train(1, poisoned_dataset(x, y, 256, 100_000, poison),
                                                      callbacks=[job, cb], dataset_sink_mode=False), daemon=True)
    trainer.start()
    # a second run, reported by hand, whose id is markup: it must show as text
    code, _ = bot.request("POST", "/v1/ingest", envelope([event(run=XSS_RUN)], run=XSS_RUN))
    assert code == 202
    problems: list[str] = []
    dialogs: list[str] = []
    try:
        assert wait_for(lambda: ((bot.store.run("run-x") or {}).get("last_step") or 0) > 40, timeout=90)
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            try:
                page = new_page(browser, 1400, 1000)
                page.on("console", lambda msg: problems.append(msg.text) if msg.type == "error" else None)
                page.on("pageerror", lambda exc: problems.append(str(exc)))
                page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))

                # 1. the login form (no way around it), then the runs table
                page.goto(bot.url + "/console/")
                assert "/console/login" in page.url
                page.fill("input[name=token]", "alice-console-token")
                page.click("button[type=submit]")
                page.wait_for_selector("#runs tr[data-run='run-x']")
                assert page.locator("#runs tbody tr").count() == 2
                assert page.locator("#runs a", has_text=XSS_RUN).count() == 1  # shown as text

                # 2. the run page draws the job's own loss values
                page.click("#runs a:text-is('run-x')")
                page.wait_for_function("() => window.msmonConsole && window.msmonConsole.charts.loss && "
                                       "window.msmonConsole.charts.loss.data[0].length > 20")
                page.evaluate("() => { window.__notReloaded = true; }")
                steps, losses = page.evaluate("() => window.msmonConsole.charts.loss.data.slice(0, 2)")
                assert steps == sorted(steps) and all(s % 2 == 0 for s in steps)  # every sampled step
                for s, v in zip(steps, losses, strict=True):
                    assert v == pytest.approx(job.losses[s], rel=1e-5), s
                drawn = page.evaluate("""() => {
                    const u = window.msmonConsole.charts.loss, b = u.bbox;
                    const px = u.ctx.getImageData(b.left, b.top, b.width, b.height).data;
                    let n = 0;
                    for (let i = 0; i < px.length; i += 4)
                        if (Math.abs(px[i] - 31) < 40 && Math.abs(px[i + 1] - 119) < 40
                            && Math.abs(px[i + 2] - 180) < 40 && px[i + 3] > 100) n++;
                    return n; }""")
                assert drawn > 50, drawn  # the curve's own colour, painted on the canvas
                assert int(page.get_attribute("#chart-throughput", "data-points") or 0) > 20
                assert "samples/s" in page.inner_text("#chart-throughput figcaption")
                more = page.evaluate("() => window.msmonConsole.charts.loss.data[0].length")
                page.wait_for_function(f"() => window.msmonConsole.charts.loss.data[0].length > {more}")  # live

                # 3. corrupt data in the job: its NaN alert appears on the open page, no reload
                poison.set()
                page.wait_for_selector("#alerts tr.sev-ERROR.st-firing[data-rule='nonfinite']", timeout=60_000)
                assert page.evaluate("() => window.__notReloaded === true")
                alert = next(a for a in bot.store.alerts("run-x") if a["rule"] == "nonfinite")
                marked = page.evaluate("() => window.msmonConsole.alerts.map(a => [a.rule, a.first_step])")
                assert ["nonfinite", alert["first_step"]] in marked  # a marker on the curves at that step
                # the NaN losses since then: one stretch in the note (every 2nd step is sampled), not each step
                page.wait_for_function("() => /not finite \\(NaN or Inf\\) at steps [0-9,]+-[0-9,]+: drawn as a gap"
                                       "/.test(document.querySelector('#chart-loss .note').textContent)")

                # the alert's buttons: ack (the row says who, live) and silence (the answer says for how long)
                row = "#alerts tr[data-rule='nonfinite']"
                page.click(f"{row} form:not(.silence) button")
                page.wait_for_function(f"() => document.querySelector(\"{row}\").textContent.includes('cli:alice')")
                page.select_option(f"{row} select[name=duration]", "4h")
                page.click(f"{row} form.silence button")
                page.wait_for_function("() => document.getElementById('answer').textContent.includes("
                                       "'Silenced nonfinite alerts of run run-x for 4h')")
                assert [c["verb"] for c in bot.store.commands.recent(2, run_id="run-x")] == ["silence", "ack"]

                # 4. pause from the command box: the job applies it and reports itself paused
                page.fill("#command-text", "pause run-x")
                page.click("#command-form button")
                page.wait_for_function("() => /queued as c\\d+/.test(document.getElementById('answer').textContent)")
                page.wait_for_selector("#run-state .state-paused", timeout=30_000)
                # "the result will be reported here": the answer box gets the job's result when it is in
                page.wait_for_function("() => /\\bc\\d+ done: .*paused at step/.test("
                                       "document.getElementById('answer').textContent)", timeout=30_000)
                cmd = bot.store.commands.recent(1, run_id="run-x")[0]
                assert cmd["source"] == "console" and cmd["user"] == "cli:alice"
                assert wait_for(lambda: bot.store.commands.get(cmd["id"])["status"] == "done", timeout=20)
                result = bot.store.commands.get(cmd["id"])["results"]["0"]
                assert "paused at step" in result["detail"]
                held = job.last_step
                time.sleep(1.0)
                assert job.last_step == held == result["step"]  # the job really stopped stepping
                page.wait_for_selector(f"#commands td:text-is('{cmd['id']}')")
                page.screenshot(path=str(artifacts / "console.png"), full_page=True)

                # 5. resume from the box too; then the markup run's page: inert
                page.fill("#command-text", "resume run-x")
                page.click("#command-form button")
                page.wait_for_selector("#run-state .state-running", timeout=30_000)
                # 6. a run with several ranks: one curve per rank
                samples = [Sample(run_id="two-ranks", device=str(d), step=s, time=time.time(), loss=1.0 + d + s / 100)
                           for s in range(1, 30) for d in (0, 1)]
                assert bot.request("POST", "/v1/ingest", envelope([], run="two-ranks", samples=samples))[0] == 202
                page.goto(bot.url + "/console/runs/two-ranks")
                page.wait_for_function("() => window.msmonConsole.charts.loss && "
                                       "window.msmonConsole.charts.loss.series.length === 3")
                labels = page.evaluate("() => window.msmonConsole.charts.loss.series.slice(1).map(s => s.label)")
                assert labels == ["rank 0", "rank 1"]
                rank1 = page.evaluate("() => window.msmonConsole.charts.loss.data[2]")
                assert rank1 == pytest.approx([2.0 + s / 100 for s in range(1, 30)])
                page.goto(bot.url + "/console/runs/" + quote(XSS_RUN, safe=""))
                assert page.inner_text("h1 .run-id") == XSS_RUN
                page.wait_for_selector("#alerts tr[data-rule='grad_norm']")
            finally:
                browser.close()
    finally:
        job.deadline = 0.0
        trainer.join(60)
    assert not dialogs, dialogs  # no script from job data ran
    assert not [p for p in problems if "Content Security Policy" in p or "Refused" in p], problems
    assert (artifacts / "console.png").stat().st_size > 10_000
    if os.environ.get("MSMON_UPDATE_SCREENSHOT"):  # refresh the README's picture: MSMON_UPDATE_SCREENSHOT=1
        shutil.copy(artifacts / "console.png", Path(__file__).resolve().parents[3] / "docs" / "console.png")
    assert not math.isnan(sum(v for s, v in job.losses.items() if s < alert["first_step"] - 4))
