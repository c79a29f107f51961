"""`msmon replay`: every log format through the same Monitor a live job runs; JSON output; errors; plot."""

from __future__ import annotations

import json
import math
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from msmon.cli.main import main
from msmon.contract.wire import Status
from msmon.offline.readers import ReplayError, Row, parse_columns, read_csv, read_log
from msmon.offline.replay import replay, run_replay
from notifier import Monitor
from tests.conftest import ROOT
from tests.fakes import analysis_data as data

MSMON = str(Path(sys.executable).parent / "msmon")


def firing(events):
    return [(e.step, e.rule, e.severity.value) for e in events if e.status is Status.FIRING and not e.repeat]


@pytest.fixture
def incident():
    """A loss jump of +1.0 (33 sigma) for 30 steps at 1200, and a 20x grad-norm burst at 1350."""
    return data.run(1500, loss_jump=(1200, 30, 1.0), grad_jump=(1350, 5, 20.0))


@pytest.fixture
def cfg(tmp_path):
    return data.monitor_yaml(tmp_path / "monitor.yaml")


def live_alerts(rows, cfg):
    """What a live job raises: Monitor.step called in a loop, no log file involved."""
    mon = Monitor(cfg, "live", clock=lambda: 0.0, sinks=[])
    events = []
    for r in rows:
        events += mon.step(r["step"], loss=r["loss"], lr=r["learning_rate"], grad_norm=r["grad_norm"],
                           throughput=r["tokens_per_s"], time=r["time"])
    mon.close()
    return firing(events)


# -- formats --------------------------------------------------------------------------------------


def test_csv_replay_raises_exactly_what_the_live_job_raised(tmp_path, incident, cfg, capsys):
    live = live_alerts(incident, cfg)
    assert live == [(1202, "loss_spike", "ERROR"), (1351, "grad_norm", "ERROR"), (1351, "grad_norm_spike", "ERROR")]
    log = data.write_csv(tmp_path / "run.csv", incident)
    assert main(["replay", log, "--config", cfg]) == 0
    out = capsys.readouterr().out
    printed = [ln for ln in out.splitlines() if ln.startswith("step ")]
    assert len(printed) == len(live) + sum(1 for ln in printed if "RESOLVED" in ln)
    for step, rule, sev in live:
        assert f"step {step:>7}  {sev:<8} {rule:<16} device 0" in out
    assert out.splitlines()[-1].startswith(f"{len(live)} alert(s): ")
    assert "trend: loss trend at step 1,499: " in out


def test_jsonl_and_renamed_csv_replay_like_the_csv(tmp_path, incident, cfg):
    live = live_alerts(incident, cfg)
    rename = {"step": "iter", "loss": "train_loss", "learning_rate": "lr", "grad_norm": "gnorm",
              "tokens_per_s": "tps", "time": "wall"}
    mapping = parse_columns("step=iter,grad_norm=gnorm,throughput=tps,time=wall")
    csv_log = data.write_csv(tmp_path / "other.csv", incident, rename)
    jsonl = data.write_jsonl(tmp_path / "other.jsonl", incident, rename)
    assert firing(run_replay(csv_log, cfg, columns=mapping).events) == live
    assert firing(run_replay(jsonl, cfg, columns=mapping).events) == live
    tsv = tmp_path / "other.tsv"
    tsv.write_text(Path(csv_log).read_text().replace(",", "\t"))
    assert firing(run_replay(str(tsv), cfg, columns=mapping).events) == live


def test_msmon_tensorboard_output_replays_with_no_mapping(tmp_path, incident):
    """msmon's own TensorBoard sink (tensorboardX, LOG_DIR/RUN/device_N) read back: same alerts as live."""
    tb_cfg = {"monitor_config": {"monitor_on": True, "log_interval": 0, "per_device_metrics": True,
                                 "tensorboard": {"enable": True, "log_dir": str(tmp_path / "tb")},
                                 "alert": {"grad_norm_threshold": 10.0}}}
    mon = Monitor(tb_cfg, "run-7", clock=lambda: 0.0)
    live = []
    for r in incident:
        for dev in ("0", "1"):
            live += mon.step(r["step"], loss=r["loss"] + (0.0 if dev == "0" else 0.01), lr=r["learning_rate"],
                             grad_norm=r["grad_norm"], throughput=r["tokens_per_s"], time=r["time"], device=dev)
    mon.close()
    result = run_replay(str(tmp_path / "tb"), tb_cfg)
    assert result.format == "tensorboard" and result.rows == 2 * len(incident)
    assert set(result.curves) == {"0", "1"}
    assert sorted((e.device, *a) for e, a in zip(result.firing(), firing(result.events), strict=True)) == \
        sorted((e.device, *a) for e, a in zip([e for e in live if e.status is Status.FIRING and not e.repeat],
                                               firing(live), strict=True))
    one = list(read_log(str(tmp_path / "tb" / "run-7" / "device_1")))
    assert one[5].device == "1" and one[5].loss == pytest.approx(incident[5]["loss"] + 0.01, rel=1e-6)
    assert one[5].time == pytest.approx(incident[5]["time"]) and one[5].throughput == pytest.approx(
        incident[5]["tokens_per_s"], rel=1e-6)


def _tensor_scalar(w, tag: str, value: float, step: int, packed: bool) -> None:
    """A scalar as TF2 / newer writers store it: a 0-d tensor (float_val, or packed tensor_content)."""
    from tensorboardX.proto.summary_pb2 import Summary
    from tensorboardX.proto.tensor_pb2 import TensorProto

    t = TensorProto(dtype=2, tensor_content=struct.pack("<d", value)) if packed else TensorProto(dtype=1,
                                                                                                   float_val=[value])
    w._get_file_writer().add_summary(Summary(value=[Summary.Value(tag=tag, tensor=t)]), step)


def test_foreign_tensorboard_tags_scalar_tensors_and_the_real_event_reader_agree(tmp_path):
    """A tensorboardX writer with other tags (two as tensor scalars), mapped with --columns; the values equal
    what TensorBoard's own EventAccumulator reads from the same file."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboardX import SummaryWriter

    w = SummaryWriter(logdir=str(tmp_path / "foreign"))
    for step in range(0, 300, 3):
        w.add_scalar("Loss/train", 2.0 + 0.001 * step, step)
        _tensor_scalar(w, "optim/lr", 1e-4, step, packed=False)
        _tensor_scalar(w, "gn", 0.5 + step, step, packed=True)
    w.close()
    rows = list(read_log(str(tmp_path / "foreign"), parse_columns("loss=Loss/train,lr=optim/lr,grad_norm=gn")))
    ea = EventAccumulator(str(tmp_path / "foreign"))
    ea.Reload()
    ref = {e.step: e.value for e in ea.Scalars("Loss/train")}
    assert [r.step for r in rows] == sorted(ref) and len(rows) == 100
    assert all(r.loss == ref[r.step] for r in rows)
    assert all(r.lr == pytest.approx(1e-4, rel=1e-6) for r in rows)
    assert all(r.grad_norm == 0.5 + r.step for r in rows)
    auto = list(read_log(str(tmp_path / "foreign")))  # Loss/train is a known name (any case); the others are not
    assert [r.loss for r in auto] == [r.loss for r in rows] and all(r.lr is None for r in auto)
    f = _event_file(tmp_path / "xent", [(1, "xent", 2.0), (1, "acc", 0.5)])
    with pytest.raises(ReplayError) as exc:
        list(read_log(str(f)))
    assert str(exc.value).startswith(f"{f}: no metric tag found (looked for loss: loss, train/loss, train_loss")
    assert "tags present: acc, xent. Map yours with --columns loss=NAME,grad_norm=NAME" in str(exc.value)


def test_format_is_detected_from_the_content_when_the_name_does_not_say(tmp_path, incident):
    a = tmp_path / "metrics.log"
    a.write_text(Path(data.write_jsonl(tmp_path / "x.jsonl", incident[:50])).read_text())
    b = tmp_path / "metrics.txt"
    b.write_text(Path(data.write_csv(tmp_path / "x.csv", incident[:50])).read_text())
    assert read_log(str(a)).format == "jsonl" and read_log(str(b)).format == "csv"
    assert [r.step for r in read_log(str(a))] == [r.step for r in read_log(str(b))] == list(range(50))


# -- NaN is data; evaluation rows are skipped; devices ----------------------------------------------


def test_nan_and_inf_cells_are_data(tmp_path, capsys):
    cfg = data.monitor_yaml(tmp_path / "m.yaml", "    alert_interval: 0\n")
    rows = data.run(700)
    rows[600]["loss"] = "nan"
    rows[650]["grad_norm"] = "inf"
    log = data.write_csv(tmp_path / "run.csv", rows)
    parsed = list(read_csv(log))
    assert math.isnan(parsed[600].loss) and parsed[650].grad_norm == math.inf
    assert main(["replay", log, "--config", cfg, "--no-trend"]) == 0
    out = capsys.readouterr().out
    assert "step     600  ERROR    nonfinite" in out and "step     650  ERROR    nonfinite" in out


def test_rows_without_metrics_are_skipped_and_devices_are_checked_separately(tmp_path):
    p = tmp_path / "mixed.csv"
    p.write_text("step,device,loss,val_loss\n0,0,2.0,\n0,1,2.1,\n1,0,,1.9\n1,1,2.0,\n2,0,1.9,\n")
    rows = list(read_csv(str(p)))
    assert [(r.step, r.device) for r in rows] == [(0, "0"), (0, "1"), (1, "1"), (2, "0")]


# -- bad input: each error names the place and the fix ---------------------------------------------


@pytest.mark.parametrize(("name", "text", "columns", "expected"), [
    ("log.csv", "step,loss\n0,2.0\n1,abc\n", None,
     "log.csv:3: column 'loss' holds 'abc', which is not a number; fix or delete that line (empty cells, nan and "
     "inf are fine)"),
    ("log.csv", "step,loss\n0,2.0\n5,nan\n3,2.0\n", None,
     "log.csv:4: step 3 comes after step 5: steps must increase (step 5 is at line 3). A resumed run logs some "
     "steps again"),
    ("log.csv", "step,loss\n0,2.0\n5,2.0\n5,2.1\n", None, "log.csv:4: step 5 is repeated: steps must increase"),
    ("log.csv", "step,device,loss\n0,0,2.0\n0,1,2.0\n1,1,2.0\n1,1,2.0\n", None,
     "log.csv:5: step 1 is repeated on device 1: steps must increase (step 1 is at line 4)"),
    ("log.csv", "step,loss\n0,2.0\n1\n", None, "log.csv:3: 1 cells, but the header has 2 columns"),
    ("log.csv", "step,loss\n0,2.0\n,2.0\n", None, "log.csv:3: the step (column 'step') is empty"),
    ("log.csv", "step,loss\n0,2.0\n1.5,2.0\n", None, "log.csv:3: the step (column 'step') is '1.5', not a whole "
     "number >= 0"),
    ("log.csv", "", None, "log.csv:1: no header line (the file is empty"),
    ("log.csv", "it,loss\n0,2.0\n", None,
     "log.csv:1: no step column (looked for step, iteration, iter, global_step); columns: it, loss. Name it with "
     "--columns step=COLUMN"),
    ("log.csv", "step,acc,val\n0,0.5,1\n", None,
     "log.csv:1: no metric column found (looked for loss: loss, train/loss, train_loss"),
    ("log.csv", "step,train_loss\n0,2.0\n", "loss=trian_loss",
     "log.csv:1: --columns loss=trian_loss: there is no column 'trian_loss'; did you mean 'train_loss'? "
     "(columns present: step, train_loss)"),
    ("log.jsonl", '{"step": 0, "loss": 2.0}\n{"step": 1, "loss": 2.0\n', None,
     "log.jsonl:2: not valid JSON (Expecting ',' delimiter at column 24); a JSONL log has one JSON object per line"),
    ("log.jsonl", '{"step": 0, "loss": 2.0}\n[1, 2]\n', None, "log.jsonl:2: expected a JSON object"),
    ("log.jsonl", '{"step": 0, "loss": 2.0}\n{"step": 1, "loss": true}\n', None,
     "log.jsonl:2: key 'loss' holds True, which is not a number"),
    ("log.jsonl", '{"step": 0, "loss": 2.0}\n{"loss": 2.1}\n', None,
     "log.jsonl:2: metrics but no 'step' key: every object needs a step"),
    ("log.jsonl", '{"step": 0, "loss": 2.0}\n{"step": 0, "loss": 2.1}\n', None,
     "log.jsonl:2: step 0 is repeated: steps must increase (step 0 is at line 1)"),
    ("log.jsonl", '{"iter": 0, "loss": 2.0}\n', "step=iteration",
     "--columns step=iteration: there is no key 'iteration'; did you mean 'iter'? (keys present: iter, loss)"),
])
def test_bad_input_errors_name_the_line_and_the_fix(tmp_path, capsys, name, text, columns, expected):
    log = tmp_path / name
    log.write_text(text)
    argv = ["replay", str(log)] + (["--columns", columns] if columns else [])
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert expected in err, err
    assert err.startswith("msmon replay: ")


def test_columns_option_errors(tmp_path, capsys):
    log = tmp_path / "log.csv"
    log.write_text("step,loss\n0,2.0\n")
    assert main(["replay", str(log), "--columns", "los=loss"]) == 2
    assert "--columns: unknown field 'los'; did you mean loss? (fields: step, loss, lr" in capsys.readouterr().err
    assert main(["replay", str(log), "--columns", "loss"]) == 2
    assert "--columns: 'loss' is not FIELD=NAME (e.g. --columns step=iter,loss=train_loss)" in capsys.readouterr().err
    assert main(["replay", str(tmp_path / "missing.csv")]) == 2
    assert "missing.csv: no such file or folder" in capsys.readouterr().err
    assert parse_columns("learning_rate=LR, iteration=it") == {"lr": "LR", "step": "it"}


def _event_file(folder: Path, records: list[tuple[int, str, float]]) -> Path:
    from tensorboardX import SummaryWriter

    w = SummaryWriter(logdir=str(folder))
    for step, tag, value in records:
        w.add_scalar(tag, value, step)
    w.close()
    return next(folder.glob("events.out.tfevents.*"))


def test_tensorboard_errors(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["replay", str(empty)]) == 2
    err = capsys.readouterr().err
    assert "empty: no TensorBoard event files (events.out.tfevents.*) in this folder or below" in err
    f = _event_file(tmp_path / "rep", [(1, "train/loss", 2.0), (2, "train/loss", 2.0), (2, "train/loss", 2.1)])
    assert main(["replay", str(f)]) == 2
    err = capsys.readouterr().err
    assert f"{f} (tag 'train/loss', step 2): step 2 is repeated: steps must increase (step 2 is at {f.name})" in err
    _event_file(tmp_path / "two" / "a", [(1, "loss", 2.0)])
    _event_file(tmp_path / "two" / "b", [(1, "loss", 2.0)])
    assert main(["replay", str(tmp_path / "two")]) == 2
    assert "event files in several folders (a, b) that are not one run's device_N folders; replay one of them" in \
        capsys.readouterr().err
    bad = tmp_path / "bad" / "events.out.tfevents.1.host"
    bad.parent.mkdir()
    payload = b"\x08\x01\xff\xff\xff"  # a varint that never ends: not an Event
    bad.write_bytes(struct.pack("<Q", len(payload)) + b"\0" * 4 + payload + b"\0" * 4)
    assert main(["replay", str(bad)]) == 2
    assert "the record at byte 0 is not a TensorBoard event (a corrupted or foreign file?)" in capsys.readouterr().err


def test_two_attempts_in_one_event_folder(tmp_path, capsys):
    """A restarted job writes a second event file beside the first, logging the same steps again."""
    first = _event_file(tmp_path / "dev", [(s, "train/loss", 2.0) for s in range(1, 6)])
    second = first.with_name("events.out.tfevents.9999999999.host")
    second.write_bytes(first.read_bytes())
    assert main(["replay", str(tmp_path / "dev")]) == 2
    err = capsys.readouterr().err
    assert f"{second} (tag 'train/loss', step 1): step 1 comes after step 5: steps must increase (step 5 is at " \
           f"{first.name}). The folder holds several attempts of the run, one event file each: replay one file " \
           f"(msmon replay {second}), or move the others out of the folder" in err
    assert main(["replay", str(first), "--no-trend"]) == 0


def test_a_truncated_last_event_record_is_ignored(tmp_path):
    f = _event_file(tmp_path / "tb", [(s, "train/loss", 2.0) for s in range(1, 11)])
    full = f.read_bytes()
    f.write_bytes(full[:-7])  # the writer died mid-record
    assert [r.step for r in read_log(str(f))] == list(range(1, 10))


# -- output: JSON lines, progress, plot -------------------------------------------------------------


def test_json_output_is_pure_json_lines_in_a_real_subprocess(tmp_path, incident, cfg):
    log = data.write_csv(tmp_path / "run.csv", incident)
    p = subprocess.run([MSMON, "replay", log, "--config", cfg, "--format", "json", "--progress"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    objs = [json.loads(ln) for ln in lines]
    assert objs and len(objs) == len(lines)
    for o in objs:
        assert {"step", "rule", "severity", "value", "threshold", "message", "device", "status"} <= set(o)
        assert o["severity"] in ("WARNING", "ERROR") and o["status"] in ("firing", "resolved")
    assert [(o["step"], o["rule"], o["severity"]) for o in objs if o["status"] == "firing" and not o["repeat"]] \
        == live_alerts(incident, cfg)
    resolved = [o for o in objs if o["status"] == "resolved"]
    assert resolved and all(o["value"] is None for o in resolved)  # NaN is null in JSON
    assert "replaying " in p.stderr and "100% 1,500 rows" in p.stderr
    assert "trend: loss trend at step 1,499" in p.stderr and " alert(s): " in p.stderr


def test_progress_only_on_a_terminal_or_when_asked(tmp_path, incident, cfg, capsys):
    log = data.write_csv(tmp_path / "run.csv", incident[:600])
    assert main(["replay", log, "--config", cfg]) == 0
    assert "replaying" not in capsys.readouterr().err  # capsys' stderr is not a terminal
    assert main(["replay", log, "--config", cfg, "--progress"]) == 0
    captured = capsys.readouterr()
    assert f"\rreplaying {log} [" in captured.err and "replaying" not in captured.out


def test_plot_draws_a_png(tmp_path, incident, cfg, capsys):
    log = data.write_csv(tmp_path / "run.csv", incident)
    out = tmp_path / "plot.png"
    assert main(["replay", log, "--config", cfg, "--plot", str(out)]) == 0
    assert f"plot: {out}" in capsys.readouterr().out
    head = out.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", head[16:24])
    assert (width, height) == (1400, 980)


def test_plot_without_matplotlib_says_what_to_install(tmp_path, monkeypatch, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    log = tmp_path / "log.csv"
    log.write_text("step,loss\n0,2.0\n")
    assert main(["replay", str(log), "--plot", str(tmp_path / "p.png")]) == 2
    assert "--plot needs matplotlib: pip install 'msmon[bot]'" in capsys.readouterr().err


def test_replay_writes_no_files_and_sends_nothing(tmp_path, monkeypatch):
    """The config may enable TensorBoard, CSV and a bot: a replay is analysis and touches none of them."""
    monkeypatch.chdir(tmp_path)
    cfg = {"monitor_config": {"monitor_on": True, "tensorboard": {"enable": True, "log_dir": "tb"},
                              "csv": {"enable": True, "path": "out.csv"}, "bot": {"url": "http://127.0.0.1:9"}}}
    log = data.write_csv(tmp_path / "run.csv", data.run(300))
    result = run_replay(log, cfg)
    assert result.monitor.transport is None
    assert sorted(os.listdir(tmp_path)) == ["run.csv"]


def test_the_replay_function_still_takes_plain_rows():
    """The API the real-trace tests, the demo and the backtest use."""
    mon = Monitor({"monitor_config": {"monitor_on": True, "alert": {"baseline_steps": 0}}}, "r", clock=lambda: 0.0,
                  sinks=[])
    events = replay([Row(step=s, loss=2.0 if s != 50 else math.nan) for s in range(100)], mon)
    assert firing(events) == [(50, "nonfinite", "ERROR")]


# -- real traces --------------------------------------------------------------------------------------


@pytest.mark.traces
def test_real_llmc_trace_replays_quiet_with_a_trend(traces, capsys):
    log = str(traces / "llmc-gpt2-124m" / "main.csv")
    assert main(["replay", log, "--config", str(ROOT / "config" / "monitor.yaml"), "--format", "json",
                 "--total-steps", "19560", "--target-loss", "3.25"]) == 0
    captured = capsys.readouterr()
    assert captured.out == ""  # no alert on this clean run, and nothing else on stdout
    err = [line for line in captured.err.splitlines() if not line.startswith("msmon replay: note: ")]
    assert "msmon replay: note: throughput is in the config's metrics but not in this log" in captured.err
    assert err[0].startswith("trend: loss trend at step 19,551: 3.27")
    assert err[1].startswith("trend: falling steadily: ")
    assert err[2].startswith("trend: forecast at step 19,560 (the planned last step): 3.27")
    assert err[3].startswith("trend: target loss 3.25: reached at step ~")
    assert err[-1] == "0 alert(s): 0 ERROR, 0 WARNING in 19,552 rows (csv)"


# -- live threshold changes: the job's .levels.jsonl replays at the same steps -----------------------------------


def _levels_job(tmp_path: Path) -> tuple[Path, Path, list]:
    """A job whose grad norm is 12 for two samples every 10 (ERROR at 10), loosened to 30 at step 100 through
    JobControl; its CSV, its config file and the alerts it raised."""
    from notifier.control import JobControl

    config = tmp_path / "monitor.yaml"
    config.write_text(json.dumps({"monitor_config": {
        "monitor_on": True, "step_interval": 1, "log_interval": 0, "metrics": ["loss", "grad_norm"],
        "csv": {"enable": True, "path": str(tmp_path / "{run_id}.csv")},
        "alert": {"baseline_steps": 0, "alert_interval": 0, "grad_norm_threshold": 10.0}}}))
    mon = Monitor(str(config), "run-42")
    control = JobControl(mon)
    events = []
    for step in range(1, 201):
        events += mon.step(step, loss=1.0, grad_norm=12.0 if step % 10 in (0, 1) else 1.0, time=float(step))
        if step == 100:
            control.request("loosen_threshold", rule="grad_norm", value=30.0)
            (res,) = control.apply(step)
            assert "0 alerts at 15 / 30 instead of 9 alerts (9 ERROR) at 5 / 10" in res.detail
    mon.close()
    return tmp_path / "run-42.csv", config, events


def _alerts(events) -> list[tuple[int, str, str]]:
    return [a for a in firing(events) if a[1] == "grad_norm"]


def test_a_replay_applies_the_jobs_level_changes_at_their_steps(tmp_path: Path) -> None:
    csv_path, config, live = _levels_job(tmp_path)
    assert (tmp_path / "run-42.levels.jsonl").is_file()
    found = run_replay(str(csv_path), str(config))
    assert found.levels_file == str(tmp_path / "run-42.levels.jsonl") and len(found.levels) == 1
    assert _alerts(found.events) == _alerts(live) and max(s for s, _, _ in _alerts(live)) <= 100
    plain = run_replay(str(csv_path), str(config), find=False)
    assert plain.levels == [] and max(s for s, _, _ in _alerts(plain.events)) > 100  # the config's levels throughout


def test_cli_levels_option_and_a_bad_levels_file(tmp_path: Path, capsys) -> None:
    csv_path, config, _ = _levels_job(tmp_path)
    assert main(["replay", str(csv_path), "--config", str(config), "--no-trend"]) == 0
    out = capsys.readouterr().out
    assert f"levels: 1 live threshold change(s) from {tmp_path / 'run-42.levels.jsonl'} applied at their steps" in out
    assert main(["replay", str(csv_path), "--config", str(config), "--no-trend", "--no-levels"]) == 0
    assert "levels:" not in capsys.readouterr().out
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"step": 3, "rule": "grad_norm", "error": 2}\n{"step": 4, "rule": "grad_nrom"}\n')
    assert main(["replay", str(csv_path), "--config", str(config), "--levels", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:2: unknown rule 'grad_nrom'" in err and "Traceback" not in err


# -- dynamic loss scaling in msmon's own outputs (issue 24) ---------------------------------------------------


def test_the_overflow_flag_and_loss_scale_round_trip_through_csv_jsonl_and_tensorboard(tmp_path):
    """What a job writes (CSV, TensorBoard) and a JSONL log hold, read back the same; a replay of them raises
    nothing for the skipped steps (their grad norm not a measurement) and the loss_scale rule for a stall."""
    from msmon.contract.wire import Sample
    from notifier.outputs.csv_sink import CsvSink
    from notifier.outputs.tensorboard_sink import TensorBoardSink

    def sample(k: int) -> Sample:
        stuck = k >= 400  # every step skipped from 400 on
        over = stuck or k % 50 == 0
        return Sample(run_id="r", device="0", step=k, time=1e9 + k, loss=2.0 + 0.01 * (k % 7), learning_rate=1e-4,
                      grad_norm=None if over else 1.0 + 0.05 * (k % 5), overflow=over,
                      loss_scale=max(2.0 ** 16 / 2 ** max(k - 399, 0), 1.0), skipped_steps=None)

    samples = [sample(k) for k in range(1, 501)]
    csv_sink, tb = CsvSink(str(tmp_path / "r.csv"), "r"), TensorBoardSink(str(tmp_path / "tb"), "r")
    with open(tmp_path / "r.jsonl", "w") as f:
        for s in samples:
            csv_sink.write(s)
            tb.write(s)
            f.write(json.dumps({"step": s.step, "loss": s.loss, "lr": s.learning_rate, "grad_norm": s.grad_norm,
                                "overflow": s.overflow, "loss_scale": s.loss_scale}) + "\n")
    csv_sink.close()
    tb.close()
    want = [(s.step, s.overflow, s.loss_scale) for s in samples]
    for path in (tmp_path / "r.csv", tmp_path / "r.jsonl", Path(tb.dir_for("0"))):
        rows = list(read_log(str(path)))
        assert [(r.step, r.overflow, r.loss_scale) for r in rows] == want, path
        events = [e for e in replay(rows, Monitor({"monitor_on": True, "step_interval": 1}, "r", sinks=[]))
                  if e.status is Status.FIRING]
        assert {e.rule for e in events} == {"loss_scale"} and 400 < events[0].step <= 420, (path, events)
