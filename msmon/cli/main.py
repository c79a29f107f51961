"""`msmon`: the top-level parser, built from one module per subcommand, and the dispatch to it."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version

from msmon.cli import backtest, calibrate, check_config, cmd, convert, demo, replay, serve
from msmon.cli.common import OK, Subcommand

SUBCOMMANDS: tuple[Subcommand, ...] = (check_config, replay, convert, calibrate, cmd, backtest, demo,
                                       serve)  # --help order


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="msmon", description="msmon: alerting for MindSpore training jobs")
    p.add_argument("--version", action="version", version=f"msmon {_version()}", help="print msmon's version and exit")
    subparsers = p.add_subparsers(dest="command", required=True)
    for subcommand in SUBCOMMANDS:
        subcommand.register(subparsers)
    return p


def _version() -> str:
    try:
        return version("msmon")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "(not installed)"


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        rc: int = args.func(args)
    except BrokenPipeError:  # `msmon ... | head`
        sys.stderr.close()
        return OK
    return rc


if __name__ == "__main__":
    sys.exit(main())
