"""CSV and TensorBoard files, read back with real readers; file I/O never holds up a training step."""

from __future__ import annotations

import csv
import logging
import math
import os
import threading

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from msmon.contract.wire import Sample
from notifier import Monitor
from notifier.outputs import CSV_COLUMNS, BackgroundWriter
from notifier.outputs.logline import _sci, format_log_line
from tests.fakes.helpers import FakeClock, ListSink, config


def _run(tmp_path, steps=200, **over):
    clock = FakeClock()
    cfg = config(step_interval=10, csv={"enable": True, "path": os.fspath(tmp_path / "{run_id}.csv")},
                 tensorboard={"enable": True, "log_dir": os.fspath(tmp_path / "tb")}, **over)
    mon = Monitor(cfg, "run-1", clock=clock)
    for step in range(steps):
        clock.advance(0.5)
        mon.step(step, loss=float("nan") if step == 150 else 2.0 + 1.0 / (step + 1), lr=1e-4, grad_norm=1.5,
                 tokens=1000)
    mon.close()
    return tmp_path


def test_csv_has_a_stable_header_and_one_row_per_sampled_step(tmp_path):
    _run(tmp_path)
    with open(tmp_path / "run-1.csv", newline="") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames) == CSV_COLUMNS
        rows = list(reader)
    assert [int(r["step"]) for r in rows] == list(range(0, 200, 10))
    r = rows[2]
    assert (r["run_id"], r["device"], float(r["loss"]), float(r["learning_rate"]), float(r["grad_norm"])) == (
        "run-1", "0", pytest.approx(2.0 + 1 / 21), 1e-4, 1.5)
    assert float(r["tokens_per_s"]) == pytest.approx(2000.0)
    assert float(r["step_time"]) == pytest.approx(0.5)
    assert rows[15]["loss"] == "nan"  # NaN is data, written so it reads back as NaN
    assert math.isnan(float(rows[15]["loss"]))
    assert rows[0]["tokens_per_s"] == ""  # nothing to measure a rate against at the first sample


def test_csv_appends_without_repeating_the_header(tmp_path):
    _run(tmp_path, steps=20)
    _run(tmp_path, steps=20)
    lines = (tmp_path / "run-1.csv").read_text().splitlines()
    assert lines.count(",".join(CSV_COLUMNS)) == 1
    assert len(lines) == 1 + 4


def test_tensorboard_event_files_read_back(tmp_path):
    _run(tmp_path)
    acc = EventAccumulator(os.fspath(tmp_path / "tb" / "run-1" / "device_0"))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert {"train/loss", "train/learning_rate", "train/grad_norm", "throughput/tokens_per_s"} <= set(tags)
    loss = acc.Scalars("train/loss")
    assert [e.step for e in loss] == list(range(0, 200, 10))
    assert loss[2].value == pytest.approx(2.0 + 1 / 21)
    assert math.isnan(loss[15].value)
    assert acc.Scalars("throughput/tokens_per_s")[-1].value == pytest.approx(2000.0)


def test_per_device_csv_files(tmp_path):
    cfg = config(per_device_metrics=True, csv={"enable": True, "path": os.fspath(tmp_path / "{run_id}-{device}.csv")})
    mon = Monitor(cfg, "r", clock=FakeClock())
    for step in range(3):
        for dev in (0, 1):
            mon.step(step, loss=1.0 + dev, device=dev)
    mon.close()
    for dev in (0, 1):
        with open(tmp_path / f"r-{dev}.csv", newline="") as f:
            rows = list(csv.DictReader(f))
        assert [float(r["loss"]) for r in rows] == [1.0 + dev] * 3


class BlockedSink(ListSink):
    """A sink stuck on a disk that does not answer, until released."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def write(self, s: Sample) -> None:
        self.release.wait()
        super().write(s)


def test_a_stuck_disk_never_holds_up_training():
    sink = BlockedSink()
    mon = Monitor(config(), "r", sinks=[sink], clock=FakeClock())
    for step in range(5000):  # would hang here if step() waited for the sink
        mon.step(step, loss=2.0)
    assert len(sink.samples) == 0
    sink.release.set()
    mon.close()
    assert len(sink.samples) == 5000


def test_writer_drops_and_says_so_when_it_falls_behind(caplog):
    sink = BlockedSink()
    w = BackgroundWriter([sink], capacity=10)
    s = Sample(run_id="r", device="0", step=0, time=0.0, loss=1.0)
    for _ in range(100):
        w.put(s)
    assert w.dropped >= 89
    sink.release.set()
    with caplog.at_level(logging.WARNING, logger="msmon"):
        w.close()
    assert "samples were not written to CSV/TensorBoard because the writer fell behind" in caplog.text


class BrokenSink(ListSink):
    name = "CSV"

    def write(self, s: Sample) -> None:
        raise OSError(28, "No space left on device")


def test_a_failing_sink_is_reported_once_and_training_goes_on(caplog):
    good = ListSink()
    with caplog.at_level(logging.ERROR, logger="msmon"):
        mon = Monitor(config(), "r", sinks=[BrokenSink(), good], clock=FakeClock())
        for step in range(50):
            mon.step(step, loss=2.0)
        mon.close()
    assert len(good.samples) == 50
    errors = [r.getMessage() for r in caplog.records if "writing CSV failed" in r.getMessage()]
    assert len(errors) == 1 and "No space left on device" in errors[0] and "training continues" in errors[0]


def test_flush_writes_everything_queued(tmp_path):
    sink = ListSink()
    mon = Monitor(config(), "r", sinks=[sink], clock=FakeClock())
    for step in range(10):
        mon.step(step, loss=2.0)
    mon.flush()
    assert len(sink.samples) == 10
    mon.close()


def test_log_line_variants():
    s = Sample(run_id="r", device="3", step=7, time=0.0, loss=2.0, samples_per_s=12.5)
    assert format_log_line(s) == "[step 7] loss: 2 | throughput: 12.5 samples/s"
    assert format_log_line(s, with_device=True).startswith("[step 7] [device 3] ")
    assert format_log_line(Sample(run_id="r", device="0", step=1, time=0.0)) == "[step 1]"


@pytest.mark.parametrize("run_id", ["../../escape", "a/b", "x\x00y", "r" * 256, "..", "<!channel>"])
def test_csv_and_tensorboard_paths_from_hostile_run_ids_stay_in_their_folders(tmp_path, run_id):
    """A run id is job data: it names files only as a safe slug, inside the configured folder."""
    out = tmp_path / "out"
    cfg = config(step_interval=1, csv={"enable": True, "path": os.fspath(out / "csv" / "{run_id}-{device}.csv")},
                 tensorboard={"enable": True, "log_dir": os.fspath(out / "tb")})
    mon = Monitor(cfg, run_id, clock=FakeClock())
    for step in range(3):
        mon.step(step, loss=1.0)
    mon.close()
    written = [os.path.join(d, f) for d, _, files in os.walk(tmp_path) for f in files]
    assert written and all(os.path.realpath(p).startswith(os.fspath(out) + os.sep) for p in written)
    (csv_file,) = [p for p in written if p.endswith(".csv")]
    assert os.path.dirname(csv_file) == os.fspath(out / "csv")
    assert all(len(os.path.basename(p)) <= 255 for p in written)


def test_csv_rows_read_back_exactly_as_the_csv_module_writes_them(tmp_path):
    """Every cell of every row (msgspec's numbers, or the csv module's for a row with a NaN or an infinity) reads
    back with csv.DictReader and float() to the sample's own value; one file shared by two devices; run ids
    that need quoting stay one cell."""
    import random

    from notifier.outputs.csv_sink import CsvSink

    rng = random.Random(5)
    sink = CsvSink(os.fspath(tmp_path / "{run_id}.csv"), 'run,"1"')
    samples = []
    for step in range(60):
        odd = [math.nan, math.inf, -math.inf] if step % 7 == 0 else []

        def pick(odd: list[float] = odd) -> float | None:
            return rng.choice([None, rng.uniform(-1e9, 1e9), rng.uniform(0, 1e-6), 0.1 + 0.2, 1e300, *odd])

        s = Sample(run_id='run,"1"', device=rng.choice(["0", "dev,1"]), step=step * 2**40, time=1.7e9 + step / 3,
                   loss=pick(), learning_rate=pick(), grad_norm=pick(), local_grad_norm=pick(), samples_per_s=pick(),
                   tokens_per_s=pick(), step_time=pick(), max_step_time=pick(), data_time=pick(),
                   overflow=rng.choice([None, True, False]), loss_scale=pick(),
                   skipped_steps=rng.choice([None, 0, 12]))
        samples.append(s)
        sink.write(s)
    sink.close()
    with open(tmp_path / f"{sink.path_for('0')}", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(samples)
    for s, row in zip(samples, rows, strict=True):
        assert (row["run_id"], row["device"], int(row["step"])) == (s.run_id, s.device, s.step)
        for col in CSV_COLUMNS[3:]:
            want = getattr(s, col)
            if want is None:
                assert row[col] == ""
            elif isinstance(want, bool):
                assert row[col] == str(int(want))
            elif isinstance(want, float) and math.isnan(want):
                assert row[col] == "nan"
            else:
                assert float(row[col]) == want


def _slow_log_line(s: Sample) -> str:
    """format_log_line's general path, written out: what its one-pass form for the usual line must equal."""
    return (f"[step {s.step}] loss: {s.loss:.4g} | lr: {_sci(s.learning_rate)} | grad_norm: {s.grad_norm:.3g} | "
            f"throughput: {s.tokens_per_s:.0f} tokens/s")


@pytest.mark.parametrize("loss, lr, grad, tps", [
    (2.3412, 1.2e-5, 1.0234, 1520.4), (1e-9, 3e-4, 1234567.0, 0.4), (float("nan"), 0.1, float("inf"), 1e12),
    (123456.0, 1e-12, 0.0, 2.5), (-0.5, 6e-4, 15.0, 999999.5)])
def test_log_line_usual_form_is_the_general_one(loss, lr, grad, tps):
    s = Sample(run_id="r", device="0", step=123, time=0.0, loss=loss, learning_rate=lr, grad_norm=grad,
               tokens_per_s=tps)
    assert format_log_line(s) == _slow_log_line(s)


class _Keep(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        self.lines.append(self.format(record))


def _logged(factory=None) -> _Keep:
    log = logging.getLogger("msmon")
    keep = _Keep()
    keep.setFormatter(logging.Formatter("%(levelname)s %(name)s %(filename)s:%(lineno)d %(funcName)s %(module)s "
                                        "%(threadName)s %(processName)s %(message)s"))
    keep.addFilter(lambda r: "[step 20]" not in r.getMessage())  # the program's own filter applies
    old_level, old_prop = log.level, log.propagate
    log.addHandler(keep)
    log.setLevel(logging.INFO)
    log.propagate = False
    old_factory = logging.getLogRecordFactory()
    if factory is not None:
        logging.setLogRecordFactory(factory)
    try:
        mon = Monitor(config(step_interval=1, log_interval=10), "r", clock=FakeClock())
        for step in range(31):
            mon.step(step, loss=2.0, lr=1e-4, grad_norm=1.0, tokens=100.0)
        mon.close()
    finally:
        logging.setLogRecordFactory(old_factory)
        log.removeHandler(keep)
        log.setLevel(old_level)
        log.propagate = old_prop
    return keep


def test_step_line_record_is_the_one_makerecord_makes():
    """LineRecords' record has every attribute makeRecord gives, with the same values (the time aside), and the
    program's formatter and filters apply to it."""
    keep = _logged()
    steps = [r for r in keep.records if r.getMessage().startswith("[step ")]
    assert [r.getMessage().split("]")[0] for r in steps] == ["[step 0", "[step 10", "[step 30"]
    record = steps[-1]
    made = logging.getLogger("msmon").makeRecord("msmon", logging.INFO, record.pathname, record.lineno,
                                                 record.getMessage(), (), None, "step")
    assert set(vars(record)) == set(vars(made)) | ({"message"} & set(vars(record)))
    for k, v in vars(made).items():
        if k in ("created", "msecs", "relativeCreated"):
            assert abs(getattr(record, k) - v) < 60_000, k
        else:
            assert getattr(record, k) == v, k
    assert record.msecs == int((record.created - int(record.created)) * 1000)
    line = keep.lines[keep.records.index(record)]
    assert line.startswith(f"INFO msmon monitor.py:{record.lineno} step monitor MainThread MainProcess [step 30] ")


def test_step_line_with_the_programs_own_record_factory():
    """A program's record factory makes the step line's record too."""
    base = logging.getLogRecordFactory()

    def factory(*a, **kw):
        r = base(*a, **kw)
        r.job = "mine"
        return r

    keep = _logged(factory=factory)
    steps = [r for r in keep.records if r.getMessage().startswith("[step ")]
    assert len(steps) == 3 and all(getattr(r, "job", None) == "mine" for r in steps)
