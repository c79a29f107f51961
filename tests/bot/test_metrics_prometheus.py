"""msmon's /metrics read by a real Prometheus (Debian's prometheus on loopback): a PromQL query returns a
run's loss; the per-run series leave /metrics with the run (bounded by bot.max_runs); the delivery
figures by receiver; config/grafana-dashboard.json is a dashboard whose every query names metrics
msmon exports."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from pathlib import Path

import pytest

from msmon.contract.wire import Sample
from tests.fakes.bot_server import BotServer
from tests.fakes.prom import bot_config, job_post, prometheus, query
from tests.fakes.records import event

DASHBOARD = Path(__file__).resolve().parents[2] / "config" / "grafana-dashboard.json"
PROMQL_WORDS = {"sum", "by", "rate", "max", "min", "avg", "histogram_quantile", "le", "run", "rule", "severity",
                "receiver", "device", "label_values", "without", "irate", "increase"}


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MSMON_TEST_TOKEN", "job-token")


def samples(run: str, loss: float, step: int = 10) -> list[Sample]:
    return [Sample(run_id=run, device="0", step=step, time=time.time(), loss=loss, grad_norm=1.5, samples_per_s=64.0)]


def scrape(bot: BotServer, token: str = "job-token") -> str:
    req = urllib.request.Request(bot.url + "/metrics", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return str(resp.read().decode())


def exported(text: str) -> set[str]:
    """The sample names /metrics can carry: each family's, with a counter's _total and a histogram's parts."""
    names = set()
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M):
        names.add(name)
        names |= {f"{name}_total", f"{name}_created"} if kind == "counter" else set()
        names |= {f"{name}_{p}" for p in ("bucket", "sum", "count", "created")} if kind == "histogram" else set()
    return names


def test_prometheus_scrapes_msmon_and_promql_returns_a_runs_loss(tmp_path, bot_server):
    bot = bot_server(bot_config(tmp_path, []))
    job_post(bot, [], samples=samples("run-42", 2.5))
    with prometheus(tmp_path / "prom", f"127.0.0.1:{bot.port}", bearer="job-token") as prom:
        found = query(prom, 'msmon_run_loss{run="run-42"}')
        assert found, "Prometheus never returned the run's loss"
        assert found[0]["metric"]["device"] == "0" and float(found[0]["value"][1]) == 2.5
        assert float(query(prom, 'msmon_run_step{run="run-42"}')[0]["value"][1]) == 10


def test_a_run_leaves_metrics_when_it_leaves_the_windows(tmp_path, bot_server):
    bot = bot_server(bot_config(tmp_path, [], max_runs=2))
    job_post(bot, [event(run="run-a")], run="run-a", samples=samples("run-a", 3.0))
    text = scrape(bot)
    assert 'msmon_run_loss{device="0",run="run-a"} 3.0' in text
    assert 'msmon_run_alerts_firing{rule="grad_norm",run="run-a",severity="ERROR"} 1.0' in text
    for run in ("run-b", "run-c"):
        job_post(bot, [], run=run, samples=samples(run, 1.0))
    text = scrape(bot)
    assert 'run="run-a"' not in text  # forgotten past max_runs: every series of it is gone
    assert 'run="run-b"' in text and 'run="run-c"' in text
    assert re.search(r'msmon_outbox_queued\{receiver="console"\} \d', text)


def test_the_grafana_dashboard_queries_metrics_msmon_exports(tmp_path, bot_server):
    dash = json.loads(DASHBOARD.read_text())
    assert dash["title"] and dash["uid"] and isinstance(dash["schemaVersion"], int)
    panels = dash["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    bot = bot_server(bot_config(tmp_path, []))
    job_post(bot, [event()], samples=samples("run-42", 2.0))
    names = exported(scrape(bot))
    bot.stop()
    queries = [t["expr"] for p in panels for t in p["targets"]]
    queries += [v["definition"] for v in dash["templating"]["list"] if "definition" in v]
    assert queries and all(p["targets"] and set(p["gridPos"]) == {"h", "w", "x", "y"} for p in panels)
    for expr in queries:
        words = set(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", re.sub(r'"[^"]*"|\[[^\]]*\]', "", expr)))
        metrics = {w for w in words if w.startswith("msmon_")}
        assert metrics, f"no msmon metric in {expr!r}"
        assert metrics <= names, f"{expr!r} names {metrics - names}, which msmon does not export"
        assert words - metrics <= PROMQL_WORDS, f"unknown words in {expr!r}: {words - metrics - PROMQL_WORDS}"


def test_metrics_needs_a_token_and_a_projects_token_reads_its_own_runs_only(tmp_path, monkeypatch, bot_server):
    """No token: 401. Project llm's token: llm's runs and the bot's own series, never project b's run; the
    scrape token (bot.metrics_token_env) reads every project's; it cannot post an envelope."""
    import urllib.error

    from msmon.contract.wire import Envelope, encode

    monkeypatch.setenv("MSMON_B_TOKEN", "b-token")
    monkeypatch.setenv("MSMON_SCRAPE", "scrape-token")
    cfg = bot_config(tmp_path, [], metrics_token_env="MSMON_SCRAPE")
    cfg["bot"]["tokens"].append({"env": "MSMON_B_TOKEN", "project": "b"})
    bot = bot_server(cfg)
    job_post(bot, [], run="run-a", samples=samples("run-a", 3.0))
    body = encode(Envelope(run_id="secret-run-b", device="0", sent_at=time.time(), project="b",
                           samples=samples("secret-run-b", 7.0)))
    assert bot.request("POST", "/v1/ingest", body, token="b-token")[0] == 202
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(bot.url + "/metrics", timeout=10)
    assert info.value.code == 401 and info.value.headers["WWW-Authenticate"].startswith("Bearer")
    with pytest.raises(urllib.error.HTTPError) as info:
        scrape(bot, "wrong-token")
    assert info.value.code == 401
    llm = scrape(bot)
    assert 'run="run-a"' in llm and "secret-run-b" not in llm and "msmon_requests_total" in llm
    b = scrape(bot, "b-token")
    assert 'msmon_run_loss{device="0",run="secret-run-b"} 7.0' in b and 'run="run-a"' not in b
    every = scrape(bot, "scrape-token")
    assert 'run="run-a"' in every and 'run="secret-run-b"' in every
    assert bot.request("POST", "/v1/ingest", body, token="scrape-token")[0] == 401
