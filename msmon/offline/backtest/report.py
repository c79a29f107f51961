"""Backtest results as text, Markdown (the README tables) or JSON."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from msmon.offline.backtest.engine import Alert, Run, Summary, TraceResult


def _alert(a: Alert | None) -> str:
    return "-" if a is None else f"{a.step} {a.rule}"


def _opt(v: int | None) -> str:
    return "-" if v is None else str(v)


def _in_time(r: TraceResult) -> str:
    if r.diverge_step is not None:
        return "yes" if r.in_time else "no"
    if r.caught is None:
        return "-"
    return "caught" if r.caught else "missed"


TRACE_COLUMNS = ("trace", "kind", "steps", "fault", "diverge", "first WARNING", "first ERROR", "lead",
                 "in time", "false alarms")


def trace_cells(r: TraceResult) -> list[str]:
    fa = str(len(r.false_alarms))
    if r.false_alarms:
        fa += " (" + ", ".join(str(a) for a in r.false_alarms[:3]) + (", ..." if len(r.false_alarms) > 3 else "") + ")"
    return [r.trace, r.kind, f"{r.steps:,}", _opt(r.fault_step), _opt(r.diverge_step), _alert(r.first_warning),
            _alert(r.first_error), _opt(r.lead), _in_time(r), fa]


def _quiet(r: TraceResult) -> bool:
    return r.kind == "clean" and not r.alerts


def _fmt_lead(v: float | None) -> str:
    return "-" if v is None else f"{v:g}"


SUMMARY_ROWS: tuple[tuple[str, Callable[[Summary], str]], ...] = (
    ("traces (clean)", lambda s: f"{s.traces} ({s.clean_traces})"),
    ("divergences caught in time (lead >= 0)", lambda s: f"{s.in_time} / {s.divergences}"),
    ("median lead, first alert (steps)", lambda s: _fmt_lead(s.median_lead)),
    ("median lead, first ERROR (steps)", lambda s: _fmt_lead(s.median_error_lead)),
    ("faults caught at all", lambda s: f"{s.caught} / {s.faults}"),
    ("false alarms / 10k clean steps", lambda s: "-" if s.false_alarms_per_10k is None else
     f"{s.false_alarms_per_10k:.2f} ({s.false_alarms} in {s.clean_steps:,})"),
)


def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
    return lines


def _text_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=False)]
    return ["  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in [header, *rows]]


def _quiet_line(results: Sequence[TraceResult]) -> str | None:
    quiet = [r for r in results if _quiet(r)]
    if not quiet:
        return None
    return f"{len(quiet)} clean trace(s) not listed, {sum(r.steps for r in quiet):,} steps: no alert"


def _title(run: Run) -> str:
    return f"{run.config} (step_interval {run.step_interval})"


def _report(runs: Sequence[Run], table: Callable[[Sequence[str], Sequence[Sequence[str]]], list[str]],
            heading: Callable[[str], str]) -> str:
    out: list[str] = []
    for run in runs:
        out.append(heading(_title(run)))
        out += table(TRACE_COLUMNS, [trace_cells(r) for r in run.results if not _quiet(r)])
        quiet = _quiet_line(run.results)
        if quiet:
            out += ["", quiet]
        out.append("")
    summaries = [run.summary() for run in runs]
    out.append(heading("summary"))
    out += table(["", *(_title(r) for r in runs)], [[name, *(f(s) for s in summaries)] for name, f in SUMMARY_ROWS])
    return "\n".join(out)


def text(runs: Sequence[Run]) -> str:
    return _report(runs, _text_table, lambda t: f"== {t}")


def markdown(runs: Sequence[Run]) -> str:
    return _report(runs, _md_table, lambda t: f"#### {t}\n")


def _alert_json(a: Alert | None) -> dict[str, Any] | None:
    if a is None:
        return None
    return {"step": a.step, "rule": a.rule, "severity": a.severity.value, "device": a.device}


def _trace_json(r: TraceResult) -> dict[str, Any]:
    return {
        "trace": r.trace, "kind": r.kind, "steps": r.steps, "clean_steps": r.clean_steps,
        "fault_step": r.fault_step, "diverge_step": r.diverge_step, "caught": r.caught, "in_time": r.in_time,
        "lead": r.lead, "error_lead": r.error_lead, "detection": _alert_json(r.detection),
        "first_warning": _alert_json(r.first_warning), "first_error": _alert_json(r.first_error),
        "false_alarms": [_alert_json(a) for a in r.false_alarms], "alerts": [_alert_json(a) for a in r.alerts],
        "still_firing": r.still_firing, "held": [_alert_json(a) for a in r.held],
    }


def _summary_json(s: Summary) -> dict[str, Any]:
    return {
        "traces": s.traces, "clean_traces": s.clean_traces, "faults": s.faults, "caught": s.caught,
        "divergences": s.divergences, "in_time": s.in_time, "median_lead": s.median_lead,
        "median_error_lead": s.median_error_lead, "clean_steps": s.clean_steps, "false_alarms": s.false_alarms,
        "false_alarms_per_10k": s.false_alarms_per_10k,
    }


def as_json(runs: Sequence[Run]) -> str:
    return json.dumps({"runs": [{"config": run.config, "step_interval": run.step_interval,
                                 "traces": [_trace_json(r) for r in run.results],
                                 "summary": _summary_json(run.summary())} for run in runs]}, indent=1)


FORMATS: dict[str, Callable[[Sequence[Run]], str]] = {"text": text, "markdown": markdown, "json": as_json}
