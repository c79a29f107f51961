"""The Feishu/Lark and DingTalk robot signatures against fixed vectors and the vendors' own sample code,
the send budget and the storm batching (pure, an injected clock), and one escape per chat markdown with
hostile job text.

The DingTalk vector uses the secret of DingTalk's own doc sample ("this is secret", timestamp
1577262236757); its signature holds `+`, which a naive query encoder would turn into a space. Both sets
of vectors were computed with the vendors' Python samples (as published alongside a Swift client's
tests), not by the code under test.
"""

from __future__ import annotations

import pytest

from bot.chat.robot import (
    Batcher,
    Budget,
    Done,
    Hold,
    Pace,
    Send,
    Summarise,
    dingtalk_sign,
    feishu_sign,
    signed_dingtalk_url,
)
from bot.receivers.render import escape_dingtalk, escape_feishu, escape_wecom
from tests.fakes import dingtalk_api, feishu_api


@pytest.mark.parametrize(("secret", "ts", "sign"), [
    ("demo-secret", 1_599_360_473, "3/MaVZ8JLIy4TUG+7KSFJqvUkTKd+HWY8g+56DZWq8s="),
    ("abcDEF123", 1_700_000_000, "qimCYnXKTZRVfEDjgpOq1ke9awsBuC3tn/n151vIck8="),
])
def test_feishu_signature_vectors(secret, ts, sign):
    assert feishu_sign(ts, secret) == sign
    assert feishu_api.expected_sign(str(ts), secret) == sign


@pytest.mark.parametrize(("secret", "ts", "sign"), [
    ("this is secret", 1_577_262_236_757, "hmPWwU%2B7lVdm3ZZz0r9tSfx0L4Q26jWOZr9%2BGs6EZQM%3D"),
    ("SEC1234567890abcdef", 1_700_000_000_000, "RqBq3E1RTBDv3n2QBCh4adZ2WHk9mVklyUoDBLxarjI%3D"),
])
def test_dingtalk_signature_vectors(secret, ts, sign):
    assert dingtalk_sign(ts, secret) == sign
    assert dingtalk_api.expected_sign(str(ts), secret) == sign
    url = signed_dingtalk_url("https://oapi.dingtalk.com/robot/send?access_token=abc", secret, ts)
    assert url.endswith(f"&timestamp={ts}&sign={sign}")


def test_the_two_constructions_differ():
    assert feishu_sign(1_700_000_000, "abcDEF123") != dingtalk_sign(1_700_000_000, "abcDEF123")


def test_budget_holds_every_window():
    b = Budget(((100, 60.0), (5, 1.0)))
    for i in range(5):
        assert b.wait(10.0 + i * 0.01) == 0.0
        b.take(10.0 + i * 0.01)
    assert b.wait(10.05) == pytest.approx(0.95)
    assert b.wait(11.0) == 0.0
    assert b.recent(11.0) == 5


def test_a_storm_costs_the_direct_share_plus_spaced_summaries_and_loses_nothing():
    """200 messages in a minute on DingTalk's pacing: 15 alone, then summaries 12 s apart; every message
    ends Done in one of them (a held row's retry finds its summary)."""
    budget = Budget(((20, 60.0),))
    batcher = Batcher(budget, Pace(direct=15, spacing=12.0))
    posts: list[tuple[float, list[str]]] = []
    pending = [f"m{i}" for i in range(200)]
    t = 0.0
    while pending and t < 300:
        for item in list(pending):
            d = batcher.decide(item, f"- {item}", t)
            if isinstance(d, Send):
                budget.take(t)
                posts.append((t, [item]))
                pending.remove(item)
            elif isinstance(d, Summarise):
                budget.take(t)
                posts.append((t, list(d.items)))
                batcher.summarised(d.items, f"ref{len(posts)}", t)
            elif isinstance(d, Done):
                pending.remove(item)
            else:
                assert isinstance(d, Hold) and d.wait >= 0
        t += 0.3
    assert not pending
    in_first_minute = [p for p in posts if p[0] < 60.0]
    assert len(in_first_minute) <= 20
    assert sorted(i for _, items in posts for i in items) == sorted(f"m{i}" for i in range(200))
    for start, _ in posts:  # no 60 s window, wherever it starts, holds more than DingTalk's 20
        assert len([p for p in posts if start <= p[0] < start + 60.0]) <= 20


HOSTILE = "<at id=all></at> <@ceo> @13800000000 [click](http://evil) ![x](http://evil/i.png) **b** # h\n> q &amp;"


@pytest.mark.parametrize("escape", [escape_feishu, escape_dingtalk, escape_wecom])
def test_hostile_job_text_is_shown_not_acted_on(escape):
    out = escape(HOSTILE)
    assert "<" not in out and ">" not in out  # no tag: <at>, <@user>, <font>
    assert "](" not in out and "\\[click\\]\\(" in out  # no link, no image
    assert "**" not in out and "\n" not in out  # no emphasis, no new line (no heading, no quote)
    assert "@13800000000" not in out and "@\u2060" in out  # no mention of a mobile or a user
    assert "&amp;amp;" in out  # an entity in job text stays text


def test_a_message_held_alone_goes_as_itself_once_there_is_room():
    budget = Budget(((2, 60.0),))
    batcher = Batcher(budget, Pace(direct=1, spacing=12.0))
    assert isinstance(batcher.decide("a", "- a", 0.0), Send)
    budget.take(0.0)
    summary = batcher.decide("b", "- b", 1.0)  # past the direct share, a summary slot is free
    assert isinstance(summary, Summarise) and list(summary.items) == ["b"]
    budget.take(1.0)
    batcher.summarised(summary.items, "ref2", 1.0)
    assert isinstance(batcher.decide("c", "- c", 2.0), Hold)  # the window is full
    assert isinstance(batcher.decide("c", "- c", 61.5), Send) and not batcher.held  # a and b are out of it
