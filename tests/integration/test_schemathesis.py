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
    env = {"MSMON_ST_JOB": JOB, "MSMON_ST_OP": OPERATOR, "MSMON_ST_SIGN": SECRET}
    mp = pytest.MonkeyPatch()  # module-scoped: the function-scoped monkeypatch fixture cannot be used here
    for k, v in env.items():
        mp.setenv(k, v)
    b = BotServer({"bot": {
        "port": 0, "state_path": str(tmp / "bot.sqlite"), "tokens": [{"project": "default", "env": "MSMON_ST_JOB"}],
        "slack": {"signing_secret_env": "MSMON_ST_SIGN"},
        "console": {"charts": False, "charts_dir": str(tmp / "charts")},
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
