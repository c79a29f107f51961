"""docs/openapi.yaml against the live bot: schemathesis generates requests for every operation from the spec
(valid ones, and ones that break it), sends them to the real aiohttp app on a loopback port with real
tokens, and checks each answer: no 5xx, a status code the spec lists, a body matching the spec's schema.

Bounded and repeatable: a fixed number of cases per operation and mode, derandomized, no shrinking, no
example database. The figures (cases run, failures) are printed; -s shows them.
"""

from __future__ import annotations

import time

import pytest

schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis.errors import Unsatisfiable  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import response_schema_conformance, status_code_conformance  # noqa: E402

from tests.conftest import ROOT  # noqa: E402
from tests.fakes.bot_server import BotServer  # noqa: E402
from tests.fakes.slack_signing import SECRET  # noqa: E402

CHECKS = [not_a_server_error, status_code_conformance, response_schema_conformance]
CASES_PER_MODE = 25  # per operation and mode; those without inputs have one case, and nothing to break
JOB, OPERATOR = "job-token", "operator-token"


@pytest.fixture(scope="module")
def bot(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("schemathesis")
    env = {"MSMON_ST_JOB": JOB, "MSMON_ST_OP": OPERATOR, "MSMON_ST_SIGN": SECRET,
           # the IM edges are served too (their routes are in the spec)
           "FEISHU_VERIFICATION_TOKEN": "st-token", "FEISHU_ENCRYPT_KEY": "st-key", "DINGTALK_APP_SECRET": "st-secret",
           "MSMON_CHART_LINK_SECRET": "st-link"}
    mp = pytest.MonkeyPatch()  # module-scoped: the function-scoped monkeypatch fixture cannot be used here
    for k, v in env.items():
        mp.setenv(k, v)
    b = BotServer({"bot": {
        "port": 0, "state_path": str(tmp / "bot.sqlite"), "tokens": [{"project": "default", "env": "MSMON_ST_JOB"}],
        "slack": {"signing_secret_env": "MSMON_ST_SIGN"},
        "console": {"charts": False, "charts_dir": str(tmp / "charts")},
        "chart_links": {"public_url": "http://bot.example"},
        "commands": {"long_poll": 0.01, "allow": [{"project": "*", "users": ["cli:carol"]}],
                     "operators": [{"user": "cli:carol", "env": "MSMON_ST_OP"}]}}})
    yield b
    b.stop()
    mp.undo()


def _token(path: str) -> str:
    return OPERATOR if path.startswith(("/v1/commands", "/v1/outbox")) and path != "/v1/commands/poll" else JOB


def _cases(op, mode, bot, ran):
    """One operation's cases in one generation mode, sent to the bot and checked."""
    headers = {"Authorization": f"Bearer {_token(op.path)}"}

    @settings(max_examples=CASES_PER_MODE, derandomize=True, database=None, deadline=None,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    @given(case=op.as_strategy(generation_mode=mode))
    def check(case):
        ran[0] += 1
        response = case.call(base_url=bot.url, headers=headers, timeout=10)
        case.validate_response(response, checks=CHECKS)

    return check


@pytest.mark.slow  # about 20 s on two cores
def test_the_live_bot_matches_its_openapi_spec(bot, capsys):
    schema = schemathesis.openapi.from_path(str(ROOT / "docs" / "openapi.yaml"))
    failures: list[str] = []
    ran = [0]
    t0 = time.monotonic()
    for result in schema.get_all_operations():
        op = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            try:
                _cases(op, mode, bot, ran)()
            except Unsatisfiable:  # negative mode, an operation without parameters or body: nothing to break
                continue
            except BaseException as exc:  # noqa: BLE001 - a FailureGroup: collect every operation's, report them all
                if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                    raise
                failures.append(f"{op.label} ({mode.value}): {exc}")
    with capsys.disabled():
        print(f"\nschemathesis: {ran[0]} cases in {time.monotonic() - t0:.1f} s, {len(failures)} failing "
              "operation/mode pairs")
    assert not failures, "\n\n".join(failures)
    assert ran[0] >= 200  # the run really covered the API


def test_a_store_that_fails_answers_the_job_routes_with_the_spec_s_503_and_its_retry_after(monkeypatch, bot_server):
    """The database away (PostgreSQL behind a proxy that is cut): each job-facing route answers 503 with
    Retry-After, and that answer is one docs/openapi.yaml lists (status, body and headers)."""
    import json

    from schemathesis.specs.openapi.checks import response_headers_conformance

    from msmon.contract.wire import ActionRequest, Heartbeat, Poll, Severity, encode
    from tests.bot.store.test_store_contract import CutProxy
    from tests.fakes import postgres
    from tests.fakes.records import envelope, event

    postgres.required()
    from urllib.parse import urlsplit

    monkeypatch.setenv("MSMON_ST_JOB", JOB)
    now = time.time()
    bodies = {
        "/v1/ingest": json.loads(envelope([event(step=200)], project="default")),
        "/v1/heartbeat": json.loads(encode(Heartbeat(run_id="run-42", device="0", time=now, step=200))),
        "/v1/commands/poll": json.loads(encode(Poll(run_id="run-42", device="0", after=0, wait=0))),
        "/v1/actions/request": json.loads(encode(ActionRequest(
            run_id="run-42", device="0", step=200, time=now, rule="nonfinite", severity=Severity.ERROR,
            action="pause", rank=0))),
    }
    schema = schemathesis.openapi.from_path(str(ROOT / "docs" / "openapi.yaml"))
    pg = urlsplit(postgres.PG_URL)
    proxy = CutProxy(pg.hostname or "127.0.0.1", pg.port or 5432)
    url = postgres.PG_URL.replace(f"{pg.hostname}:{pg.port}", f"127.0.0.1:{proxy.port}")
    with postgres.fresh_schema() as store_schema:
        bot = bot_server({"bot": {"port": 0, "tokens": [{"project": "default", "env": "MSMON_ST_JOB"}],
                                  "store": {"url": url, "schema": store_schema},
                                  "commands": {"long_poll": 0.01}}})
        try:
            assert bot.request("POST", "/v1/ingest", envelope([event()], project="default"))[0] == 202
            proxy.cut()  # the database is away: every call fails, a reconnection too
            for path, body in bodies.items():
                case = schema[path]["POST"].Case(body=body, media_type="application/json")
                response = case.call(base_url=bot.url, headers={"Authorization": f"Bearer {JOB}"}, timeout=10)
                assert response.status_code == 503, (path, response.text)
                assert response.headers.get("retry-after") == ["2"], path
                case.validate_response(response, checks=[status_code_conformance, response_schema_conformance,
                                                         response_headers_conformance])
        finally:
            bot.stop()
            proxy.close()
