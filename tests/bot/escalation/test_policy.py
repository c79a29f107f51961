"""The escalation state machine (bot/escalation/policy.py): steps due by the clock, once each; ack,
resolution and silence; catching up after downtime; the cost of waiting."""

from __future__ import annotations

import dataclasses

from bot.config import EscalationLevel, EscalationPolicy
from bot.escalation.policy import AlertNow, Escalation, decide, step_at
from bot.receivers.render import cost_line, duration_text

POLICY = EscalationPolicy(levels=[EscalationLevel(after=0, mention=["U1"]),
                                  EscalationLevel(after=600, email=["oncall@x.org"]),
                                  EscalationLevel(after=1800, email=["lead@x.org"])], repeat=1, repeat_every=3600)
T0 = 1000.0
FIRING = AlertNow(firing=True)


def esc(**over: object) -> Escalation:
    return dataclasses.replace(Escalation(id=1, run_id="run-42", rule="grad_norm", policy="p", started_at=T0), **over)


def walk(times: list[float], alert: AlertNow = FIRING) -> list[tuple[float, list[int]]]:
    """Decide at each time in turn, keeping the state; (time, step numbers taken)."""
    e, out = esc(), []
    for t in times:
        d = decide(e, POLICY, alert, t)
        out.append((t, [s.number for s in d.steps]))
        e = d.escalation
    return out


def test_levels_are_due_at_their_delays_and_taken_once() -> None:
    taken = walk([T0, T0 + 1, T0 + 599, T0 + 600, T0 + 601, T0 + 1800, T0 + 3600, T0 + 4200, T0 + 5400, T0 + 9999])
    assert taken == [(T0, [0]), (T0 + 1, []), (T0 + 599, []), (T0 + 600, [1]), (T0 + 601, []), (T0 + 1800, [2]),
                     (T0 + 3600, [3]), (T0 + 4200, [4]), (T0 + 5400, [5]), (T0 + 9999, [])]


def test_next_at_says_when_to_look_again() -> None:
    d = decide(esc(), POLICY, FIRING, T0)
    assert d.next_at == T0 + 600
    last = decide(esc(next_step=5), POLICY, FIRING, T0 + 5400)
    assert [s.number for s in last.steps] == [5] and last.next_at is None


def test_overdue_steps_after_downtime_go_once_in_order() -> None:
    d = decide(esc(next_step=1), POLICY, FIRING, T0 + 2000)  # down from T0+1 to T0+2000
    assert [(s.number, s.level) for s in d.steps] == [(1, 1), (2, 2)]
    again = decide(d.escalation, POLICY, FIRING, T0 + 2001)
    assert again.steps == ()


def test_ack_stops_and_resolution_closes() -> None:
    acked = decide(esc(next_step=1), POLICY, AlertNow(firing=True, acked_by="U9"), T0 + 5000)
    assert acked.steps == () and acked.escalation.state == "acked" and acked.next_at is None
    resolved = decide(esc(next_step=1), POLICY, AlertNow(firing=False), T0 + 5000)
    assert resolved.steps == () and resolved.escalation.state == "resolved"
    assert decide(acked.escalation, POLICY, FIRING, T0 + 9000).steps == ()  # closed stays closed


def test_silence_pauses_and_the_chain_resumes_where_it_stopped() -> None:
    e = decide(esc(), POLICY, FIRING, T0).escalation  # level 1 at T0
    paused = decide(e, POLICY, AlertNow(firing=True, silenced=True), T0 + 300)
    assert paused.steps == () and paused.escalation.paused_at == T0 + 300
    still = decide(paused.escalation, POLICY, AlertNow(firing=True, silenced=True), T0 + 2000)
    assert still.steps == () and still.escalation.paused_at == T0 + 300  # the pause began at its start
    back = decide(still.escalation, POLICY, FIRING, T0 + 2300)  # 2000 s paused: level 2 is due at T0+2600
    assert back.steps == () and back.escalation.shift == 2000 and back.next_at == T0 + 2600
    assert [s.number for s in decide(back.escalation, POLICY, FIRING, T0 + 2600).steps] == [1]


def test_step_numbering_past_the_last_round() -> None:
    assert step_at(POLICY, esc(), 6) is None
    s = step_at(POLICY, esc(), 4)
    assert s is not None and (s.round, s.level, s.due_at) == (1, 1, T0 + 3600 + 600)


def test_cost_of_waiting() -> None:
    assert cost_line("run-42", 64, "ERROR", T0, T0 + 35 * 60) == \
        "run-42 on 64 devices has been in ERROR for 35 min (≈37 device-hours)"
    assert cost_line("r", 1, "ERROR", T0, T0 + 600) == "r on 1 device has been in ERROR for 10 min (≈0.2 device-hours)"
    assert duration_text(30) == "30 s" and duration_text(3 * 3600 + 300) == "3 h 05 min"
    assert duration_text(3 * 86400 + 7200) == "3 d 2 h"


def test_policy_config_errors_name_key_and_line(tmp_path) -> None:
    import pytest

    from bot.config import load_bot_config
    from msmon.config.errors import ConfigError

    path = tmp_path / "bot.yaml"
    path.write_text("bot:\n  escalations:\n    oncall:\n      levels:\n        - {after: 600, email: [a@x.org]}\n"
                    "        - {after: 0, email: [not-an-address]}\n")
    with pytest.raises(ConfigError) as err:
        load_bot_config(path)
    text = str(err.value)
    assert "bot.escalations.oncall.levels[1].email[0]: not an email address: 'not-an-address'  (bot.yaml:6)" in text
    assert "bot.escalations.oncall.levels: levels must be in order of `after`" in text
    assert "bot.email: escalation levels send email but bot.email.host is not set" in text
    path.write_text("bot:\n  escalations:\n    oncall: {levels: [{mention: [U1]}]}\n  routes:\n"
                    "    - {receiver: slack, channel: C1, escalation: oncal}\n")
    with pytest.raises(ConfigError) as err:
        load_bot_config(path)
    assert "bot.routes[0].escalation: no escalation policy 'oncal'; bot.escalations has oncall  (bot.yaml:5)" in \
        str(err.value)
