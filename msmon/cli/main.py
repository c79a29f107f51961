"""`msmon`: check a config, replay a log through the detectors, run the demo."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from msmon.contract.wire import Status
from msmon.offline.replay import alert_line, run_replay
from notifier.config import ConfigError, load_config
from notifier.monitor import describe


def _quiet_logging(verbose: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    log = logging.getLogger("msmon")
    log.addHandler(handler)
    log.setLevel(logging.INFO if verbose else logging.CRITICAL)
    log.propagate = False


def cmd_check_config(args: argparse.Namespace) -> int:
    try:
        cfg = load_config(args.file)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    if not cfg.monitor_on:
        print(f"{args.file}: valid, but monitoring is OFF (monitor_config.monitor_on is false): nothing will be "
              "monitored. Set monitor_on: true.")
        return 0
    print(f"{args.file}: valid")
    for line in describe(cfg, cfg.bot.run_id or "(run id given in code)"):
        print(line)
    if cfg.tensorboard.enable:
        print(f"TensorBoard: {cfg.tensorboard.log_dir}/RUN_ID/device_N")
    if cfg.csv.enable:
        print(f"CSV: {cfg.csv.path}")
    print("Remember to attach it: Model.train(..., callbacks=[MonitorCallback(config, run_id=...)]) or call "
          "Monitor.step() in your loop.")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from msmon.demo.trace import CREEP_START, SPIKE_STEP, STEP_SECONDS, make_trace

    _quiet_logging(args.verbose)
    out = args.out
    trace = make_trace(os.path.join(out, "incident-13b.csv"))
    print(f"msmon demo, part 1: a 13B fine-tune; the grad norm starts creeping at step {CREEP_START}, the loss "
          f"jumps from 1.82 to 6.47 at step {SPIKE_STEP} ({STEP_SECONDS:.0f} s per step).")
    try:
        from msmon.demo.run import run_chatops, run_demo

        have_bot = True
    except ImportError:  # msmon without the [bot] extra
        have_bot = False
    bot = None
    try:
        if not have_bot or args.no_bot:
            print(f"Replaying {trace} through {args.config} (the same Monitor a live job runs):\n")
            events = run_replay(trace, args.config, "demo-13b").events
            for e in events:
                print(alert_line(e))
        else:
            print(f"Starting the msmon bot (SQLite state and chart PNGs in {out}/, console receiver) and replaying "
                  f"{trace} through {args.config}, reporting to the bot as a training job would. The bot's console "
                  "receiver prints what it delivers:\n", flush=True)
            events, bot = run_demo(trace, args.config, out)
            runs = bot.store.runs()
            firing = bot.store.alerts("demo-13b", "firing")
            print(f"\nThe bot now holds run demo-13b at step {runs[0]['last_step'] if runs else '?'} with "
                  f"{len(firing)} alert(s) firing: {', '.join(sorted({a['rule'] for a in firing}))}.")
        first = next((e for e in events if e.status is Status.FIRING), None)
        if first is None:
            print("\nno alert was raised: the detectors missed the incident", file=sys.stderr)
            return 1
        lead = SPIKE_STEP - first.step
        print(f"\nFirst alert: {first.severity.value} {first.rule} at step {first.step}, {lead} steps "
              f"({lead * STEP_SECONDS / 60:.0f} minutes) before the loss spike.")
        if bot is None or args.no_chatops:
            return 0
        try:
            import mindspore  # noqa: F401
        except ImportError:
            print("\nPart 2 (a real MindSpore job handled from chat) needs MindSpore: pip install 'msmon[mindspore]'")
            return 0
        print("\nmsmon demo, part 2: a real MindSpore training (an MLP on this CPU) reports to the same bot. At step "
              "300 a bad schedule raises its learning rate 3x; when the bot's first ERROR is out, `msmon cmd` saves a "
              "checkpoint, pauses the job, asks for its status, resumes it and stops it.\n", flush=True)
        return 0 if run_chatops(bot, out) else 1
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    finally:
        if bot is not None:
            bot.stop()


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        from bot.server import serve  # the bot's dependencies only when serving
    except ImportError as exc:
        print(f"msmon serve needs the bot's dependencies: pip install 'msmon[bot]' ({exc})", file=sys.stderr)
        return 2
    return serve(args.config, args.host, args.port)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="msmon", description="msmon: alerting for MindSpore training jobs")
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("check-config", help="validate a training YAML's monitor_config and say what it monitors")
    c.add_argument("file")
    c.set_defaults(func=cmd_check_config)
    from msmon.cli.analysis import register as register_analysis  # replay, calibrate

    register_analysis(sub)
    from msmon.cli.cmd import register as register_command  # cmd

    register_command(sub)
    from msmon.cli.backtest import register as register_backtest  # backtest

    register_backtest(sub)
    d = sub.add_parser("demo", help="replay a built-in incident trace and print the alerts")
    d.add_argument("--config", default="config/monitor.yaml")
    d.add_argument("--out", default="demo-out")
    d.add_argument("-v", "--verbose", action="store_true", help="also print msmon's log lines")
    d.add_argument("--no-bot", action="store_true", help="only replay through the detectors")
    d.add_argument("--no-chatops", action="store_true", help="skip part 2 (a real MindSpore job handled from chat)")
    d.set_defaults(func=cmd_demo)
    sv = sub.add_parser("serve", help="run the msmon bot service")
    sv.add_argument("--config", default=None, help="bot.yaml (default: built-in defaults, console receiver)")
    sv.add_argument("--host", default=None)
    sv.add_argument("--port", type=int, default=None)
    sv.set_defaults(func=cmd_serve)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        rc: int = args.func(args)
    except BrokenPipeError:  # `msmon ... | head`
        sys.stderr.close()
        return 0
    return rc


if __name__ == "__main__":
    sys.exit(main())
