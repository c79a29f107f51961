"""Any parameter a hostile or broken client sends for a job action, through the real bot on loopback: a rank's
`POST /v1/actions/request` with any JSON as params, and an operator's `rewind` / `clip-grad` with any argument text
(`POST /v1/commands`). Each is a clear 4xx or a queued command whose parameters every rank takes
(msmon/contract/actions.py `check_params`, the check each rank makes again): never a 5xx, never a command every rank
refuses (issue 36: `skip -5`, `max_norm "abc"` and `clip-grad 1e-50` were queued)."""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("aiohttp")

from msmon.contract.actions import AUTOMATIC, ParamError, check_params  # noqa: E402
from msmon.contract.wire import Envelope, Sample, encode  # noqa: E402

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
NAMES = st.sampled_from(["skip", "to", "before", "max_norm", "factor", "timeout", "alert", "attempt", "rule", "x"])
SCALARS = (st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False, allow_infinity=False)
           | st.text(max_size=20) | st.sampled_from([0, -1, -5, 1e-50, 1e-40, 1e-38, 1e12, 1e13, 2**31, 2**53, "abc"]))
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=5)


@pytest.fixture
def bot(tmp_path, monkeypatch, bot_server):  # noqa: ANN001, ANN201
    monkeypatch.setenv("MSMON_TEST_TOKEN", "job-token")
    monkeypatch.setenv("MSMON_OPERATOR", "operator-token")
    b = bot_server({"bot": {"port": 0, "state_path": str(tmp_path / "bot.sqlite"),
                            "tokens": [{"project": "llm", "env": "MSMON_TEST_TOKEN"}], "console": {"charts": False},
                            "commands": {"operators": [{"user": "cli:ops", "env": "MSMON_OPERATOR"}],
                                         "allow": [{"users": ["cli:ops"]}]}}})
    now = time.time()
    for rank in (0, 1):
        body = encode(Envelope(run_id="dp", device=str(rank), sent_at=now, project="llm", rank=rank,
                               samples=[Sample(run_id="dp", device=str(rank), step=100, time=now, loss=2.0)]))
        assert b.request("POST", "/v1/ingest", body)[0] == 202
    return b


def _queued_params_are_taken_by_every_rank(action: str, params: dict) -> None:
    assert check_params(action, params) == params  # what each rank checks again: it takes them as they are


@SETTINGS
@given(action=st.sampled_from(AUTOMATIC), params=st.dictionaries(NAMES, VALUES, max_size=3))
def test_any_params_on_the_actions_api_are_a_4xx_or_a_command_every_rank_takes(bot, action, params):
    body = json.dumps({"run_id": "dp", "device": "1", "step": 100, "time": time.time(), "rule": "loss_spike",
                       "severity": "ERROR", "action": action, "params": params, "rank": 1}).encode()
    code, answer = bot.request("POST", "/v1/actions/request", body)
    assert code in (200, 202, 422), (code, answer)
    try:
        expected = check_params(action, params)
    except ParamError:
        expected = None
    if code == 422:
        assert answer["error"], answer
        return
    assert expected is not None, (params, answer)  # queued: the contract takes them
    _queued_params_are_taken_by_every_rank(action, answer["command"]["params"])


TOKENS = st.sampled_from(["to", "skip", "before", "before-alert", "off", "1e-50", "-5", "1e12", "0", "abc", "300",
                          "1,000", "2147483648", "nan", "inf", "1.5", "x2", "٣", "1_0"]) | st.text(max_size=12)


@SETTINGS
@given(verb=st.sampled_from(["rewind", "clip-grad"]), args=st.lists(TOKENS, max_size=5))
def test_any_rewind_or_clip_grad_text_is_a_4xx_or_a_command_every_rank_takes(bot, verb, args):
    text = " ".join([verb, "dp", *args])
    code, answer = bot.request("POST", "/v1/commands", json.dumps({"text": text}).encode(), token="operator-token")
    assert code in (200, 400, 403, 404, 409, 422), (code, answer)
    if code == 200 and answer.get("command"):
        cmd = answer["command"]
        _queued_params_are_taken_by_every_rank(cmd["action"], cmd["params"])
