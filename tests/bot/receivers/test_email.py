"""Escalation email read back from a real SMTP server (aiosmtpd on loopback): both parts, the inline
chart, the signed ack link (once, and never after it expires); an SMTP server that refuses or hangs
never delays the Slack path, and its failures are said in the channel and at /metrics."""

from __future__ import annotations

import re
import time
import urllib.request
from typing import Any

import pytest

from msmon.contract.wire import Poll, encode
from tests.fakes.bot_server import BotServer, send, wait_for
from tests.fakes.helpers import FakeClock
from tests.fakes.records import envelope, event
from tests.fakes.slack_api import SlackAPIServer
from tests.fakes.smtp import ESCALATION_ENV, Logins, SMTPServer, escalating_bot_config, self_signed

pytest.importorskip("aiosmtpd")

MAIL_FIRST = {"levels": [{"after": 0, "email": ["oncall@example.org"]}, {"after": 600, "mention": ["U0LEAD"]}]}


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in ESCALATION_ENV.items():
        monkeypatch.setenv(name, value)


def start(bot_server: Any, tmp_path: Any, slack: SlackAPIServer, smtp: SMTPServer, clock: FakeClock,
          **email: Any) -> BotServer:
    return bot_server(escalating_bot_config(tmp_path, slack.base_url, smtp.port, MAIL_FIRST, ack_link_ttl=3600,
                                            **email), clock=clock, escalation_period=0.05)


def ack_path(msg: Any) -> str:
    link = re.search(r"http://msmon\.example\.org(/ack/\S+)", msg.get_body(("plain",)).get_content())
    assert link, "no acknowledge link in the mail"
    return link.group(1)


def post(bot: BotServer, path: str) -> tuple[int, str]:
    status, body = send(urllib.request.Request(bot.url + path, data=b"", method="POST"))
    return status, str(body)


def test_the_mail_has_both_parts_the_chart_inline_and_a_subject_for_a_phone(tmp_path, slack, smtp, bot_server):
    bot = start(bot_server, tmp_path, slack, smtp, FakeClock())
    bot.request("POST", "/v1/ingest", envelope([event(run="run-<b>&42")], run="run-<b>&42"))
    (rcpts, msg), = smtp.inbox.wait(1)
    assert rcpts == ["oncall@example.org"] and msg["To"] == "oncall@example.org"
    assert msg["From"] == "msmon@bot.example.org"
    assert msg["Subject"] == "[msmon ERROR] run-<b>&42 grad_norm 12 > 10 at step 100"
    assert re.fullmatch(r"<msmon\.esc1\.step0\.[0-9a-f]{8}@bot\.example\.org>", msg["Message-ID"])
    text = msg.get_body(("plain",)).get_content()
    assert "run-<b>&42 on 1 device has been in ERROR for 0 s" in text and "what to do: Save a checkpoint" in text
    html = msg.get_body(("html",))
    body = html.get_content()
    assert "run-&lt;b&gt;&amp;42" in body and "<b>&42" not in body  # job data escaped in HTML
    assert 'src="cid:chart@msmon"' in body and ">Acknowledge</a>" in body
    images = [p for p in msg.walk() if p.get_content_type() == "image/png"]
    assert len(images) == 1 and images[0]["Content-ID"] == "<chart@msmon>"
    assert images[0].get_content()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_ack_link_works_once_and_not_after_it_expires(tmp_path, slack, smtp, bot_server):
    clock = FakeClock()
    bot = start(bot_server, tmp_path, slack, smtp, clock)
    bot.request("POST", "/v1/ingest", envelope([event()]))
    (_, first), = smtp.inbox.wait(1)
    path = ack_path(first)
    status, page = send(urllib.request.Request(bot.url + path))  # a mail scanner's GET acks nothing
    assert status == 200 and '<form method="post">' in page
    assert bot.store.escalations.of()[0]["state"] == "active"
    assert post(bot, path[:-1] + ("0" if path[-1] != "0" else "1"))[0] == 403  # tampered
    status, page = post(bot, path)
    assert status == 200 and "acknowledged grad_norm of run run-42" in page
    assert wait_for(lambda: bot.store.escalations.of()[0]["state"] == "acked", 5)
    assert bot.store.escalations.of()[0]["acked_by"] == "email link (escalation 1)"
    # the job hears of it as of an ack in chat: its rule takes the level it holds as the new normal
    code, polled = bot.request("POST", "/v1/commands/poll", encode(Poll(run_id="run-42", device="0", wait=0)))
    assert code == 200, polled
    acks = [c for c in polled["commands"] if c["action"] == "acknowledge"]
    assert [c["params"] for c in acks] == [{"rule": "grad_norm"}], polled
    assert acks[0]["issued_by"].startswith("email link"), acks
    assert post(bot, path)[0] == 409  # once only
    clock.advance(600)
    time.sleep(0.5)
    assert not [m for m in slack.messages() if "U0LEAD" in m.get("text", "")]  # level 2 never came

    bot.request("POST", "/v1/ingest", envelope([event(rule="loss_spike")]))
    _, second = smtp.inbox.wait(2)[1]
    clock.advance(3601)
    status, page = post(bot, ack_path(second))
    assert status == 410 and "expired" in page
    assert bot.store.escalations.of()[1]["state"] == "active"


@pytest.mark.timing  # a wall-clock bound: run alone, after the rest (make unit)
@pytest.mark.parametrize("trouble", ["refuse", "hang"])
def test_an_smtp_server_that_refuses_or_hangs_never_delays_slack(tmp_path, slack, smtp, trouble, bot_server):
    if trouble == "refuse":
        smtp.inbox.refuse = True
    else:
        smtp.inbox.hang = 6.0  # over the bot's SMTP timeout
    clock = FakeClock()
    # A Slack post that waited for SMTP would take at least the SMTP timeout (4 s): the bound below (3 s) leaves a
    # loaded machine room to deliver, and still fails if the two paths ever share a wait.
    bot = start(bot_server, tmp_path, slack, smtp, clock, timeout=4.0)
    t0 = time.monotonic()
    bot.request("POST", "/v1/ingest", envelope([event()]))
    assert wait_for(lambda: any(m["text"].startswith("ERROR grad_norm") for m in slack.messages()), 5)
    first = time.monotonic() - t0
    bot.request("POST", "/v1/ingest", envelope([event(rule="loss_spike")]))
    t1 = time.monotonic()
    assert wait_for(lambda: any(m["text"].startswith("ERROR loss_spike") for m in slack.messages()), 5)
    assert first < 3.0 and time.monotonic() - t1 < 3.0, "Slack waited for SMTP"
    assert wait_for(lambda: any("could not email oncall@example.org" in m["text"] for m in slack.messages()), 10)
    said = next(m["text"] for m in slack.messages() if "could not email" in m["text"])
    assert "retrying with backoff" in said and "[msmon ERROR] run-42 grad_norm" in said
    status, metrics = bot.request("GET", "/metrics")
    assert re.search(r'msmon_delivery_errors_total\{receiver="email"\} [1-9]', metrics)
    smtp.inbox.refuse, smtp.inbox.hang = False, 0.0
    clock.advance(1.0)  # the retries' backoff (on the bot's clock) has passed
    assert len(smtp.inbox.wait(2, timeout=15)) == 2  # retried until the server takes them


@pytest.mark.filterwarnings("ignore:Requiring AUTH while not requiring TLS")  # the ssl case: TLS from the start
@pytest.mark.parametrize("tls", ["starttls", "ssl"])
def test_mail_over_tls_with_credentials_from_the_environment(tmp_path, slack, monkeypatch, tls, bot_server):
    monkeypatch.setenv("MSMON_SMTP_USER", "msmon-bot")
    monkeypatch.setenv("MSMON_SMTP_PASSWORD", "s3cret")
    cert = self_signed(tmp_path)
    logins = Logins("msmon-bot", "s3cret")
    with SMTPServer(tls, cert, logins) as server:
        bot = start(bot_server, tmp_path, slack, server, FakeClock(), tls=tls, ca_file=cert[0],
                    username_env="MSMON_SMTP_USER")
        bot.request("POST", "/v1/ingest", envelope([event()]))
        (rcpts, msg), = server.inbox.wait(1)
        assert rcpts == ["oncall@example.org"] and msg["Subject"].startswith("[msmon ERROR] run-42 grad_norm")
        assert logins.seen == ["msmon-bot"]
