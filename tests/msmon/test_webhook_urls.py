"""msmon/common/urls.py's webhook_problem: a URL the bot posts alerts to is https, or http to this machine; anything
else (no URL at all, file://, plain http elsewhere) is refused, never with the URL (a secret) in the answer."""

from __future__ import annotations

from urllib.parse import urlsplit

from hypothesis import given
from hypothesis import strategies as st

from msmon.common.urls import loopback, webhook_problem


@given(st.text(max_size=200))
def test_any_text_is_judged_never_raises_and_never_echoes_the_url(text: str) -> None:
    problem = webhook_problem(text)
    if problem is None:
        parts = urlsplit(text)
        assert parts.scheme in ("https", "http") and parts.hostname
        assert parts.scheme == "https" or loopback(parts.hostname)
    elif len(text) > 12:
        assert text not in problem


def test_the_cases_seen() -> None:
    assert webhook_problem("https://open.feishu.cn/open-apis/bot/v2/hook/x") is None
    assert webhook_problem("http://127.0.0.1:8080/robot/send?access_token=t") is None
    assert webhook_problem("http://[::1]:9/x") is None and webhook_problem("http://localhost/x") is None
    assert "it starts with file://" in (webhook_problem("file:///etc/passwd") or "")
    assert "it has no scheme" in (webhook_problem("not a url") or "")
    assert "in the clear" in (webhook_problem("http://oapi.dingtalk.com/robot/send?access_token=t") or "")
    assert "has no host" in (webhook_problem("https:///x") or "")
