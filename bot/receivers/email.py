"""Escalation email over SMTP (aiosmtplib): text and HTML parts, the metric chart inline, threaded.

The outbox delivers a `Mail` row through `EmailReceiver.mail` on a worker of its own (bot/delivery/worker.py,
the email lane), so retries with backoff and dead letters are the outbox's, and a server that refuses
or hangs never holds a chat message. TLS is `ssl` (implicit TLS, port 465) or `starttls` (587); the
user name and password come from the environment (bot.email.username_env / password_env).

Job data in the HTML part goes through `escape_html`; the text part is plain text. Every step of one
alert carries `In-Reply-To` and `References` of the alert's first mail, so mail clients show one
conversation. A recipient the server refuses (a 550) while it takes the others is kept in the row, said
in the channel and retried (PartlyRefused); the first line's "in ERROR for N" is the alert's age when
the mail is sent.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from email.message import EmailMessage
from email.utils import formatdate

import aiosmtplib
import msgspec

from bot.receivers import DeliveryError, Mail, Message, Note, PartlyRefused
from bot.receivers.render import cost_line, escape_html
from msmon.contract.wire import Event, decode

log = logging.getLogger("msmon.bot")

CHART_CID = "chart@msmon"


class EmailReceiver:
    """Sends `Mail`; the chat methods of a Receiver have nothing to do here (no route names `email`)."""

    name = "email"
    charts = True

    def __init__(self, host: str, port: int, tls: str, sender: str, timeout: float,
                 username_env: str | None = None, password_env: str | None = None, ca_file: str | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.host, self.port, self.tls, self.sender, self.timeout = host, port, tls, sender, timeout
        self.clock = clock
        self.username_env, self.password_env, self.ca_file = username_env, password_env, ca_file

    async def mail(self, m: Mail) -> None:
        """Send one mail; DeliveryError on any failure (refused, timed out, connection lost)."""
        msg = await self.build(m)
        user = os.environ.get(self.username_env) if self.username_env else None
        password = os.environ.get(self.password_env) if (user and self.password_env) else None
        try:
            refused, _ = await asyncio.wait_for(aiosmtplib.send(
                msg, hostname=self.host, port=self.port, username=user, password=password,
                use_tls=self.tls == "ssl", start_tls=self.tls == "starttls", cert_bundle=self.ca_file,
                timeout=self.timeout), self.timeout * 2)
        except (aiosmtplib.SMTPException, OSError, asyncio.TimeoutError) as exc:
            raise DeliveryError(f"SMTP {self.host}:{self.port} failed: {type(exc).__name__}: "
                                f"{str(exc).strip()[:200]}") from None
        if refused:  # taken for the others: these are retried (and said in the channel)
            said = "; ".join(f"{to}: {r.code} {r.message}"[:200] for to, r in refused.items())
            raise PartlyRefused(f"SMTP {self.host}:{self.port} refused {len(refused)} of {len(m.to)} recipients "
                                f"({said})", list(refused))

    async def build(self, m: Mail) -> EmailMessage:
        """The MIME message: multipart/alternative of text and HTML, the chart related to the HTML."""
        msg = EmailMessage()
        msg["Subject"] = m.subject
        msg["From"] = self.sender
        msg["To"] = ", ".join(m.to)
        msg["Date"] = formatdate(localtime=False)
        msg["Message-ID"] = m.message_id
        if m.thread:
            msg["In-Reply-To"] = m.thread
            msg["References"] = m.thread
        ack = f"\n\nAcknowledge (stops the escalation): {m.ack_url}" if m.ack_url else ""
        text = self.aged(m, self.clock())
        msg.set_content(text + ack)
        chart = await self._chart(m)
        body = "<br>\n".join(escape_html(line) for line in text.split("\n"))
        if m.ack_url:
            body += f'<p><a href="{escape_html(m.ack_url)}">Acknowledge</a> (stops the escalation)</p>'
        if chart is not None:
            body += f'<p><img src="cid:{CHART_CID}" alt="metric chart"></p>'
        msg.add_alternative(f"<html><body><p>{body}</p></body></html>", subtype="html")
        if chart is not None:
            html_part = msg.get_body(("html",))  # the HTML alternative just added
            assert isinstance(html_part, EmailMessage)
            html_part.add_related(chart, "image", "png", cid=f"<{CHART_CID}>", filename="chart.png")
        return msg

    @staticmethod
    def aged(m: Mail, now: float) -> str:
        """The mail's text with its first line (how long the alert has been firing, what it cost) as of `now`,
        the time it is sent, not the time it was queued."""
        if not m.since or not m.event_json:
            return m.text
        try:
            ev = decode(m.event_json, Event)
        except (msgspec.DecodeError, ValueError, TypeError):
            return m.text
        _, _, rest = m.text.partition("\n")
        return cost_line(ev.run_id, m.devices, ev.severity.value, m.since, now) + ("\n" + rest if rest else "")

    async def _chart(self, m: Mail) -> bytes | None:
        """The alert's chart (its event's metric window), or None when there is none or it fails."""
        if not m.event_json:
            return None
        try:
            event = decode(m.event_json, Event)
            if event.window is None or not event.window.steps:
                return None
            from bot.charts import render_chart_off_loop  # matplotlib imported in its thread

            return await render_chart_off_loop(event)
        except Exception as exc:  # noqa: BLE001 - the mail goes without its chart
            log.warning("msmon bot: the chart for mail %s could not be drawn (%s); sent without it", m.message_id,
                        exc)
            return None

    # -- a Receiver's chat methods: mail is the only thing this receiver takes ------------------------

    async def post(self, channel: str, msg: Message) -> str:
        raise DeliveryError("the email receiver sends escalation mail only; route alerts to console or slack")

    async def attach(self, channel: str, ref: str, msg: Message) -> None:
        """Nothing: a mail carries its chart inline."""

    async def update(self, channel: str, ref: str, msg: Message) -> None:
        """Nothing: a sent mail cannot be rewritten."""

    async def reply(self, channel: str, ref: str, msg: Message) -> None:
        """Nothing: replies are mails of their own (threaded by Mail.thread)."""

    async def note(self, note: Note) -> None:
        """Nothing: command answers go to chat."""
