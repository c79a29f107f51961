"""`msmon demo`: the built-in 13B incident replayed into a bot started here (part 1), then a real MindSpore
job handled from chat with `msmon cmd` (part 2). Without the [bot] extra, or with --no-bot, part 1 only
replays the incident through the detectors; without MindSpore, part 2 is skipped."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any

from msmon.cli.common import DEFAULT_CONFIG_HELP, FAILED, OK, USAGE, add_verbose, default_monitor_config, quiet_logging
from msmon.contract.wire import Event, Status
from msmon.demo.trace import CREEP_START, SPIKE_STEP, STEP_SECONDS, make_trace
from msmon.offline.replay import alert_line, run_replay
from notifier.config import ConfigError

if TYPE_CHECKING:
    from bot.server import BotThread

RUN_ID = "demo-13b"


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("demo", help="replay a built-in incident trace and print the alerts")
    p.add_argument("--config", default=None, help=DEFAULT_CONFIG_HELP)
    p.add_argument("--out", default="demo-out", help="folder for the trace, the bot's state, charts and checkpoints "
                   "(default: %(default)s)")
    add_verbose(p, "also print msmon's log lines")
    p.add_argument("--no-bot", action="store_true", help="only replay through the detectors")
    p.add_argument("--no-chatops", action="store_true", help="skip part 2 (a real MindSpore job handled from chat)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    quiet_logging(args.verbose)
    trace = make_trace(os.path.join(args.out, "incident-13b.csv"))
    config = args.config or default_monitor_config()
    print(f"msmon demo, part 1: a 13B fine-tune; the grad norm starts creeping at step {CREEP_START}, the loss "
          f"jumps from 1.82 to 6.47 at step {SPIKE_STEP} ({STEP_SECONDS:.0f} s per step).")
    bot: BotThread | None = None
    try:
        if not args.no_bot and _have_the_bot():
            events, bot = _into_the_bot(trace, config, args.out)
        else:
            events = _through_the_detectors(trace, config)
        if not _first_alert(events):
            return FAILED
        if bot is None or args.no_chatops:
            return OK
        return _chatops(bot, args.out)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return USAGE
    finally:
        if bot is not None:
            bot.stop()


def _have_the_bot() -> bool:
    """Whether `msmon.demo.run`, which starts a bot in this process, can load: False without the [bot] extra."""
    try:
        import msmon.demo.run  # noqa: F401
    except ImportError:
        return False
    return True


def _through_the_detectors(trace: str, config: str) -> list[Event]:
    print(f"Replaying {trace} through {config} (the same Monitor a live job runs):\n")
    events = run_replay(trace, config, RUN_ID).events
    for e in events:
        print(alert_line(e))
    return events


def _into_the_bot(trace: str, config: str, out: str) -> tuple[list[Event], BotThread]:
    from msmon.demo.run import run_demo  # the [bot] extra: _have_the_bot found it

    print(f"Starting the msmon bot (SQLite state and chart PNGs in {out}/, console receiver) and replaying "
          f"{trace} through {config}, reporting to the bot as a training job would. The bot's console "
          "receiver prints what it delivers:\n", flush=True)
    events, bot = run_demo(trace, config, out)
    runs = bot.store.runs()
    firing = bot.store.alerts(RUN_ID, "firing")
    print(f"\nThe bot now holds run {RUN_ID} at step {runs[0]['last_step'] if runs else '?'} with "
          f"{len(firing)} alert(s) firing: {', '.join(sorted({a['rule'] for a in firing}))}.")
    return events, bot


def _first_alert(events: list[Event]) -> bool:
    """Say how early the first alert came; False (on stderr) when none did."""
    first = next((e for e in events if e.status is Status.FIRING), None)
    if first is None:
        print("\nno alert was raised: the detectors missed the incident", file=sys.stderr)
        return False
    lead = SPIKE_STEP - first.step
    print(f"\nFirst alert: {first.severity.value} {first.rule} at step {first.step}, {lead} steps "
          f"({lead * STEP_SECONDS / 60:.0f} minutes) before the loss spike.")
    return True


def _chatops(bot: BotThread, out: str) -> int:
    try:
        import mindspore  # noqa: F401 - part 2 trains with it
    except ImportError:
        print("\nPart 2 (a real MindSpore job handled from chat) needs MindSpore: pip install 'msmon[mindspore]'")
        return OK

    print("\nmsmon demo, part 2: a real MindSpore training (an MLP on this CPU) reports to the same bot. At step "
          "300 a bad schedule raises its learning rate 3x; when the bot's first ERROR is out, `msmon cmd` saves a "
          "checkpoint, pauses the job, asks for its status, resumes it and stops it.\n", flush=True)
    from msmon.demo.run import run_chatops  # loaded already for part 1

    return OK if run_chatops(bot, out) else FAILED
