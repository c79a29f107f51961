"""What several `msmon` subcommands share: the shape of a subcommand module, exit codes, error lines,
log setup (and the readers' notes on a log), and the options for a log to read and for the bot to talk to."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from importlib import resources
from typing import Any, Protocol

from msmon.offline import readers
from msmon.offline.readers import AUTO, FORMATS

OK = 0  # it ran and found nothing wrong
FAILED = 1  # it ran and the answer is "no": alerts on a baseline, a command the job did not carry out
USAGE = 2  # it could not run: bad input, a config error, a missing dependency, an unreachable bot

COLUMNS_HELP = ("FIELD=NAME,...: the log's column names (CSV), keys (JSONL) or tags (TensorBoard) for step, loss, lr, "
                "grad_norm, throughput, time, time_ms, device; unmapped fields are found by their usual names "
                "(MindFormers text logs need none)")


def default_monitor_config() -> str:
    """The monitor_config shipped inside the package (msmon/data/monitor.yaml, the same file as the repository's
    documented config/monitor.yaml; a test keeps them equal): what replay, demo and backtest use without --config,
    from any working directory."""
    return str(resources.files("msmon") / "data" / "monitor.yaml")


DEFAULT_CONFIG_HELP = "monitor_config YAML (default: the one shipped with msmon, a copy of config/monitor.yaml)"


class Subcommand(Protocol):
    """A module of this package that `main` lists: it adds its parser and runs it."""

    def register(self, subparsers: Any) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


def fail(command: str, message: object, code: int = USAGE) -> int:
    """Print `msmon COMMAND: message` on stderr; returns `code`, the exit code to return."""
    print(f"msmon {command}: {message}", file=sys.stderr)
    return code


def quiet_logging(verbose: bool) -> None:
    """msmon's log lines go to stderr, bare, and only with -v: a subcommand's output is its own."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    log = logging.getLogger("msmon")
    log.addHandler(handler)
    log.setLevel(logging.INFO if verbose else logging.CRITICAL)
    log.propagate = False


class _Notes(logging.Handler):
    """Prints the readers' notes (a log's damaged lines) as `msmon COMMAND: note: ...` on the stderr of the moment."""

    def __init__(self, command: str) -> None:
        super().__init__(logging.WARNING)
        self.command = command

    def emit(self, record: logging.LogRecord) -> None:
        print(f"msmon {self.command}: note: {record.getMessage()}", file=sys.stderr)


def show_reader_notes(command: str) -> None:
    """What the log readers noticed (damaged MindFormers lines read as missing) goes to stderr, with or without -v:
    the user should know the data had holes."""
    log = logging.getLogger(readers.log.name)
    for h in [h for h in log.handlers if isinstance(h, _Notes)]:
        log.removeHandler(h)
    log.addHandler(_Notes(command))
    log.setLevel(logging.WARNING)
    log.propagate = False


def add_verbose(parser: argparse.ArgumentParser, help_text: str = "also print msmon's log lines (stderr)") -> None:
    parser.add_argument("-v", "--verbose", action="store_true", help=help_text)


FORMAT_HELP = "the log's format (default: auto, from its name, else its content)"


def add_log_options(parser: argparse.ArgumentParser, format_help: str | None = FORMAT_HELP) -> None:
    """--columns and --input-format: how to read a metrics log (any format `msmon replay` reads; default: detected)."""
    parser.add_argument("--columns", default=None, metavar="MAPPING", help=COLUMNS_HELP)
    parser.add_argument("--input-format", dest="format_in", choices=(AUTO, *FORMATS), default=AUTO, help=format_help)


def add_bot_options(parser: argparse.ArgumentParser) -> None:
    """--bot and --token-env: the msmon bot to talk to and where the operator token is."""
    parser.add_argument("--bot", default=os.environ.get("MSMON_BOT_URL", "http://127.0.0.1:8080"),
                        help="the bot's URL (default: $MSMON_BOT_URL or http://127.0.0.1:8080)")
    parser.add_argument("--token-env", default="MSMON_OPERATOR_TOKEN",
                        help="environment variable holding your operator token (default: MSMON_OPERATOR_TOKEN)")
