"""Condense `msmon backtest --format json` outputs of two code versions into the README's before/after tables.

    msmon backtest data/backtest/mindspore-cpu --config config/monitor.yaml --config config/fixed-thresholds.yaml \\
        --format json > after-cpu.json        # likewise before-cpu.json from the older commit's export
    .venv/bin/python bench/backtest_before_after.py --cpu before-cpu.json after-cpu.json \\
        --real before-real.json after-real.json [--traces early-grad-x10.csv grad-creep.csv ...]

Prints two markdown tables: the summary (faults caught, divergences in time, median lead, false alarms per 10k
clean steps on the CPU traces and the real ones), config by config, before and after; and one row per named
trace: the first alert (step, rule), its delay after the fault's onset, its lead before the loss doubled, and
whether an alert of the fault's family was still firing at the end (a level shift must stay visible).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

ISSUE13 = ("early-grad-x10.csv", "grad-creep.csv", "shard-switch.csv", "clean-throughput.csv")


def _runs(path: str) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        runs: list[dict[str, Any]] = json.load(f)["runs"]
    return runs


def _name(run: dict[str, Any]) -> str:
    return str(run["config"]).rsplit("/", 1)[-1]


def _fa(s: dict[str, Any]) -> str:
    return f"{s['false_alarms_per_10k']:.2f} ({s['false_alarms']} in {s['clean_steps']:,})"


def summary_table(cpu: Sequence[list[dict[str, Any]]], real: Sequence[list[dict[str, Any]]] | None) -> str:
    """Rows: the measures; columns: each config before and after."""
    heads = [f"{_name(r)} {when}" for r in cpu[0] for when in ("before", "after")]
    pairs = list(zip(cpu[0], cpu[1], strict=True))
    rows: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
        ("faults caught at all (CPU)", lambda s: f"{s['caught']} / {s['faults']}"),
        ("divergences caught in time (CPU)", lambda s: f"{s['in_time']} / {s['divergences']}"),
        ("median lead, first alert (CPU, steps)", lambda s: f"{s['median_lead']:g}"),
        ("median lead, first ERROR (CPU, steps)", lambda s: f"{s['median_error_lead']:g}"),
        ("false alarms / 10k clean CPU steps", _fa),
    ]
    out = ["|  | " + " | ".join(heads) + " |", "|---" * (len(heads) + 1) + "|"]
    for label, cell in rows:
        out.append(f"| {label} | " + " | ".join(cell(r["summary"]) for b, a in pairs for r in (b, a)) + " |")
    if real is not None:
        rp = list(zip(real[0], real[1], strict=True))
        out.append("| faults caught at all (real) | " + " | ".join(
            f"{r['summary']['caught']} / {r['summary']['faults']}" for b, a in rp for r in (b, a)) + " |")
        out.append("| divergences caught in time (real) | " + " | ".join(
            f"{r['summary']['in_time']} / {r['summary']['divergences']}" for b, a in rp for r in (b, a)) + " |")
        out.append("| false alarms / 10k clean real steps | " + " | ".join(
            _fa(r["summary"]) for b, a in rp for r in (b, a)) + " |")
    return "\n".join(out)


def _cell(t: dict[str, Any]) -> str:
    if t["kind"] == "clean":
        fa = t["false_alarms"]
        return "quiet" if not fa else f"{len(fa)} false ({', '.join(str(a['step']) + ' ' + a['rule'] for a in fa[:2])})"
    d = t["detection"]
    if d is None:
        return "missed"
    lead = f", lead {t['lead']}" if t["lead"] is not None else ""
    held = t.get("still_firing")  # absent from JSON of before the engine said it
    end = "" if held is None else ("; firing at the end" if held else "; resolved by the end")
    return f"{d['step']} {d['rule']} (+{d['step'] - t['fault_step']}{lead}{end})"


def trace_table(cpu: Sequence[list[dict[str, Any]]], names: Sequence[str]) -> str:
    """One row per trace: its first alert in every config, before and after."""
    heads = [f"{_name(r)} {when}" for r in cpu[0] for when in ("before", "after")]
    out = ["| trace | " + " | ".join(heads) + " |", "|---" * (len(heads) + 1) + "|"]
    for name in names:
        cells = []
        for b, a in zip(cpu[0], cpu[1], strict=True):
            for run in (b, a):
                t = next((t for t in run["traces"] if t["trace"] == name), None)
                cells.append("-" if t is None else _cell(t))
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu", nargs=2, required=True, metavar=("BEFORE", "AFTER"), help="backtest JSON of the CPU traces")
    p.add_argument("--real", nargs=2, default=None, metavar=("BEFORE", "AFTER"), help="backtest JSON of real traces")
    p.add_argument("--traces", nargs="*", default=list(ISSUE13), help="traces with a row each (default: issue 13's)")
    args = p.parse_args(argv)
    cpu = [_runs(path) for path in args.cpu]
    real = [_runs(path) for path in args.real] if args.real else None
    print(summary_table(cpu, real))
    print()
    print(trace_table(cpu, args.traces))
    return 0


if __name__ == "__main__":
    sys.exit(main())
