"""A real SMTP server (aiosmtpd) on loopback that keeps what it receives, parsed, for the email tests;
it can refuse every message or hang before answering, to test that nothing else waits for it."""

from __future__ import annotations

import email
import email.policy
import socket
import threading
import time
from collections.abc import Iterator
from email.message import EmailMessage
from typing import Any

import pytest
from aiosmtpd.controller import Controller


class Inbox:
    """aiosmtpd's handler: the messages received, with their envelope recipients."""

    def __init__(self) -> None:
        self.messages: list[tuple[list[str], EmailMessage]] = []
        self.refuse = False  # answer 451 to every DATA
        self.hang = 0.0  # seconds to sit on DATA before answering
        self.lock = threading.Lock()

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802 - aiosmtpd's name
        if self.hang:
            import asyncio

            await asyncio.sleep(self.hang)
        if self.refuse:
            return "451 4.3.0 try again later (the test server refuses)"
        msg = email.message_from_bytes(envelope.content, policy=email.policy.default)
        assert isinstance(msg, EmailMessage)
        with self.lock:
            self.messages.append((list(envelope.rcpt_tos), msg))
        return "250 OK"

    def wait(self, n: int, timeout: float = 10.0) -> list[tuple[list[str], EmailMessage]]:
        """The first `n` messages once they are in (fewer after `timeout`)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self.lock:
                if len(self.messages) >= n:
                    return list(self.messages)
            time.sleep(0.02)
        with self.lock:
            return list(self.messages)


def _free_port() -> int:
    """A port free now (aiosmtpd's Controller connects to its own port to check it started: no port 0)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class SMTPServer:
    def __init__(self) -> None:
        self.inbox = Inbox()
        self.controller = Controller(self.inbox, hostname="127.0.0.1", port=_free_port())

    def start(self) -> SMTPServer:
        self.controller.start()
        return self

    @property
    def port(self) -> int:
        return int(self.controller.port)

    def stop(self) -> None:
        self.controller.stop()


@pytest.fixture
def smtp() -> Iterator[SMTPServer]:
    server = SMTPServer().start()
    try:
        yield server
    finally:
        server.stop()
