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
    from msmon.demo.run import Chatops
    from msmon.demo.story import Story

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
    shown = args.config or "msmon's default monitor config (a copy of config/monitor.yaml)"
    print(f"msmon demo, part 1: a 13B fine-tune; the grad norm starts creeping at step {CREEP_START}, the loss "
          f"jumps from 1.82 to 6.47 at step {SPIKE_STEP} ({STEP_SECONDS:.0f} s per step).")
    bot: BotThread | None = None
    try:
        if not args.no_bot and _have_the_bot():
            from msmon.demo.story import Story  # beside the bot: the [bot] extra is there

            story = Story()
            events, bot = _into_the_bot(trace, config, shown, args.out, story)
        else:
            events = _through_the_detectors(trace, config, shown)
        if not _first_alert(events):
            return FAILED
        if bot is None or args.no_chatops:
            _next(args.out, chatops=False, bot=bot is not None)
            return OK
        rc = _chatops(bot, args.out, story)
        _next(args.out, chatops=rc == OK, bot=True)
        return rc
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


def _through_the_detectors(trace: str, config: str, shown: str) -> list[Event]:
    print(f"Replaying {trace} through {shown} (the same Monitor a live job runs):\n")
    events = run_replay(trace, config, RUN_ID).events
    for e in events:
        print(alert_line(e))
    return events


def _into_the_bot(trace: str, config: str, shown: str, out: str, story: Story) -> tuple[list[Event], BotThread]:
    from msmon.demo.run import run_demo  # the [bot] extra: _have_the_bot found it

    print(f"Starting the msmon bot (SQLite state and chart PNGs in {out}/, console receiver) and replaying "
          f"{trace} through {shown}, reporting to the bot as a training job would. The bot's console "
          "receiver prints what it delivers:\n", flush=True)
    events, bot = run_demo(trace, config, out, story)
    runs = bot.store.runs()
    firing = bot.store.alerts(RUN_ID, "firing")
    rules = ", ".join(sorted({a["rule"] for a in firing}))
    print(f"\nThe bot now holds run {RUN_ID} at step {runs[0]['last_step'] if runs else '?'}: " +
          (f"{len(firing)} alert(s) still firing ({rules})." if firing else "every alert resolved."))
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


def _chatops(bot: BotThread, out: str, story: Story) -> int:
    try:
        import mindspore  # noqa: F401 - part 2 trains with it
    except ImportError:
        print("\nPart 2 (a real MindSpore job handled from chat) needs MindSpore: pip install 'msmon[mindspore]'")
        return OK

    from msmon.demo.mindspore_job import AT as at
    from msmon.demo.mindspore_job import BASE_LR
    from msmon.demo.mindspore_job import JUMP as jump  # MindSpore only here
    from msmon.demo.run import run_chatops  # loaded already for part 1

    story.say(f"\nmsmon demo, part 2: a real MindSpore training (an MLP on this CPU) reports to the same bot. Its "
              f"LR schedule is wrong: from step {at} it gives {BASE_LR * jump:g} instead of {BASE_LR:g} ({jump:g}x), "
              "as a mistyped peak LR would, and nothing tells msmon. When the bot's first ERROR is out, `msmon cmd` "
              "saves a checkpoint, pauses the job, asks for its status, resumes it, scales the LR back and stops "
              "it.\n")
    result = run_chatops(bot, out, story)
    _caught(result)
    return OK if result.ok else FAILED


def _caught(result: Chatops) -> None:
    """How soon after the bad schedule msmon said so, from the alerts the job raised."""
    firing = [e for e in result.events if e.status is Status.FIRING and e.step >= result.at]
    if not firing:
        return
    first = firing[0]
    error = next((e for e in firing if e.severity.value == "ERROR"), None)
    then = "" if error is None else (f"; the first ERROR, {error.rule}, at step {error.step} "
                                     f"({error.step - result.at} steps after it)")
    print(f"\nThe bad schedule started at step {result.at}: msmon's first alert was {first.severity.value} "
          f"{first.rule} at step {first.step}{then}.")


def _next(out: str, chatops: bool, bot: bool) -> None:
    """The demo's last words: what to look at and what to try next."""
    charts = [f"the charts the bot drew: {os.path.join(out, 'charts')}/ (one PNG per ERROR"
              f"{', and the status chart' if chatops else ''})"] if bot else []
    lines = [*charts,
             "your own log through the same detectors: msmon replay YOUR_LOG.csv --plot out.png "
             "(CSV, JSONL, TensorBoard, MindFormers logs)",
             "your own job: README, 'Connect your own job' (msmon serve --config config/bot.local.yaml, then "
             "bot.url in its monitor_config)",
             "the commands: msmon cmd help, with that bot running and MSMON_OPERATOR_TOKEN set"]
    if not chatops:
        lines.insert(len(charts), "part 2, a real MindSpore job handled from chat: msmon demo, without --no-bot or "
                                  "--no-chatops (it needs the bot and MindSpore: pip install 'msmon[bot,mindspore]')")
    print("\nWhat to try next:\n" + "\n".join(f"  - {line}" for line in lines))
