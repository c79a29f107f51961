"""`msmon backtest`: the scoring definitions on small cases with exact numbers, the labels file, the trace
sources, the CLI on the committed MindSpore CPU traces, the generator (real training) and the real traces."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
from pathlib import Path

import pytest

from msmon.cli.main import main
from msmon.contract.wire import Event
from msmon.offline.backtest.engine import (
    LABEL_COLUMNS,
    Alert,
    BacktestError,
    Label,
    alerts_of,
    clean_step_count,
    divergence_step,
    firing_at_end,
    read_labels,
    score,
    summarize,
)
from msmon.offline.backtest.sources import expand, load
from msmon.offline.readers import Row
from notifier import Severity, Status
from tests.conftest import ROOT
from tests.fakes import analysis_data as data
from tests.fakes import mindformers_logs as mfl

W, E = Severity.WARNING, Severity.ERROR
MS_TRACES = ROOT / "data" / "backtest" / "mindspore-cpu"
ADAPTIVE = str(ROOT / "config" / "monitor.yaml")
FIXED = str(ROOT / "config" / "fixed-thresholds.yaml")


def a(step: int, rule: str, sev: Severity = W) -> Alert:
    return Alert(step, rule, sev)


# -- scoring -------------------------------------------------------------------------------------


def test_clean_trace_every_alert_is_a_false_alarm() -> None:
    r = score(Label("c.csv"), range(1, 1001), [a(100, "loss_spike"), a(500, "step_stall", E)])
    assert (r.steps, r.clean_steps) == (1000, 1000)
    assert r.false_alarms == [a(100, "loss_spike"), a(500, "step_stall", E)]
    assert (r.first_warning, r.first_error) == (a(100, "loss_spike"), a(500, "step_stall", E))
    assert (r.caught, r.detection, r.lead, r.in_time) == (None, None, None, None)


def test_divergence_lead_false_alarms_and_the_other_family() -> None:
    label = Label("d.csv", "training", fault_step=600, diverge_step=700)
    alerts = [a(300, "loss_spike"), a(610, "throughput_drop"), a(650, "grad_norm_spike"),
              a(690, "grad_norm_spike", E), a(720, "loss_spike", E)]
    r = score(label, range(1, 1001), alerts)
    assert r.clean_steps == 599  # steps 1..599: before the fault
    assert r.false_alarms == [a(300, "loss_spike")]
    assert r.detection == a(650, "grad_norm_spike")  # the throughput alert at 610 says nothing about the loss
    assert (r.first_warning, r.first_error) == (a(650, "grad_norm_spike"), a(690, "grad_norm_spike", E))
    assert (r.caught, r.lead, r.error_lead, r.in_time) == (True, 50, 10, True)


@pytest.mark.parametrize(("alert_step", "lead", "in_time"), [(700, 0, True), (701, -1, False), (720, -20, False)])
def test_in_time_means_no_later_than_the_doubling(alert_step: int, lead: int, in_time: bool) -> None:
    r = score(Label("d.csv", "training", 600, 700), range(1, 1001), [a(alert_step, "nonfinite", E)])
    assert (r.caught, r.lead, r.in_time) == (True, lead, in_time)


def test_missed_divergence_and_alerts_before_the_fault() -> None:
    r = score(Label("d.csv", "training", 600, 700), range(1, 1001), [a(599, "grad_norm", E)])
    assert r.false_alarms == [a(599, "grad_norm", E)]
    assert (r.caught, r.detection, r.lead, r.in_time) == (False, None, None, False)


def test_timing_fault_is_caught_by_a_timing_rule_only() -> None:
    label = Label("s.csv", "timing", fault_step=2005)
    r = score(label, range(1, 3001), [a(2010, "loss_spike"), a(2070, "throughput_drop", E)])
    assert r.detection == a(2070, "throughput_drop", E)
    assert (r.caught, r.lead, r.in_time, r.false_alarms) == (True, None, None, [])
    assert score(label, range(1, 3001), [a(2010, "grad_norm_spike")]).caught is False


def test_clean_steps_are_logged_steps_before_the_fault() -> None:
    steps = list(range(10, 101, 10))  # a log with every 10th step
    assert clean_step_count(steps, 55) == 5
    assert clean_step_count(steps, 10) == 0
    assert clean_step_count(steps, None) == 10


def test_summary_numbers() -> None:
    results = [
        score(Label("c1"), range(20_000), [a(5, "step_stall")]),
        score(Label("c2"), range(10_000), []),
        score(Label("d1", "training", 1000, 1100), range(2000), [a(1090, "grad_norm_spike")]),  # lead 10
        score(Label("d2", "training", 1000, 1010), range(2000), [a(1020, "loss_spike", E)]),  # lead -10
        score(Label("d3", "training", 1000, 1200), range(2000), [a(1150, "lr_schedule"), a(1190, "nonfinite", E)]),
        score(Label("t1", "timing", 500), range(1000), []),  # missed
    ]
    s = summarize(results)
    assert (s.traces, s.clean_traces, s.faults, s.caught, s.divergences, s.in_time) == (6, 2, 4, 3, 3, 2)
    assert (s.median_lead, s.median_error_lead) == (10.0, 0.0)  # leads 10, -10, 50; ERROR leads -10, 10
    assert s.clean_steps == 20_000 + 10_000 + 3 * 1000 + 500
    assert s.false_alarms == 1
    assert s.false_alarms_per_10k == pytest.approx(10_000 / 33_500)


def test_alerts_are_first_firings_not_reminders_or_resolutions() -> None:
    def ev(step: int, status: Status, sev: Severity = W, repeat: bool = False) -> Event:
        return Event(run_id="r", device="0", step=step, time=0.0, rule="loss_spike", severity=sev, status=status,
                     value=1.0, threshold=1.0, message="m", repeat=repeat)

    events = [ev(10, Status.FIRING), ev(20, Status.FIRING, E), ev(520, Status.FIRING, E, repeat=True),
              ev(530, Status.RESOLVED, E)]
    assert alerts_of(events) == [a(10, "loss_spike"), a(20, "loss_spike", E)]  # a rise is a new alert


# -- the divergence labelling rule ---------------------------------------------------------------


def rows(losses: list[float], start: int = 1) -> list[Row]:
    return [Row(step=start + i, loss=x) for i, x in enumerate(losses)]


def test_divergence_step_is_the_first_doubling_against_the_pre_fault_median() -> None:
    trace = rows([1.0] * 150 + [1.2, 1.9, 2.0, 3.0])  # fault at 151; median of the 100 steps before = 1.0
    assert divergence_step(trace, 151) == 153
    assert divergence_step(trace, 151, skip=[153]) == 154
    assert divergence_step(rows([1.0] * 150 + [1.5] * 10), 151) is None
    assert divergence_step(rows([1.0] * 10 + [math.nan]), 11) == 11
    # only the last 100 steps before the fault count: an early high loss does not raise the reference
    assert divergence_step(rows([9.0] * 50 + [1.0] * 100 + [2.5]), 151) == 151
    with pytest.raises(BacktestError, match="no finite loss logged before the fault step 1"):
        divergence_step(rows([1.0, 2.0]), 1)


# -- the labels file -----------------------------------------------------------------------------

HEADER = "trace,kind,fault_step,diverge_step,format,notes\n"


def test_labels_file(write) -> None:
    path = write("labels.csv", HEADER + "a.csv,,,,,clean run\nb.csv,,100,120,,\nc.csv,timing,50,,csv,\n"
                 "d.csv#S 1,training,7,,bloom,x\n")
    assert read_labels(path) == [
        Label("a.csv", "clean", None, None, "csv", "clean run"),
        Label("b.csv", "training", 100, 120, "csv", ""),  # kind defaults to training when a fault is given
        Label("c.csv", "timing", 50, None, "csv", ""),
        Label("d.csv#S 1", "training", 7, None, "bloom", "x"),
    ]


@pytest.mark.parametrize(("body", "message"), [
    ("a.csv,clean,5,,,\n", r"labels.csv:2 \(a.csv\): a clean trace has no fault_step or diverge_step"),
    ("a.csv,training,,,,\n", r"labels.csv:2 \(a.csv\): a training fault needs its fault_step"),
    ("a.csv,timing,5,9,,\n", r"labels.csv:2 \(a.csv\): a timing fault has no diverge_step"),
    ("a.csv,training,50,40,,\n", r"labels.csv:2 \(a.csv\): diverge_step 40 is before fault_step 50"),
    ("a.csv,broken,5,,,\n", r"labels.csv:2: kind 'broken' is not one of clean, training, timing"),
    ("a.csv,,5x,,,\n", r"labels.csv:2: column fault_step holds '5x'; expected a step number or nothing"),
    (",,,,,\n", r"labels.csv:2: empty trace"),
    ("", r"labels.csv: no traces listed"),
])
def test_labels_file_errors_say_where_and_what(write, body: str, message: str) -> None:
    with pytest.raises(BacktestError, match=message):
        read_labels(write("labels.csv", HEADER + body))


def test_labels_file_header_errors(write, tmp_path: Path) -> None:
    with pytest.raises(BacktestError, match="missing column.s. diverge_step"):
        read_labels(write("l1.csv", "trace,fault_step\na.csv,\n"))
    with pytest.raises(BacktestError, match="unknown column.s. fault; columns are trace,kind"):
        read_labels(write("l2.csv", "trace,fault,fault_step,diverge_step\n"))
    with pytest.raises(BacktestError, match="cannot read the labels file .*nope.csv.*Pass --labels FILE"):
        read_labels(str(tmp_path / "nope.csv"))


# -- trace sources -------------------------------------------------------------------------------

BLOOM = ("source_file,line_no,section,iteration,learning_rate,lm_loss,grad_norm\n"
         "f,1,S,10,1e-4,2.5,0.000\nf,2,S,20,1e-4,,3.5\nf,3,T,5,1e-4,2.0,1.0\nf,4,T,5,1e-4,2.0,1.0\n")


def test_bloom_section_adapter(tmp_path: Path) -> None:
    (tmp_path / "it.csv").write_text(BLOOM)
    t = load(tmp_path, Label("it.csv#S", "training", 20, None, "bloom"))
    assert [(r.step, r.grad_norm, r.lr) for r in t.rows] == [(10, None, 1e-4), (20, 3.5, 1e-4)]  # 0.000: not logged
    assert t.rows[0].loss == 2.5 and math.isnan(t.rows[1].loss or 0.0)  # blank loss: not printed, i.e. NaN
    assert t.step_interval == 1  # quoted lines: every line is a sample
    with pytest.raises(BacktestError, match=r"it.csv:5: section 'T' repeats or goes back to iteration 5"):
        load(tmp_path, Label("it.csv#T", "clean", format="bloom"))
    with pytest.raises(BacktestError, match="name the section of a bloom trace after '#'"):
        load(tmp_path, Label("it.csv", "clean", format="bloom"))


def test_glob_patterns_and_missing_files(tmp_path: Path) -> None:
    (tmp_path / "runs").mkdir()
    for name in ("b.csv", "a.csv"):
        (tmp_path / "runs" / name).write_text("step,loss\n1,2.0\n2,2.1\n")
    assert [x.trace for x in expand(tmp_path, [Label("runs/*.csv")])] == ["runs/a.csv", "runs/b.csv"]
    with pytest.raises(BacktestError, match="no file matches 'other/\\*.csv'"):
        expand(tmp_path, [Label("other/*.csv")])
    with pytest.raises(BacktestError, match="runs/c.csv: no such trace file .*relative to the traces folder"):
        load(tmp_path, Label("runs/c.csv"))
    with pytest.raises(BacktestError, match="unknown format 'parquet'; formats are csv, bloom"):
        expand(tmp_path, [Label("runs/a.csv", format="parquet")])
    assert [r.step for r in load(tmp_path, Label("runs/a.csv")).rows] == [1, 2]


def test_mindformers_traces_a_log_or_a_runs_folder(tmp_path: Path, capsys) -> None:
    """Label format `mindformers`: a worker log, or a run's output folder (every rank), globbed or named."""
    faulty = mfl.steps_from(data.run(800, grad_jump=(650, 5, 20.0)))
    healthy = mfl.steps_from(data.run(800, seed=11))
    for run, per_rank in (("runs/burst", [healthy, faulty]), ("runs/clean", [healthy, healthy])):
        for rank, steps in enumerate(per_rank):
            mfl.write(tmp_path / run / "msrun_log" / f"worker_{rank}.log",
                      mfl.current_lines(steps, steps_per_epoch=400, epochs=2))
    assert [x.trace for x in expand(tmp_path, [Label("runs/*", format="mindformers")])] == ["runs/burst", "runs/clean"]
    one = load(tmp_path, Label("runs/burst/msrun_log/worker_1.log", "training", 651, format="mindformers"))
    assert [r.step for r in one.rows] == list(range(1, 801)) and one.step_interval is None  # sampled as live
    with pytest.raises(BacktestError, match="a MindFormers trace has no sections"):
        load(tmp_path, Label("runs/burst#x", format="mindformers"))
    (tmp_path / "labels.csv").write_text(HEADER + "runs/burst,training,651,,mindformers,rank 1 grad burst\n"
                                         "runs/clean,clean,,,mindformers,\n")
    cfg = data.monitor_yaml(tmp_path / "monitor.yaml", "  per_device_metrics: true\n")
    (run,) = backtest_json(capsys, str(tmp_path), "--config", cfg)
    traces = by_trace(run)
    assert traces["runs/burst"]["caught"] is True and traces["runs/burst"]["first_error"]["step"] == 652
    assert traces["runs/clean"]["false_alarms"] == []


# -- the CLI on the committed MindSpore CPU traces -----------------------------------------------


def backtest_json(capsys, *args: str) -> list[dict]:
    assert main(["backtest", *args, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)["runs"]


def by_trace(run: dict) -> dict[str, dict]:
    return {t["trace"]: t for t in run["traces"]}


# the first eight traces (faults at 2005); issue 13's classes (early fault, creep, shard switch, throughput
# noise) are scored in the README's before/after table, not held to these targets yet
FIRST_TRACES = ("clean-seed1.csv", "clean-seed2.csv", "clean-seed3.csv", "lr-jump.csv", "lr-creep.csv",
                "corrupt-burst.csv", "loader-slowdown.csv", "nan.csv")
ISSUE13_TRACES = ("early-grad-x10.csv", "grad-creep.csv", "shard-switch.csv", "clean-throughput.csv")


@pytest.fixture
def first_labels(tmp_path: Path) -> str:
    """The committed labels of FIRST_TRACES only, as a labels file."""
    with open(MS_TRACES / "labels.csv", newline="", encoding="utf-8") as f:
        rows = [r for r in csv.DictReader(f) if r["trace"] in FIRST_TRACES]
    path = tmp_path / "first-labels.csv"
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=LABEL_COLUMNS)
        w.writeheader()
        w.writerows(rows)
    return str(path)


def test_committed_traces_adaptive_vs_fixed_at_the_example_step_interval(capsys, first_labels: str) -> None:
    """config/monitor.yaml samples every 10th step: every divergence is caught before the loss doubles (the
    NaN appears at 2005, between two samples, and is caught at 2005: a non-finite loss handed in on any step
    is sampled), each with at least the lead of the fixed thresholds; the slowdown is caught; no false alarm
    from a training rule."""
    adaptive, fixed = backtest_json(capsys, str(MS_TRACES), "--labels", first_labels, "--config", ADAPTIVE,
                                    "--config", FIXED)
    ad, fx = by_trace(adaptive), by_trace(fixed)
    diverged = [name for name, t in ad.items() if t["diverge_step"] is not None]
    assert sorted(diverged) == ["corrupt-burst.csv", "lr-creep.csv", "lr-jump.csv", "nan.csv"]
    for name in diverged:
        t = ad[name]
        assert t["caught"], name
        sampled_after = -(-t["diverge_step"] // 10) * 10  # the first sampled step at or after the doubling
        assert t["detection"]["step"] <= sampled_after, (name, t["detection"])
        assert t["in_time"], (name, t["detection"])
        assert fx[name]["lead"] is None or t["lead"] >= fx[name]["lead"], (name, t["lead"], fx[name]["lead"])
    assert ad["loader-slowdown.csv"]["caught"] and not fx["loader-slowdown.csv"]["caught"]
    s = adaptive["summary"]
    training_fa = [f for t in adaptive["traces"] for f in t["false_alarms"] if f["rule"] not in
                   ("throughput_drop", "step_stall", "straggler")]
    assert training_fa == []
    assert s["false_alarms_per_10k"] <= 1.0, [(t["trace"], t["false_alarms"]) for t in adaptive["traces"]]
    assert s["median_lead"] > fixed["summary"]["median_lead"]
    assert (s["divergences"], s["in_time"]) == (4, 4)


def test_committed_traces_every_divergence_in_time_when_sampling_every_step(capsys, first_labels: str) -> None:
    (adaptive,) = backtest_json(capsys, str(MS_TRACES), "--labels", first_labels, "--config", ADAPTIVE,
                                "--step-interval", "1")
    s = adaptive["summary"]
    assert s["divergences"] == 4 and s["in_time"] == 4, [(t["trace"], t["lead"]) for t in adaptive["traces"]]
    assert s["caught"] == s["faults"] == 5
    assert s["false_alarms_per_10k"] <= 1.0, [(t["trace"], t["false_alarms"]) for t in adaptive["traces"]]


def test_issue13_traces_are_labelled_and_scored(capsys) -> None:
    """The four classes of issue 13 are in the committed labels as documented and every config scores them."""
    adaptive, fixed = backtest_json(capsys, str(MS_TRACES), "--config", ADAPTIVE, "--config", FIXED)
    for run in (adaptive, fixed):
        t = by_trace(run)
        assert set(ISSUE13_TRACES) <= set(t)
        assert (t["early-grad-x10.csv"]["fault_step"], t["early-grad-x10.csv"]["diverge_step"]) == (250, 253)
        assert t["grad-creep.csv"]["fault_step"] == 1005 and t["grad-creep.csv"]["diverge_step"] > 1500
        assert (t["shard-switch.csv"]["kind"], t["shard-switch.csv"]["diverge_step"]) == ("training", None)
        assert t["clean-throughput.csv"]["kind"] == "clean" and t["clean-throughput.csv"]["steps"] == 3000
    trace = load(MS_TRACES, Label("clean-throughput.csv"))
    assert all(r.time is None and r.throughput and r.throughput > 0 for r in trace.rows)


def test_markdown_tables_print(capsys) -> None:
    assert main(["backtest", str(MS_TRACES), "--config", ADAPTIVE, "--config", FIXED, "--format", "markdown"]) == 0
    out = capsys.readouterr().out
    assert ("| trace | kind | steps | fault | diverge | first WARNING | first ERROR | lead | in time "
            "| false alarms |") in out
    assert f"|  | {ADAPTIVE} (step_interval 10) | {FIXED} (step_interval 10) |" in out
    assert "| divergences caught in time (lead >= 0) |" in out
    assert "| lr-jump.csv | training | 3,000 | 2005 |" in out


def test_cli_errors(capsys, tmp_path: Path, write) -> None:
    assert main(["backtest", str(tmp_path / "nope")]) == 2
    assert "is not a folder" in capsys.readouterr().err
    assert main(["backtest", str(tmp_path)]) == 2
    assert "cannot read the labels file" in capsys.readouterr().err
    off = write("off.yaml", "monitor_config:\n  monitor_on: false\n")
    assert main(["backtest", str(MS_TRACES), "--config", off]) == 2
    assert "monitor_on is false, so this config monitors nothing" in capsys.readouterr().err
    assert main(["backtest", str(MS_TRACES), "--step-interval", "0"]) == 2
    assert "--step-interval must be at least 1" in capsys.readouterr().err


# -- the generator: real MindSpore training ------------------------------------------------------


@pytest.mark.mindspore
def test_generator_trains_one_short_trace_and_labels_it(tmp_path: Path) -> None:
    """The LR-jump scenario cut to 450 steps, the jump at 305: real training, a CSV msmon reads back, and a
    label by the divergence rule."""
    pytest.importorskip("mindspore", reason="MindSpore is not installed (pip install msmon[mindspore])")
    from bench import gen_backtest_traces as gen

    jump = next(s for s in gen.SCENARIOS if s.name == "lr-jump")
    sc = dataclasses.replace(jump, steps=450, fault_step=305)
    (label,) = gen.generate([sc], tmp_path, log=lambda line: None)
    trace = load(tmp_path, read_label(label))
    assert [r.step for r in trace.rows] == list(range(1, 451))
    assert trace.rows[0].lr == pytest.approx(0.005) and trace.rows[200].lr == pytest.approx(0.05)
    assert trace.rows[304].lr == pytest.approx(0.2)  # step 305: x4
    times = [r.time for r in trace.rows]
    assert all(t is not None for t in times) and times == sorted(times)
    diverge = int(label["diverge_step"])
    assert 305 < diverge <= 450
    assert diverge == divergence_step(trace.rows, 305)


@pytest.mark.mindspore
def test_generator_scales_gradients_with_a_flat_lr_and_logs_throughput_without_time(tmp_path: Path) -> None:
    """The early fault cut to 60 steps, its x10 at 40: the grad norm jumps while the logged LR stays; the
    throughput scenario cut to 30 steps writes samples/s and no time column."""
    pytest.importorskip("mindspore", reason="MindSpore is not installed (pip install msmon[mindspore])")
    from bench import gen_backtest_traces as gen

    early = dataclasses.replace(next(s for s in gen.SCENARIOS if s.name == "early-grad-x10"), steps=60, fault_step=40)
    noisy = dataclasses.replace(next(s for s in gen.SCENARIOS if s.name == "clean-throughput"), steps=30)
    gen.generate([early, noisy], tmp_path, log=lambda line: None)
    rows = load(tmp_path, Label("early-grad-x10.csv")).rows
    assert [r.lr for r in rows[38:41]] == pytest.approx([early.lr(s) for s in (39, 40, 41)], rel=1e-5)  # the schedule
    assert rows[39].grad_norm > 5 * rows[38].grad_norm  # step 40: x10 gradients, the loss not yet moved
    assert rows[39].loss == pytest.approx(rows[38].loss, rel=0.5)
    with open(tmp_path / "clean-throughput.csv", encoding="utf-8") as f:
        assert f.readline().strip() == "step,loss,learning_rate,grad_norm,throughput"
    assert all(r.time is None and r.throughput and r.throughput > 0 for r in load(tmp_path, Label(
        "clean-throughput.csv")).rows)


def read_label(rec: dict[str, str]) -> Label:
    return Label(rec["trace"], rec["kind"], int(rec["fault_step"]), int(rec["diverge_step"] or 0) or None,
                 rec["format"], rec["notes"])


# -- the real traces -----------------------------------------------------------------------------


@pytest.mark.traces
@pytest.mark.slow
def test_real_traces(traces: Path, capsys) -> None:
    """llm.c and the 73 modded-nanogpt runs (300k clean steps): no alert from either config. BLOOM's windows
    (2-9 lines) are too short for any rolling baseline. The fixed config's absolute grad-norm level of 10 speaks
    at once on fp16 104B norms of 10^4-10^6 (3 false alarms on the lines before a fault); the adaptive config's
    same level stands down, the run's first grad norm being over 100x it (`out_of_scale`), and the gross jump
    of exp11 (20x from its second line) is grad_norm_spike's; both see the NaN at 9027."""
    labels = str(ROOT / "data" / "backtest" / "real-traces.labels.csv")
    runs = backtest_json(capsys, str(traces), "--labels", labels, "--config", ADAPTIVE, "--config", FIXED)
    for run, fa, rule, lead in ((runs[0], [], "grad_norm_spike", 0), (runs[1], [(8739, "grad_norm")], "grad_norm", 1)):
        t = by_trace(run)
        clean = [x for x in run["traces"] if x["kind"] == "clean"]
        assert len(clean) == 74 and sum(x["steps"] for x in clean) == 300_713
        assert [x["trace"] for x in clean if x["alerts"]] == []
        exp12 = t["bloom-chronicles/iterations.csv#Experiment 12"]
        assert [(f["step"], f["rule"]) for f in exp12["false_alarms"]] == fa
        assert (exp12["detection"]["step"], exp12["detection"]["rule"], exp12["lead"]) == (9027, "nonfinite", -286)
        spike = t["bloom-chronicles/iterations.csv#Analyzing Spike"]
        assert (spike["detection"]["rule"], spike["lead"]) == (rule, lead)
    assert (runs[0]["summary"]["false_alarms"], runs[1]["summary"]["false_alarms"]) == (0, 3)
    assert (runs[0]["summary"]["caught"], runs[1]["summary"]["caught"]) == (2, 3)


def test_before_after_tables_from_the_kept_before_run(capsys) -> None:
    """bench/backtest_before_after.py condenses the kept JSON of the run before issue 13 (twice: no change)."""
    from bench import backtest_before_after as ba

    kept = MS_TRACES / "issue13"
    cpu, real = str(kept / "before-cpu-10.json"), str(kept / "before-real.json")
    assert ba.main(["--cpu", cpu, cpu, "--real", real, real]) == 0
    out = capsys.readouterr().out
    assert ("|  | monitor.yaml before | monitor.yaml after | fixed-thresholds.yaml before | fixed-thresholds.yaml "
            "after |") in out
    assert "| false alarms / 10k clean real steps | 0.10 (3 in 300,724) | 0.10 (3 in 300,724) |" in out
    assert "| early-grad-x10.csv | missed | missed | missed | missed |" in out
    assert "| grad-creep.csv | 1170 grad_norm_creep (+165, lead 621; firing at the end) |" in out
    assert "| shard-switch.csv | 1030 loss_spike (+25; firing at the end) |" in out


def test_held_alerts_are_those_still_firing_at_the_end() -> None:
    def e(step: int, rule: str, status: Status = Status.FIRING, repeat: bool = False) -> Event:
        return Event(run_id="r", device="0", step=step, time=0.0, rule=rule, severity=W, status=status, value=1.0,
                     threshold=0.5, message="m", repeat=repeat)

    events = [e(10, "loss_spike"), e(20, "loss_spike", repeat=True), e(30, "throughput_drop"),
              e(40, "throughput_drop", Status.RESOLVED), e(50, "grad_norm")]
    held = firing_at_end(events)
    assert held == [a(10, "loss_spike"), a(50, "grad_norm")]
    r = score(Label("t.csv", "training", 5), range(1, 61), alerts_of(events), held)
    assert r.still_firing and r.held == held
    assert score(Label("t.csv", "timing", 5), range(1, 61), alerts_of(events), held).still_firing is False
    assert score(Label("c.csv"), range(1, 61), alerts_of(events), held).still_firing is None
