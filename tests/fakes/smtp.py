"""A real SMTP server (aiosmtpd) on loopback that keeps what it receives, parsed, for the email tests;
it can refuse every message or hang before answering, to test that nothing else waits for it."""

from __future__ import annotations

import email
import email.policy
import socket
import ssl
import subprocess
import threading
import time
from email.message import EmailMessage
from pathlib import Path
from typing import Any

from aiosmtpd.controller import Controller


class Inbox:
    """aiosmtpd's handler: the messages received, with their envelope recipients."""

    def __init__(self) -> None:
        self.messages: list[tuple[list[str], EmailMessage]] = []
        self.refuse = False  # answer 451 to every DATA
        self.unknown: set[str] = set()  # recipients answered 550 at RCPT (the others are taken)
        self.hang = 0.0  # seconds to sit on DATA before answering
        self.lock = threading.Lock()

    async def handle_RCPT(self, server: Any, session: Any, envelope: Any, address: str,  # noqa: N802
                          rcpt_options: list[str]) -> str:
        if address in self.unknown:
            return "550 5.1.1 no such user here"
        envelope.rcpt_tos.append(address)
        return "250 OK"

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


def self_signed(directory: Path) -> tuple[str, str]:
    """(certificate, key) PEM files for 127.0.0.1, made by the openssl command."""
    cert, key = directory / "smtp-cert.pem", directory / "smtp-key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return str(cert), str(key)


class Logins:
    """aiosmtpd's authenticator: accepts `user`/`password`, keeps who logged in."""

    def __init__(self, user: str, password: str) -> None:
        self.user, self.password, self.seen = user, password, []  # type: ignore[var-annotated]

    def __call__(self, server: Any, session: Any, envelope: Any, mechanism: str, auth_data: Any) -> Any:
        from aiosmtpd.smtp import AuthResult, LoginPassword

        ok = isinstance(auth_data, LoginPassword) and auth_data.login.decode() == self.user and \
            auth_data.password.decode() == self.password
        if ok:
            self.seen.append(self.user)
        return AuthResult(success=ok)


class SMTPServer:
    """aiosmtpd on loopback: plain, `starttls` (required) or `ssl` (implicit TLS) with `cert`/`key`, and
    AUTH with `logins` (over TLS only)."""

    def __init__(self, tls: str = "none", cert: tuple[str, str] | None = None, logins: Logins | None = None) -> None:
        self.inbox = Inbox()
        kwargs: dict[str, Any] = {}
        if tls != "none":
            assert cert is not None
            ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            ctx.load_cert_chain(*cert)
            kwargs = {"ssl_context": ctx} if tls == "ssl" else {"tls_context": ctx, "require_starttls": True}
        if logins is not None:  # aiosmtpd sees STARTTLS only as TLS; implicit TLS is encrypted from the start too
            kwargs.update(authenticator=logins, auth_required=True, auth_require_tls=tls != "ssl")
        self.controller = Controller(self.inbox, hostname="127.0.0.1", port=_free_port(), **kwargs)

    def start(self) -> SMTPServer:
        self.controller.start()
        return self

    @property
    def port(self) -> int:
        return int(self.controller.port)

    def stop(self) -> None:
        self.controller.stop()

    def __enter__(self) -> SMTPServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


ESCALATION_ENV = {"MSMON_TEST_TOKEN": "job-token", "MSMON_OP_TOKEN": "op-token", "SLACK_BOT_TOKEN": "xoxb-test",
                  "MSMON_ACK_SECRET": "a-test-key"}  # the secrets escalating_bot_config names

ONCALL = {"levels": [{"after": 0, "mention": ["U0ONCALL"]},
                     {"after": 600, "email": ["oncall@example.org", "second@example.org"]},
                     {"after": 1800, "email": ["lead@example.org"]}]}


def escalating_bot_config(tmp_path: Any, slack_url: str, smtp_port: int, policy: dict[str, Any] | None = None,
                          **email: Any) -> dict[str, Any]:
    """bot.yaml for the escalation tests: ERRORs to Slack channel C0ALERTS under policy `oncall`, mail to
    the loopback SMTP server, short retries, the operator `cli:alice` (token MSMON_OP_TOKEN)."""
    return {"bot": {
        "port": 0, "state_path": str(tmp_path / "bot.sqlite"),
        "tokens": [{"project": "llm", "env": "MSMON_TEST_TOKEN"}],
        "routes": [{"receiver": "slack", "channel": "C0ALERTS", "escalation": "oncall"}],
        "escalations": {"oncall": policy or ONCALL},
        "email": {"host": "127.0.0.1", "port": smtp_port, "tls": "none", "sender": "msmon@bot.example.org",
                  "public_url": "http://msmon.example.org", "timeout": 1.0, **email},
        "slack": {"base_url": slack_url, "max_retries": 0},
        "pipeline": {"group_wait": 0.2, "heartbeat_timeout": 60, "stall_timeout": 600},
        "rate_limit": {"per_channel": 50, "per_run": 50, "burst": 20},
        "delivery": {"backoff_base": 0.05, "backoff_max": 0.2},
        "commands": {"operators": [{"user": "cli:alice", "env": "MSMON_OP_TOKEN"}]},
        "console": {"charts_dir": str(tmp_path / "charts")}}}
