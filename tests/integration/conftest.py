"""Fixtures the integration tests share: the local Slack-API-compatible server, a real SMTP server and a fresh
schema on the machine's real PostgreSQL."""

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


@pytest.fixture
def schema() -> Iterator[str]:
    """A fresh schema on the real PostgreSQL (tests/fakes/postgres.py), dropped afterwards; skipped with the reason
    when PostgreSQL does not answer."""
    from tests.fakes import postgres

    reason = postgres.unavailable()
    if reason is not None:
        pytest.skip(reason)
    with postgres.fresh_schema() as name:
        yield name
