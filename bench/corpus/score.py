"""Score the detection corpus (bench/corpus/gen.py): every run replayed through a monitor config with the backtest's
engine (`msmon.offline.backtest.engine`: `replay` through `Monitor.step`, `alerts_of`, `score`), at each step
interval, and the per-cell tables in optimizer steps, separately for the tune and the held-out half.

    .venv/bin/python bench/corpus/score.py /work/corpus [--split heldout] [--step-interval 1 10] [--declare]
        [--cli] [--format text|markdown|json] [--cells] [--json-out FILE] [--config config/monitor.yaml]

What it counts (issue 37's terms), per group of runs:

- **clean optimizer steps**: the optimizer steps a clean run logged (its last row's), plus the optimizer steps
  before the fault of a faulty one;
Every step below is an optimizer step (a micro-step log's rows and a Monitor's optimizer steps are converted).

- **false episodes**: alert episodes (a rule on a device from its first FIRING to its resolution; a rise from
  WARNING to ERROR is the same episode) that start before the fault's first logged step, or anywhere in a clean run;
  **per 10k** clean optimizer steps; **of them timing**: those of the timing rules (step_stall, throughput_drop,
  straggler; the time column is nominal, so they speak only to a resume's restart gap); **per 10k, training
  rules**: the same without them;
- **ERRORs on clean runs**: ERROR alerts (first firings and rises) anywhere in a clean run; **pre-fault ERRORs** the
  same before the fault of a faulty run;
- **caught**: an alert of the fault's family (any rule but the timing ones) at or after the fault's first logged
  step (the backtest's detection); **lag** = its optimizer step - the fault's optimizer step; **ERROR lag** the same
  for the first ERROR; **in time**: for a run whose loss diverged (the backtest's rule), the detection no later than
  the divergence's optimizer step.

`--declare` gives the monitor the facts a user could declare (the manifest's `decl_*`: `training.
grad_accumulation_steps` for this log, `total_steps`, `warmup_steps`); without it the config is the seed's (none).
`--cli` also runs `msmon replay --format json` on each trace with the same config file and reports every run where
its alerts differ from the engine's (they must not).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import importlib.util
import json
import logging
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if importlib.util.find_spec("msmon") is None:  # PYTHONPATH may name another tree of msmon (a "before" export)
    sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from msmon.contract.wire import Event, Severity, Status  # noqa: E402
from msmon.offline.backtest.engine import (  # noqa: E402
    TIMING_RULES,
    Alert,
    Label,
    TraceResult,
    alerts_of,
    firing_at_end,
    replay_config,
    score,
)
from msmon.offline.readers import Row, read_csv  # noqa: E402
from msmon.offline.replay import replay, replay_monitor  # noqa: E402

DEFAULT_CONFIG = ROOT / "config" / "monitor.yaml"


@dataclasses.dataclass(frozen=True)
class Episode:
    step: int
    rule: str
    device: str
    severity: Severity  # the highest it reached

    def __str__(self) -> str:
        return f"{self.step} {self.rule} {self.severity.value}"


def episodes(events: Iterable[Event]) -> list[Episode]:
    """Alert episodes: per rule and device, from a first FIRING to its RESOLVED; a rise inside is the same one."""
    open_: dict[tuple[str, str], Episode] = {}
    out: list[Episode] = []
    for e in events:
        key = (e.rule, e.device)
        if e.status is Status.RESOLVED:
            if key in open_:
                out.append(open_.pop(key))
        elif e.status is Status.FIRING and not e.repeat:
            ep = open_.get(key)
            if ep is None:
                open_[key] = Episode(e.step, e.rule, e.device, e.severity)
            elif e.severity is Severity.ERROR:
                open_[key] = dataclasses.replace(ep, severity=Severity.ERROR)
    out.extend(open_.values())
    return sorted(out, key=lambda ep: (ep.step, ep.rule))


@dataclasses.dataclass
class RunScore:
    """One run under one config and step interval, in optimizer steps."""

    run: dict[str, str]  # its manifest row
    step_interval: int
    result: TraceResult
    false_episodes: list[Episode]  # at their optimizer steps
    clean_opt_steps: int
    monitor_accum: int = 1  # rows per optimizer step as the Monitor read the log

    @property
    def clean(self) -> bool:
        return self.run["kind"] == "clean"

    @property
    def false_errors(self) -> int:
        return sum(1 for a in self.result.false_alarms if a.severity is Severity.ERROR)

    @property
    def lag(self) -> int | None:
        d = self.result.detection
        return None if d is None else d.step - int(self.run["fault_opt_step"])

    @property
    def error_lag(self) -> int | None:
        e = self.result.first_error
        return None if e is None or self.clean else e.step - int(self.run["fault_opt_step"])

    @property
    def in_time(self) -> bool | None:
        div = self.run["diverge_opt_step"]
        if not div:
            return None
        d = self.result.detection
        return d is not None and d.step <= int(div)

    def describe(self) -> dict[str, Any]:
        r, res = self.run, self.result
        return {
            "run": r["run"], "split": r["split"], "cell": r["cell"], "step_interval": self.step_interval,
            "fault_opt_step": r["fault_opt_step"] or None, "diverge_opt_step": r["diverge_opt_step"] or None,
            "detection": None if res.detection is None else str(res.detection), "lag": self.lag,
            "error_lag": self.error_lag, "in_time": self.in_time, "clean_opt_steps": self.clean_opt_steps,
            "false_episodes": [str(e) for e in self.false_episodes], "false_errors": self.false_errors,
            "alerts": [f"{a.step} {a.rule} {a.severity.value}" for a in res.alerts],
            "monitor_accum": self.monitor_accum,
        }


def read_manifest(corpus: Path) -> list[dict[str, str]]:
    with open(corpus / "manifest.csv", newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def config_file(base: Path, step_interval: int, run: dict[str, str] | None, folder: Path) -> Path:
    """The config a run is scored with, as a file both the engine and `msmon replay` read: `base` with
    `step_interval` (and, for `run`, the facts a user could declare)."""
    doc = yaml.safe_load(base.read_text(encoding="utf-8"))
    mc = doc.get("monitor_config", doc)
    mc["step_interval"] = step_interval
    name = f"si{step_interval}"
    if run is not None:
        mc.setdefault("training", {}).update({
            "grad_accumulation_steps": int(run["decl_grad_accumulation_steps"]),
            "total_steps": int(run["decl_total_steps"]), "warmup_steps": int(run["decl_warmup_steps"]) or None})
        name += "-" + run["run"]
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


def monitor_accum(monitor: Any) -> int:
    """The rows per optimizer step the Monitor read the log with: its event steps are optimizer steps when > 1
    (declared `training.grad_accumulation_steps`, or inferred from the log where the Monitor infers it)."""
    for dev in getattr(monitor, "_devices", {}).values():
        k = getattr(dev, "accum", None)
        if k:
            return int(k)
    return int(getattr(monitor, "_accum", 1) or 1)


def score_run(run: dict[str, str], rows: Sequence[Row], cfg_path: Path, step_interval: int) -> tuple[RunScore,
                                                                                                    list[Event]]:
    """Replay `rows` through a fresh Monitor on the config file and score the run in optimizer steps: the alerts'
    steps (log rows, or the Monitor's optimizer steps where it read the log as accumulated) and the label's are
    all turned into the run's optimizer steps before the backtest's `score` compares them."""
    cfg = replay_config(str(cfg_path))
    monitor = replay_monitor(cfg, run["run"])
    events = replay(rows, monitor)
    k_monitor, k, micro = monitor_accum(monitor), int(run["accum"]), run["logging"] == "micro"

    def opt(step: int) -> int:
        row = step * k_monitor if k_monitor > 1 else step  # the last row of the Monitor's optimizer step
        return (row - 1) // k + 1 if micro else row

    def in_opt(alerts: Iterable[Alert]) -> list[Alert]:
        return [dataclasses.replace(a, step=opt(a.step)) for a in alerts]

    fault = int(run["fault_opt_step"]) if run["fault_step"] else None
    diverge = int(run["diverge_opt_step"]) if run["diverge_opt_step"] else None
    label = Label(f"runs/{run['run']}.csv", "clean" if fault is None else "training", fault, diverge)
    opt_steps = sorted({(r.step - 1) // k + 1 if micro else r.step for r in rows})
    result = score(label, opt_steps, in_opt(alerts_of(events)), in_opt(firing_at_end(events)))
    false_eps = [e for e in (dataclasses.replace(e, step=opt(e.step)) for e in episodes(events))
                 if fault is None or e.step < fault]
    clean_opt = (opt_steps[-1] if opt_steps else 0) if fault is None else fault - 1
    return RunScore(run, step_interval, result, false_eps, clean_opt, k_monitor), events


def cli_alerts(trace: Path, cfg_path: Path) -> list[Alert]:
    """The alerts `msmon replay --format json` prints for `trace` under `cfg_path`: the same msmon as this process
    (run from the config's folder, so that a PYTHONPATH naming another tree is the one imported)."""
    proc = subprocess.run([sys.executable, "-c", "from msmon.cli.main import main; raise SystemExit(main())",
                           "replay", str(trace.resolve()), "--config", str(cfg_path), "--format", "json", "--no-trend",
                           "--no-progress"], capture_output=True, text=True, cwd=cfg_path.parent, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"msmon replay {trace} failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
    out = []
    for line in proc.stdout.splitlines():
        d = json.loads(line)
        if d["status"] == Status.FIRING.value and not d["repeat"]:
            out.append(Alert(d["step"], d["rule"], Severity(d["severity"]), d["device"]))
    return out


# -- tables -----------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Group:
    scores: list[RunScore]

    @property
    def clean_runs(self) -> list[RunScore]:
        return [s for s in self.scores if s.clean]

    @property
    def faults(self) -> list[RunScore]:
        return [s for s in self.scores if not s.clean]

    def row(self) -> dict[str, Any]:
        steps = sum(s.clean_opt_steps for s in self.scores)
        eps = sum(len(s.false_episodes) for s in self.scores)
        warn = sum(1 for s in self.scores for e in s.false_episodes if e.severity is Severity.WARNING)
        timing = sum(1 for s in self.scores for e in s.false_episodes if e.rule in TIMING_RULES)
        faults = self.faults
        caught = [s for s in faults if s.result.detection is not None]
        lags = [s.lag for s in caught if s.lag is not None]
        diverged = [s for s in faults if s.in_time is not None]
        return {
            "runs": len(self.scores), "clean": len(self.clean_runs), "clean_opt_steps": steps,
            "false_episodes": eps, "false_warning_only": warn, "false_timing": timing,
            "per_10k": None if not steps else eps * 10_000 / steps,
            "per_10k_training": None if not steps else (eps - timing) * 10_000 / steps,
            "errors_clean_runs": sum(s.false_errors for s in self.clean_runs),
            "errors_pre_fault": sum(s.false_errors for s in faults),
            "faults": len(faults), "caught": len(caught),
            "median_lag": None if not lags else statistics.median(lags),
            "max_lag": None if not lags else max(lags),
            "diverged": len(diverged), "in_time": sum(1 for s in diverged if s.in_time),
        }


COLUMNS = (("runs", "runs"), ("clean", "clean"), ("clean_opt_steps", "clean opt steps"),
           ("false_episodes", "false episodes"), ("false_timing", "of them timing"), ("per_10k", "per 10k"),
           ("per_10k_training", "per 10k, training rules"),
           ("errors_clean_runs", "ERRORs clean runs"), ("errors_pre_fault", "ERRORs pre-fault"), ("caught", "caught"),
           ("median_lag", "median lag"), ("max_lag", "max lag"), ("in_time", "in time"))


def _cell(key: str, row: dict[str, Any]) -> str:
    v = row[key]
    if key == "caught":
        return "-" if not row["faults"] else f"{v}/{row['faults']}"
    if key == "in_time":
        return "-" if not row["diverged"] else f"{v}/{row['diverged']}"
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.2f}" if key.startswith("per_10k") else f"{v:g}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def table(title: str, by: Callable[[RunScore], str], scores: Sequence[RunScore], markdown: bool) -> list[str]:
    groups: dict[str, list[RunScore]] = {}
    for s in scores:
        groups.setdefault(by(s), []).append(s)
    keys = sorted(groups)
    rows = [(k, Group(groups[k]).row()) for k in keys] + [("all", Group(list(scores)).row())]
    head = [title] + [name for _, name in COLUMNS]
    body = [[k] + [_cell(c, r) for c, _ in COLUMNS] for k, r in rows]
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(b) + " |" for b in body]
        return lines
    widths = [max(len(x[i]) for x in [head] + body) for i in range(len(head))]
    return ["  ".join(x[i].ljust(widths[i]) for i in range(len(head))) for x in [head] + body]


VIEWS: dict[str, Callable[[RunScore], str]] = {
    "fault": lambda s: s.run["fault"],
    "schedule": lambda s: s.run["schedule"],
    "accum x logging": lambda s: f"a{int(s.run['accum']):02d} {s.run['logging']}",
    "optimizer / loss scale / extra": lambda s: f"{s.run['optimizer']}{' +ls' if s.run['loss_scale'] == '1' else ''}"
                                               f" {s.run['extra']}",
    "cell (schedule/accum/logging/fault)": lambda s: s.run["cell"],
}


def report(scores: Sequence[RunScore], markdown: bool, cells: bool) -> list[str]:
    lines: list[str] = []
    for split in sorted({s.run["split"] for s in scores}):
        for si in sorted({s.step_interval for s in scores}):
            part = [s for s in scores if s.run["split"] == split and s.step_interval == si]
            lines.append(f"\n## {split}, step_interval {si}: {len(part)} runs\n")
            for title, by in VIEWS.items():
                if title.startswith("cell") and not cells:
                    continue
                lines += table(title, by, part, markdown) + [""]
            worst = sorted((s for s in part if s.false_episodes), key=lambda s: -len(s.false_episodes))[:8]
            if worst:
                lines.append("most false episodes: " + "; ".join(
                    f"{s.run['run']}: {', '.join(str(e) for e in s.false_episodes[:4])}"
                    f"{' ...' if len(s.false_episodes) > 4 else ''}" for s in worst))
            missed = [s.run["run"] for s in part if not s.clean and s.result.detection is None]
            if missed:
                lines.append(f"missed ({len(missed)}): {', '.join(missed)}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("corpus", type=Path)
    p.add_argument("--split", choices=("tune", "heldout", "all"), default="all")
    p.add_argument("--step-interval", type=int, nargs="+", default=[1, 10])
    p.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    p.add_argument("--declare", action="store_true", help="declare the runs' config facts (manifest decl_*)")
    p.add_argument("--cli", action="store_true", help="also run `msmon replay` on every trace; report disagreements")
    p.add_argument("--format", choices=("text", "markdown", "json"), default="text")
    p.add_argument("--cells", action="store_true", help="also the full schedule/accum/logging/fault table")
    p.add_argument("--runs", nargs="*", default=None, help="only these run names")
    p.add_argument("--json-out", type=Path, default=None, help="write every run's score to this JSON file")
    args = p.parse_args(argv)
    logging.getLogger("msmon").setLevel(logging.CRITICAL)  # the alerts' own log lines: the tables say it
    runs = [r for r in read_manifest(args.corpus) if args.split in ("all", r["split"])
            and (args.runs is None or r["run"] in args.runs)]
    if not runs:
        print(f"score: no runs in {args.corpus}/manifest.csv for split {args.split}", file=sys.stderr)
        return 2
    scores: list[RunScore] = []
    disagree: list[str] = []
    with tempfile.TemporaryDirectory(prefix="corpus-score-") as tmp:
        folder = Path(tmp)
        shared = {si: config_file(args.config, si, None, folder) for si in args.step_interval}
        for run in runs:
            trace = args.corpus / "runs" / f"{run['run']}.csv"
            rows = list(read_csv(str(trace)))
            for si in args.step_interval:
                cfg = config_file(args.config, si, run, folder) if args.declare else shared[si]
                sc, events = score_run(run, rows, cfg, si)
                scores.append(sc)
                if args.cli:  # the Monitor's own alerts, at the steps it reported them, both ways
                    cli, api = cli_alerts(trace, cfg), alerts_of(events)
                    if cli != api:
                        disagree.append(f"{run['run']} step_interval {si}: engine {[str(a) for a in api]} vs msmon "
                                        f"replay {[str(a) for a in cli]}")
    if args.json_out is not None:
        args.json_out.write_text(json.dumps([s.describe() for s in scores], indent=1) + "\n", encoding="utf-8")
    if args.format == "json":
        print(json.dumps({"runs": [s.describe() for s in scores], "disagreements": disagree}, indent=1))
    else:
        what = "declared facts" if args.declare else "no facts declared"
        print(f"# corpus {args.corpus}: {len(runs)} runs, config {args.config} ({what})")
        print("\n".join(report(scores, args.format == "markdown", args.cells)))
        if args.cli:
            print(f"\nmsmon replay vs the engine: {len(disagree)} disagreement(s) in {len(scores)} replays")
            for d in disagree:
                print("  " + d)
    return 1 if disagree else 0


if __name__ == "__main__":
    sys.exit(main())
