"""A real Matrix homeserver (matrix-synapse) on loopback for the Matrix tests: a generated
homeserver.yaml (SQLite, no federation, a random port, a registration shared secret), users registered
through Synapse's admin register API with that secret, and small client-server API helpers to act as
those users (create a room, send, read a room's messages and a thread)."""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import IO, Any

from tests.fakes.process import terminate

SERVER_NAME = "localhost"
START_TIMEOUT = 90.0  # seconds: Synapse builds its SQLite schema on the first start


def synapse_problem() -> str | None:
    """Why Synapse cannot run here (not installed), or None."""
    try:
        import synapse  # noqa: F401
    except ImportError as exc:
        return f"matrix-synapse is not installed ({exc}); pip install matrix-synapse"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _config(root: Path, port: int, shared_secret: str) -> str:
    """homeserver.yaml: one client listener on loopback, SQLite, no federation, rate limits out of the way."""
    loose = {"per_second": 1000, "burst_count": 1000}
    cfg = {
        "server_name": SERVER_NAME, "pid_file": str(root / "homeserver.pid"), "public_baseurl": f"http://127.0.0.1:{port}/",
        "listeners": [{"port": port, "bind_addresses": ["127.0.0.1"], "type": "http", "tls": False,
                       "x_forwarded": False, "resources": [{"names": ["client"], "compress": False}]}],
        "database": {"name": "sqlite3", "args": {"database": str(root / "homeserver.db")}},
        "media_store_path": str(root / "media"), "signing_key_path": str(root / "signing.key"),
        "registration_shared_secret": shared_secret, "macaroon_secret_key": secrets.token_hex(16),
        "form_secret": secrets.token_hex(16), "report_stats": False, "enable_metrics": False,
        "trusted_key_servers": [], "federation_domain_whitelist": [], "suppress_key_server_warning": True,
        "rc_message": loose, "rc_registration": loose, "rc_joins": {"local": loose, "remote": loose},
        "rc_login": {"address": loose, "account": loose, "failed_attempts": loose},
        "rc_invites": {"per_room": loose, "per_user": loose, "per_issuer": loose},
        "url_preview_enabled": False, "presence": {"enabled": False},
    }
    return json.dumps(cfg)  # JSON is YAML


class Synapse:
    """Synapse started in a subprocess (a context manager); `register` makes users with the shared secret."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = _free_port()
        self.secret = secrets.token_hex(16)
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log: IO[bytes] | None = None

    def __enter__(self) -> Synapse:
        self.root.mkdir(parents=True, exist_ok=True)
        cfg = self.root / "homeserver.yaml"
        cfg.write_text(_config(self.root, self.port, self.secret))
        cmd = [sys.executable, "-m", "synapse.app.homeserver", "--config-path", str(cfg)]
        subprocess.run([*cmd, "--generate-keys"], check=True, capture_output=True, timeout=120)
        self.log = (self.root / "synapse.log").open("wb")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, cwd=self.root)
        end = time.monotonic() + START_TIMEOUT
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"synapse exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except (OSError, urllib.error.URLError):
                time.sleep(0.3)
        self.__exit__()
        raise RuntimeError(f"synapse did not answer /health in {START_TIMEOUT:.0f} s: {self.log_tail()}")

    def __exit__(self, *exc: object) -> None:
        terminate(self.proc, 15)
        if self.log is not None:
            self.log.close()

    def log_tail(self) -> str:
        path = self.root / "synapse.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else "(no log)"

    def register(self, name: str, admin: bool = False) -> User:
        """A new user through /_synapse/admin/v1/register: a nonce, then the HMAC-SHA1 of
        nonce NUL user NUL password NUL admin|notadmin keyed with the shared secret."""
        path = "/_synapse/admin/v1/register"
        nonce = call(self.url, "GET", path)["nonce"]
        password = secrets.token_hex(8)
        mac = hmac.new(self.secret.encode(), digestmod=hashlib.sha1)
        mac.update(b"\x00".join([nonce.encode(), name.encode(), password.encode(),
                                 b"admin" if admin else b"notadmin"]))
        body = {"nonce": nonce, "username": name, "password": password, "admin": admin, "mac": mac.hexdigest()}
        answer = call(self.url, "POST", path, body)
        return User(self.url, answer["user_id"], answer["access_token"])


def call(base: str, method: str, path: str, body: dict[str, Any] | None = None, token: str | None = None) -> Any:
    """One client-server API request; the JSON answer (an HTTPError with the body for a 4xx/5xx)."""
    req = urllib.request.Request(base + path, method=method,
                                 data=None if body is None else json.dumps(body).encode())
    req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as exc:
        raise RuntimeError(f"{method} {path}: HTTP {exc.code}: {exc.read()[:500]!r}") from None


class User:
    """A registered user acting through the client-server API."""

    def __init__(self, base: str, user_id: str, token: str) -> None:
        self.base, self.user_id, self.token = base, user_id, token

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        return call(self.base, method, path, body, self.token)

    def create_room(self, invite: list[str]) -> str:
        answer = self._call("POST", "/_matrix/client/v3/createRoom",
                            {"preset": "public_chat", "invite": invite, "name": "msmon test"})
        return str(answer["room_id"])

    def join(self, room: str) -> None:
        self._call("POST", f"/_matrix/client/v3/join/{_q(room)}", {})

    def say(self, room: str, text: str) -> str:
        """A plain text message; its event id."""
        txn = secrets.token_hex(8)
        answer = self._call("PUT", f"/_matrix/client/v3/rooms/{_q(room)}/send/m.room.message/{txn}",
                            {"msgtype": "m.text", "body": text})
        return str(answer["event_id"])

    def messages(self, room: str) -> list[dict[str, Any]]:
        """The room's m.room.message events, oldest first."""
        answer = self._call("GET", f"/_matrix/client/v3/rooms/{_q(room)}/messages?dir=b&limit=200")
        return [e for e in reversed(answer["chunk"]) if e.get("type") == "m.room.message"]

    def download(self, mxc: str) -> bytes:
        server, media = mxc.removeprefix("mxc://").split("/", 1)
        req = urllib.request.Request(f"{self.base}/_matrix/client/v1/media/download/{_q(server)}/{_q(media)}")
        req.add_header("Authorization", f"Bearer {self.token}")
        with urllib.request.urlopen(req, timeout=10) as r:
            return bytes(r.read())


def _q(part: str) -> str:
    return urllib.parse.quote(part, safe="")

