"""Escalation mail under a partly refusing server: the real outbox's email lane, EmailReceiver over
aiosmtplib and a real aiosmtpd (tests/fakes/smtp.py) that answers 550 for one recipient and takes the
other. The refused recipient is said in the alert's channel and retried (only it: the other is not mailed
twice); the first line's "in ERROR for N" is the alert's age when the mail is sent, not when it was queued."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from bot.delivery.worker import Lane, Outbox
from bot.metrics import BotMetrics
from bot.pipeline.ratelimit import RateLimiter
from bot.pipeline.schedule import Policy
from bot.receivers import Mail, ReplyTo
from bot.receivers.console import ConsoleReceiver
from bot.receivers.email import EmailReceiver
from bot.store.sqlite import OutboxEntry, Store
from msmon.contract.wire import encode
from tests.fakes.im_harness import T0, Clock
from tests.fakes.records import event

pytest.importorskip("aiosmtpd")


def test_a_refused_recipient_is_said_in_the_channel_and_retried_alone(tmp_path, smtp):
    async def scenario() -> None:
        clock = Clock()
        store = Store(str(tmp_path / "bot.sqlite"))
        rx = EmailReceiver("127.0.0.1", smtp.port, "none", "msmon@bot.example.org", 5.0, clock=clock)
        outbox = Outbox(store, {"email": rx, "console": ConsoleReceiver(None)}, RateLimiter(100, 100, 100, 10),
                        BotMetrics(), clock, Policy(), lane=Lane("email", only=True))
        ev = event(run="run-42")
        mail = Mail(to=["oncall@example.org", "gone@example.org"], subject="[msmon ERROR] run-42",
                    text="run-42 on 8 devices has been in ERROR for 0 s (≈0.0 device-hours)\nERROR grad_norm",
                    message_id="<m1@bot.example.org>", event_json=encode(ev).decode(), report_via="console",
                    report_to=ReplyTo(channel="C0ALERTS"), since=T0 - 600, devices=8)
        store.enqueue_many([OutboxEntry(T0, "email", "email", "mail", "esc1|step1", "run-42",
                                        msgspec.json.encode(mail).decode(), T0)])
        smtp.inbox.unknown = {"gone@example.org"}
        await outbox.deliver_due()
        (rcpts, msg), = smtp.inbox.wait(1)
        assert rcpts == ["oncall@example.org"]
        assert msg.get_body(("plain",)).get_content().startswith("run-42 on 8 devices has been in ERROR for 10 min")
        notes = [r for r in store.due(T0 + 1) if r.kind == "note"]
        assert len(notes) == 1 and "gone@example.org" in notes[0].payload and "550" in notes[0].payload
        assert "oncall@example.org" not in notes[0].payload.split("could not email")[1].split("(")[0]
        smtp.inbox.unknown = set()
        clock.t = T0 + 120
        await outbox.deliver_due()
        smtp.inbox.wait(2)
        assert [r for r, _ in smtp.inbox.messages] == [["oncall@example.org"], ["gone@example.org"]]
        later = smtp.inbox.messages[1][1].get_body(("plain",)).get_content()
        assert later.startswith("run-42 on 8 devices has been in ERROR for 12 min")  # its age when sent
        assert store.depth() == 1  # the note for the console is what is left (another lane)
        store.close()
    asyncio.run(scenario())
