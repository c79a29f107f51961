"""`msmon cmd "<command>"`: the chat commands without Slack, from a terminal or a script.

The text goes to the bot as is (POST /v1/commands with an operator token); the bot parses it with
the same parser as `/msmon` in Slack and answers at once. For a command that travels to the job,
`msmon cmd` then waits for the job's result (GET /v1/commands/ID) and prints it. The requests go
through `notifier.http`, the client the job's transport uses.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

from msmon.cli.common import FAILED, OK, add_bot_options, fail
from msmon.common.urls import url_problem
from notifier.http import HTTPFailure, request

FINAL = ("done", "failed", "expired", "partial")


class BotError(Exception):
    """The bot cannot be asked, or its answer about a command cannot be used; the message says which."""


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("cmd", help='send a chat command to the bot without Slack: msmon cmd "pause run-42"')
    p.add_argument("words", nargs="+", metavar="command",
                   help="the command, as typed after /msmon in Slack ('help' lists them)")
    add_bot_options(p)
    p.add_argument("--wait", type=float, default=60.0, help="seconds to wait for the job's result (default 60)")
    p.add_argument("--no-wait", action="store_true", help="print the bot's answer and return")
    p.set_defaults(func=run)


def operator_setup(token_env: str) -> str:
    """What to add to the bot's bot.yaml, and where to put the token, for `msmon cmd` to be let in."""
    return (f"Every command, help and status too, is sent with an operator token that the bot's bot.yaml lists under "
            f"commands.operators. Add to that file (config/bot.local.yaml has it already):\n"
            f"  commands:\n"
            f"    operators:\n"
            f"      - {{user: \"cli:me\", env: {token_env}}}\n"
            f"    allow:                    # only for pause, resume, stop, scale-lr, save-checkpoint...\n"
            f"      - {{project: \"*\", users: [\"cli:me\"]}}\n"
            f"then start the bot with {token_env}=<a secret> in its environment (msmon serve --config bot.yaml) and "
            f"run `export {token_env}=<the same secret>` in this shell")


def no_token(token_env: str) -> str:
    return f"the environment variable {token_env} holds no operator token.\n{operator_setup(token_env)}"


def call(url: str, token: str | None, path: str, body: dict[str, Any] | None = None,
         timeout: float = 10.0) -> tuple[int, dict[str, Any]]:
    """POST `body` (GET without one) to the bot's `path`: (HTTP status, the bot's JSON answer). An error
    page that is not JSON comes back as {"error": its first 300 bytes}."""
    data = None if body is None else json.dumps(body).encode()
    try:
        answer = request(url.rstrip("/") + path, data, token=token, timeout=timeout)
    except HTTPFailure as exc:
        raise BotError(f"cannot reach the msmon bot at {url}: {exc.cause}. Is `msmon serve` running there? "
                       "(--bot or MSMON_BOT_URL)") from None
    ok = 200 <= answer.status < 300
    try:
        return answer.status, json.loads(answer.body or b"{}") if ok else json.loads(answer.body)
    except ValueError:
        return answer.status, {"error": answer.body[:300].decode("utf-8", "replace")}


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


def run(args: argparse.Namespace) -> int:
    token = os.environ.get(args.token_env)
    if not token:
        return fail("cmd", no_token(args.token_env))
    problem = url_problem(args.bot)
    if problem is not None:
        return fail("cmd", f"the bot's URL {problem} (--bot or MSMON_BOT_URL)")
    try:
        code, answer = send(args.bot, token, " ".join(args.words))
        if "error" in answer:
            hint = f"\n{operator_setup(args.token_env)}" if code == 401 else ""
            return fail("cmd", f"the bot refused the request (HTTP {code}): {answer['error']}{hint}")
        record = answer.get("record")  # an answer given at once (help, status) has its command-log id too
        print(f"{record}: {answer['text']}" if record and answer.get("command") is None else answer["text"])
        if answer.get("chart"):
            print(f"chart: {answer['chart']}")
        cmd = answer.get("command")
        if not answer["ok"]:
            return FAILED
        if cmd is None or args.no_wait:
            return OK
        cmd = wait_result(args.bot, token, cmd["id"], args.wait)
    except BotError as exc:
        return fail("cmd", exc)
    return _report(cmd, args.wait)


def _report(cmd: dict[str, Any], waited: float) -> int:
    """Print what became of a command that travelled to the job: OK only when it is done."""
    status = cmd.get("status")
    if status not in FINAL:
        print(f"{cmd['id']}: no result from the job after {waited:.0f} s (it applies at step "
              f"{cmd['apply_step']:,}); `msmon cmd` stops waiting, the bot does not: the result will show in "
              f"`GET /v1/commands/{cmd['id']}` and in the bot's receivers")
        return FAILED
    print(f"{cmd['id']} {status}: {cmd['detail']}")
    return OK if status == "done" else FAILED
