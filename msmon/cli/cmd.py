"""`msmon cmd "<command>"`: the chat commands without Slack, from a terminal or a script.

The text goes to the bot as is (POST /v1/commands with an operator token); the bot parses it with
the same parser as `/msmon` in Slack and answers at once. For a command that travels to the job,
`msmon cmd` then waits for the job's result (GET /v1/commands/ID) and prints it. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request
from typing import Any

FINAL = ("done", "failed", "expired", "partial")


class BotError(Exception):
    pass


def call(url: str, token: str | None, path: str, body: dict[str, Any] | None = None,
         timeout: float = 10.0) -> tuple[int, dict[str, Any]]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url.rstrip("/") + path, data=data, method="GET" if body is None else "POST")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - the operator's bot URL
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            return exc.code, json.loads(raw)
        except ValueError:
            return exc.code, {"error": raw[:300].decode("utf-8", "replace")}
    except (urllib.error.URLError, OSError) as exc:
        raise BotError(f"cannot reach the msmon bot at {url}: {exc}. Is `msmon serve` running there? "
                       "(--bot or MSMON_BOT_URL)") from None


def send(url: str, token: str | None, text: str) -> tuple[int, dict[str, Any]]:
    """Submit one command; (HTTP status, the bot's answer)."""
    return call(url, token, "/v1/commands", {"text": text})


def wait_result(url: str, token: str | None, command_id: str, timeout: float, every: float = 0.2) -> dict[str, Any]:
    """The command as the bot knows it once the job answered (or it expired), or as it stands at `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        code, cmd = call(url, token, f"/v1/commands/{command_id}")
        if code != 200:
            raise BotError(f"the bot answered HTTP {code} for command {command_id}: {cmd.get('error', cmd)}")
        if cmd.get("status") in FINAL or time.monotonic() >= deadline:
            return cmd
        time.sleep(every)


def cmd_cmd(args: argparse.Namespace) -> int:
    token = os.environ.get(args.token_env)
    if not token:
        print(f"msmon cmd: the environment variable {args.token_env} holds no operator token (the bot's "
              "commands.operators lists who may send commands)", file=sys.stderr)
        return 2
    text = " ".join(args.words)
    try:
        code, answer = send(args.bot, token, text)
        if "error" in answer:
            print(f"msmon cmd: the bot refused the request (HTTP {code}): {answer['error']}", file=sys.stderr)
            return 2
        print(answer["text"])
        if answer.get("chart"):
            print(f"chart: {answer['chart']}")
        cmd = answer.get("command")
        if not answer["ok"]:
            return 1
        if cmd is None or args.no_wait:
            return 0
        cmd = wait_result(args.bot, token, cmd["id"], args.wait)
    except BotError as exc:
        print(f"msmon cmd: {exc}", file=sys.stderr)
        return 2
    status = cmd.get("status")
    if status not in FINAL:
        print(f"{cmd['id']}: no result from the job after {args.wait:.0f} s (it applies at step "
              f"{cmd['apply_step']:,}); `msmon cmd` stops waiting, the bot does not: the result will show in "
              f"`GET /v1/commands/{cmd['id']}` and in the bot's receivers")
        return 1
    print(f"{cmd['id']} {status}: {cmd['detail']}")
    return 0 if status == "done" else 1


def register(sub: Any) -> None:
    c = sub.add_parser("cmd", help='send a chat command to the bot without Slack: msmon cmd "pause run-42"')
    c.add_argument("words", nargs="+", metavar="command",
                   help="the command, as typed after /msmon in Slack ('help' lists them)")
    c.add_argument("--bot", default=os.environ.get("MSMON_BOT_URL", "http://127.0.0.1:8080"),
                   help="the bot's URL (default: $MSMON_BOT_URL or http://127.0.0.1:8080)")
    c.add_argument("--token-env", default="MSMON_OPERATOR_TOKEN",
                   help="environment variable holding your operator token (default: MSMON_OPERATOR_TOKEN)")
    c.add_argument("--wait", type=float, default=60.0, help="seconds to wait for the job's result (default 60)")
    c.add_argument("--no-wait", action="store_true", help="print the bot's answer and return")
    c.set_defaults(func=cmd_cmd)
