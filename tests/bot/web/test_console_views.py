"""The run page a person keeps open, in a real browser (Playwright driving Debian's Chromium) against the real bot:
three real MindSpore CPU traces (data/backtest/mindspore-cpu, made by bench/gen_backtest_traces.py) replayed
through a real `Monitor` whose transport posts to the bot as a job's does, and a 64-rank run posted over the
real ingest. What is checked, on each page's own uPlot charts and canvas:

- a NaN stretch is a gap in the curve, with a note saying at which steps the values were not finite;
- the x axis reaches back to where the firing alerts began, also when the bot keeps only later samples;
- alert labels do not run into each other; tick labels fit (150k, not a cut "000,000"); a constant LR is one
  line in the middle of its panel; the x axis says the wall-clock time under the step;
- a `status` typed into the command box shows its answer, and a pause's result is added to the answer when
  the job has applied it.

Screenshots of the three pages are saved as test artifacts (under $MSMON_ARTIFACTS when set, else pytest's tmp
dir)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.fakes.browser import CHROMIUM, CHROMIUM_ARGS, artifacts_dir, new_page

if not os.path.exists(CHROMIUM):
    pytest.skip(f"{CHROMIUM} is absent (apt-get install chromium; tools/test-services.sh does)",
                allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install msmon[dev])")
pytest.importorskip("aiohttp")

from bot.app import STATE  # noqa: E402
from msmon.contract.wire import Envelope, Sample, encode  # noqa: E402
from msmon.offline.readers import read_csv  # noqa: E402
from msmon.offline.replay import replay  # noqa: E402
from notifier import Monitor  # noqa: E402
from notifier.config import load_config  # noqa: E402
from notifier.transport import BotTransport  # noqa: E402
from tests.conftest import ROOT  # noqa: E402
from tests.fakes.bot_server import BotServer, wait_for  # noqa: E402

# the module stays on one xdist worker (make unit: --dist loadscope); xdist_group("chromium") would also keep the
# two browser modules on one, but pytest-xdist 3.8 cannot name groups under pytest 9.2 (Item._nodeid is gone)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("chromium")]
TRACES = ROOT / "data" / "backtest" / "mindspore-cpu"


@pytest.fixture
def artifacts(tmp_path) -> Path:
    return artifacts_dir(tmp_path)


@pytest.fixture
def bot(tmp_path, monkeypatch, bot_server):
    monkeypatch.setenv("MSMON_TEST_TOKEN", "job-token")
    monkeypatch.setenv("ALICE_TOKEN", "alice-console-token")
    b = bot_server({"bot": {
        "port": 0, "host": "127.0.0.1", "state_path": str(tmp_path / "bot.sqlite"), "window_samples": 50,
        "tokens": [{"project": "llm", "env": "MSMON_TEST_TOKEN"}],
        "console": {"charts": False, "web": {"stream_interval": 0.25}},
        "pipeline": {"group_wait": 0.1, "heartbeat_timeout": 3600, "stall_timeout": 3600},
        "rate_limit": {"per_channel": 1000, "per_run": 1000, "global_rate": 1000, "burst": 1000},
        "commands": {"operators": [{"user": "cli:alice", "env": "ALICE_TOKEN"}],
                     "allow": [{"project": "llm", "users": ["cli:alice"]}]}}})
    yield b


def report(bot: BotServer, trace: str, run: str, tmp_path: Path) -> None:
    """Replay a real trace through a Monitor that reports to `bot` as a training job would."""
    cfg = load_config(str(ROOT / "config" / "monitor.yaml"))
    cfg.bot.url, cfg.bot.token_env, cfg.bot.project = bot.url, "MSMON_TEST_TOKEN", "llm"
    cfg.bot.spool_dir = str(tmp_path / f"spool-{run}")
    cfg.tensorboard.enable = False
    cfg.csv.enable = False
    transport = BotTransport(bot.url, run, "0", "job-token", spool_dir=cfg.bot.spool_dir, flush_interval=0.05,
                             project="llm")
    mon = Monitor(cfg, run, transport=transport)
    replay(read_csv(str(TRACES / trace)), StillRunning(mon))  # closing the Monitor flushes its transport


class StillRunning:
    """The Monitor of a job that goes on after the trace: closed without saying the run ended (a page is kept
    open on a live run, whose firing alerts stay firing)."""

    def __init__(self, mon: Monitor) -> None:
        self.mon = mon

    def __getattr__(self, name: str):
        return getattr(self.mon, name)

    def close(self) -> None:
        self.mon.close(ended=False)


def login(page, bot: BotServer) -> None:
    page.goto(bot.url + "/")  # the bot's own address opens the console (its login first)
    assert "/console/login" in page.url
    page.fill("input[name=token]", "alice-console-token")
    page.click("button[type=submit]")
    page.wait_for_selector("#runs")


def open_run(page, bot: BotServer, run: str) -> None:
    page.goto(f"{bot.url}/console/runs/{run}")
    page.wait_for_function("() => window.msmonConsole && window.msmonConsole.charts.loss && "
                           "window.msmonConsole.charts.loss.data[0].length > 10")
    page.wait_for_timeout(600)  # the alerts' event and a redraw


CHART = """(key) => { const u = window.msmonConsole.charts[key];
    return {min: u.scales.x.min, max: u.scales.x.max, xs: u.data[0], ys: u.data.slice(1), labels: u.labels || [],
            ymin: u.scales.y.min, ymax: u.scales.y.max, series: u.series.length,
            note: document.querySelector('#chart-' + key + ' .note').textContent,
            ticks: u.axes.map(a => (a._values || []).map(String))}; }"""


def overlapping(labels: list[dict]) -> list[tuple[str, str]]:
    out = []
    for i, a in enumerate(labels):
        for b in labels[i + 1:]:
            if a["row"] == b["row"] and a["x"] < b["x"] + b["w"] and b["x"] < a["x"] + a["w"]:
                out.append((a["rule"], b["rule"]))
    return out


def test_nan_spike_and_64_ranks_pages_read_right(bot, tmp_path, artifacts):
    report(bot, "nan.csv", "nan-run", tmp_path)
    report(bot, "lr-jump.csv", "spike-run", tmp_path)
    throughput = list(read_csv(str(TRACES / "clean-throughput.csv")))[:300]
    now = time.time()
    for rank in range(64):  # 64 ranks of one run, each a little apart, over the real ingest
        samples = [Sample(run_id="wide-run", device=str(rank), step=r.step, time=now - 300 + r.step,
                          loss=(r.loss or 1.0) * (1 + rank / 400),
                          samples_per_s=(r.throughput or 0.0) * (1 + rank / 100),
                          learning_rate=2e-5, grad_norm=r.grad_norm) for r in throughput]
        sent = Envelope(run_id="wide-run", device=str(rank), sent_at=now, project="llm", rank=rank, samples=samples)
        code, body = bot.request("POST", "/v1/ingest", encode(sent))
        assert code == 202, body
    def firing(run: str) -> list[dict]:
        bot.app[STATE].flush()
        return bot.store.alerts(run, "firing")

    assert wait_for(lambda: firing("spike-run") and firing("nan-run"), timeout=30)
    nan_alert = next(a for a in firing("nan-run") if a["rule"] == "nonfinite")
    spike_first = min(a["first_step"] for a in firing("spike-run"))

    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = new_page(browser, 1400, 1100)
            problems: list[str] = []
            page.on("pageerror", lambda exc: problems.append(str(exc)))
            login(page, bot)

            # 1. NaN: a gap where the loss was NaN, the note says where, the nonfinite alert in view
            open_run(page, bot, "nan-run")
            loss = page.evaluate(CHART, "loss")
            steps = loss["xs"]
            gap = [s for s, v in zip(steps, loss["ys"][0], strict=True) if v is None]
            # the bot keeps the last 50 samples (window_samples): all NaN, the panel a gap that says why
            assert gap == steps and min(gap) > nan_alert["first_step"] and max(gap) == 2200, (gap[:3], gap[-3:])
            assert f"not finite (NaN or Inf) at steps {steps[0]:,}-2,200" in loss["note"], loss["note"]
            assert f"the alerts began at step {nan_alert['first_step']:,}" in loss["note"], loss["note"]
            assert loss["min"] <= nan_alert["first_step"] <= loss["max"]
            lr = page.evaluate(CHART, "learning_rate")
            assert lr["ymin"] < 0.05 < lr["ymax"] and (lr["ymax"] - lr["ymin"]) > 0.04  # flat LR: one line, mid-panel
            assert any(":" in t for t in loss["ticks"][0]), loss["ticks"][0]  # the wall-clock time under the step
            page.screenshot(path=str(artifacts / "console-nan.png"), full_page=True)

            # 2. a spike: the bot keeps the last 600 samples, the x axis still reaches back to where alerts began
            open_run(page, bot, "spike-run")
            loss = page.evaluate(CHART, "loss")
            assert loss["xs"][0] > spike_first, (loss["xs"][0], spike_first)  # the window starts after it ...
            assert loss["min"] <= spike_first, (loss["min"], spike_first)  # ... and the axis does not
            assert f"the alerts began at step {spike_first:,}" in loss["note"], loss["note"]
            for key in ("loss", "grad_norm", "learning_rate"):
                assert not overlapping(page.evaluate(CHART, key)["labels"]), key
            page.fill("#command-text", "status spike-run")
            page.click("#command-form button")
            page.wait_for_function("() => document.getElementById('answer').textContent.includes('spike-run')")
            answer = page.inner_text("#answer")
            assert "step 3,000" in answer and "FIRING" in answer, answer
            page.screenshot(path=str(artifacts / "console-spike.png"), full_page=True)

            # 3. 64 ranks: one curve each, tick labels that fit
            open_run(page, bot, "wide-run")
            page.wait_for_function("() => window.msmonConsole.charts.throughput.series.length === 65")
            tp = page.evaluate(CHART, "throughput")
            assert tp["series"] == 65
            yticks = [t for t in tp["ticks"][1] if t]
            assert yticks and all(len(t) <= 6 for t in yticks) and any(t.endswith("k") for t in yticks), yticks
            assert "samples/s" in page.inner_text("#chart-throughput figcaption")
            page.screenshot(path=str(artifacts / "console-64-ranks.png"), full_page=True)
            assert not problems, problems
        finally:
            browser.close()
    for name in ("console-nan.png", "console-spike.png", "console-64-ranks.png"):
        assert (artifacts / name).stat().st_size > 10_000, name
