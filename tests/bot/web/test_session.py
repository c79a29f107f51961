"""The console's logins (bot/web/session.py) and its HTML escaping (bot/web/pages.py), in process."""

from __future__ import annotations

from bot.web.pages import Markup, esc, page, run_href
from bot.web.session import Sessions, same_secret
from tests.fakes.helpers import FakeClock

TOKENS = [("llm", "", b"job-token"), ("*", "cli:alice", b"alice-token"), ("*", "cli:bob", b"bob-token")]


def test_only_an_operators_token_logs_in():
    s = Sessions(TOKENS, ttl=60, limit=10, clock=FakeClock())
    assert s.check_token("job-token") is None  # a job's token opens no console
    assert s.check_token("alice-token ").user == "cli:alice"  # type: ignore[union-attr]
    assert s.check_token("") is None and s.check_token("alice") is None and s.check_token("\udcff") is None


def test_a_login_expires_and_each_has_its_own_csrf_token():
    clock = FakeClock()
    s = Sessions(TOKENS, ttl=60, limit=10, clock=clock)
    a, b = s.login(s.check_token("alice-token")), s.login(s.check_token("bob-token"))  # type: ignore[arg-type]
    va, vb = s.get(a), s.get(b)
    assert va and vb and va.user == "cli:alice" and va.csrf and va.csrf != vb.csrf and a != b
    clock.advance(59)
    assert s.get(a) is not None
    clock.advance(1)
    assert s.get(a) is None and a not in s.live  # expired: forgotten
    s.logout(b)
    assert s.get(b) is None and s.get(None) is None and s.get("made-up") is None


def test_logins_are_bounded_the_oldest_goes_first():
    s = Sessions(TOKENS, ttl=600, limit=3, clock=FakeClock())
    alice = s.check_token("alice-token")
    sids = [s.login(alice) for _ in range(5)]  # type: ignore[arg-type]
    assert len(s.live) == 3 and s.get(sids[0]) is None and s.get(sids[1]) is None and s.get(sids[4]) is not None


def test_csrf_tokens_compare_exactly_and_never_empty():
    assert same_secret("abc", "abc") and not same_secret("abc", "abd") and not same_secret("", "")
    assert not same_secret(None, "abc") and not same_secret("abc", "") and not same_secret("\udcff", "x")


def test_pages_escape_every_value_but_their_own_markup():
    run = '<script>alert("x")</script>'
    out = page('<a href="{href}">{run}</a>{raw}', href=run_href(run), run=run, raw=Markup("<b>ok</b>"))
    assert out == ('<a href="/console/runs/%3Cscript%3Ealert%28%22x%22%29%3C%2Fscript%3E">'
                   '&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;</a><b>ok</b>')
    assert Markup("<p>") + "<i>" == "<p>&lt;i&gt;"  # text added to markup is escaped
    assert esc("a'b\x1b") == "a&#x27;b" and esc(None) == "" and esc(3) == "3"


def test_wrong_tokens_from_one_address_make_it_wait_a_minute():
    clock = FakeClock()
    s = Sessions(TOKENS, ttl=600, limit=10, clock=clock)
    for _ in range(10):
        assert s.may_try("10.0.0.9") == 0.0
        s.failed("10.0.0.9")
        clock.advance(1)
    assert s.may_try("10.0.0.9") == 50.0  # the first failure leaves the window in 50 s
    assert s.may_try("10.0.0.8") == 0.0  # another address is not held up
    clock.advance(50)
    assert s.may_try("10.0.0.9") == 0.0
