"""Fixtures the integration tests share: the local Slack-API-compatible server and a real SMTP server."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.fakes.slack_api import SlackAPIServer


@pytest.fixture
def slack() -> Iterator[SlackAPIServer]:
    with SlackAPIServer() as s:
        yield s


@pytest.fixture
def smtp() -> Iterator[Any]:
    """aiosmtpd on loopback (tests/fakes/smtp.py); imported here, so a module without email tests needs no aiosmtpd."""
    from tests.fakes.smtp import SMTPServer

    with SMTPServer() as s:
        yield s
