"""`msmon`: check a config, replay a log through the detectors, run the demo."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Sequence

from .config import ConfigError, load_config
from .monitor import Monitor, describe
from .replay import ReplayError, read_csv, replay
from .wire import Event, Severity, Status


def _alert_line(e: Event) -> str:
    state = "RESOLVED" if e.status is Status.RESOLVED else e.severity.value
    if e.status is Status.RESOLVED:
        return f"step {e.step:>7}  {state:<8} {e.rule:<16} device {e.device}"
    again = " (still firing)" if e.repeat else ""
    return (f"step {e.step:>7}  {state:<8} {e.rule:<16} device {e.device}  value {e.value:.4g} "
            f"threshold {e.threshold:.4g}{again}\n{'':>15}{e.message}")


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


def _run_replay(path: str, config: str, run_id: str) -> list[Event]:
    rows = list(read_csv(path))
    has_time = any(r.time is not None for r in rows)
    # Without timestamps in the log, timing rules must not read the replay's own (fast) clock.
    mon = Monitor(config, run_id, clock=time.time if has_time else (lambda: 0.0))
    return replay(rows, mon)


def cmd_replay(args: argparse.Namespace) -> int:
    _quiet_logging(args.verbose)
    try:
        events = _run_replay(args.log, args.config, args.run_id)
    except (ConfigError, ReplayError, OSError) as exc:
        print(f"msmon replay: {exc}", file=sys.stderr)
        return 2
    for e in events:
        print(_alert_line(e))
    firing = [e for e in events if e.status is Status.FIRING and not e.repeat]
    print(f"{len(firing)} alert(s): {sum(e.severity is Severity.ERROR for e in firing)} ERROR, "
          f"{sum(e.severity is Severity.WARNING for e in firing)} WARNING")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import CREEP_START, SPIKE_STEP, STEP_SECONDS, make_trace

    _quiet_logging(args.verbose)
    out = args.out
    trace = make_trace(os.path.join(out, "incident-13b.csv"))
    print(f"msmon demo: a 13B fine-tune; the grad norm starts creeping at step {CREEP_START}, the loss jumps "
          f"from 1.82 to 6.47 at step {SPIKE_STEP} ({STEP_SECONDS:.0f} s per step).")
    try:
        from bot.demo import run_demo

        have_bot = True
    except ImportError:  # msmon without the [bot] extra
        have_bot = False
    try:
        if not have_bot or args.no_bot:
            print(f"Replaying {trace} through {args.config} (the same Monitor a live job runs):\n")
            events = _run_replay(trace, args.config, "demo-13b")
            for e in events:
                print(_alert_line(e))
        else:
            print(f"Starting the msmon bot (SQLite state and chart PNGs in {out}/, console receiver) and replaying "
                  f"{trace} through {args.config}, reporting to the bot as a training job would. The bot's console "
                  "receiver prints what it delivers:\n", flush=True)
            events, bot = run_demo(trace, args.config, out)
            runs = bot.store.runs()
            firing = bot.store.alerts("demo-13b", "firing")
            bot.stop()
            print(f"\nThe bot now holds run demo-13b at step {runs[0]['last_step'] if runs else '?'} with "
                  f"{len(firing)} alert(s) firing: {', '.join(sorted({a['rule'] for a in firing}))}.")
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    first = next((e for e in events if e.status is Status.FIRING), None)
    if first is None:
        print("\nno alert was raised: the detectors missed the incident", file=sys.stderr)
        return 1
    lead = SPIKE_STEP - first.step
    print(f"\nFirst alert: {first.severity.value} {first.rule} at step {first.step}, {lead} steps "
          f"({lead * STEP_SECONDS / 60:.0f} minutes) before the loss spike.")
    return 0


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
    r = sub.add_parser("replay", help="run a metrics log (CSV) through the detectors and print the alerts")
    r.add_argument("log")
    r.add_argument("--config", default="config/monitor.yaml")
    r.add_argument("--run-id", default="replay")
    r.add_argument("-v", "--verbose", action="store_true", help="also print msmon's log lines")
    r.set_defaults(func=cmd_replay)
    d = sub.add_parser("demo", help="replay a built-in incident trace and print the alerts")
    d.add_argument("--config", default="config/monitor.yaml")
    d.add_argument("--out", default="demo-out")
    d.add_argument("-v", "--verbose", action="store_true", help="also print msmon's log lines")
    d.add_argument("--no-bot", action="store_true", help="only replay through the detectors")
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
