"""msmon's own TensorBoard event writer, read back by TensorBoard's own reader (which checks every CRC)."""

from __future__ import annotations

import math
import os
import random

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

from msmon.contract.wire import Sample
from notifier.outputs import tfevents
from notifier.outputs.tensorboard_sink import TAGS, TensorBoardSink


def test_crc32c_matches_the_standard_check_value_and_tensorboards_own_crc():
    assert tfevents.crc32c_py(b"123456789") == 0xE3069283  # RFC 3720's check value
    rng = random.Random(3)
    for n in [*range(0, 41), 199, 1000]:
        data = bytes(rng.randrange(256) for _ in range(n))
        assert tfevents.crc32c_py(data) == tfevents.crc32c(data)
        assert tfevents.masked_crc(data) == masked_crc32c(data)


def test_scalars_of_every_kind_read_back_by_the_event_accumulator(tmp_path):
    w = tfevents.EventFileWriter(os.fspath(tmp_path), ["a/loss", "b/" + "x" * 200, "special"])
    steps = [0, 1, 127, 128, 300, 2**31 + 5, 2**40]
    for i, step in enumerate(steps):
        w.scalars(1_700_000_000.0 + i, step, [2.5 + i, float(i) if i % 2 else i, None])
        if i == 3:
            w.flush()  # records after a flush land in the same file
    for v in (math.nan, math.inf, -math.inf):
        w.scalars(1_700_000_100.0, 7, [None, None, v])
    w.close()
    assert os.path.basename(w.path).startswith("events.out.tfevents.")
    acc = EventAccumulator(os.fspath(tmp_path))
    acc.Reload()
    assert set(acc.Tags()["scalars"]) == {"a/loss", "b/" + "x" * 200, "special"}
    loss = acc.Scalars("a/loss")
    assert [e.step for e in loss] == steps
    assert [e.value for e in loss] == [2.5 + i for i in range(len(steps))]
    assert [e.wall_time for e in loss] == [1_700_000_000.0 + i for i in range(len(steps))]
    assert [e.value for e in acc.Scalars("b/" + "x" * 200)] == list(range(len(steps)))
    special = [e.value for e in acc.Scalars("special")]
    assert math.isnan(special[0]) and special[1:] == [math.inf, -math.inf]
    with pytest.raises(OverflowError):
        w.scalars(0.0, 1, [1e39, None, None])  # past float32: the caller decides (the sink writes an infinity)


def test_the_sink_writes_one_event_per_sample_per_device_and_a_value_past_float32_as_infinity(tmp_path):
    sink = TensorBoardSink(os.fspath(tmp_path), "run/../x")
    for step in range(5):
        for dev in ("0", "1"):
            sink.write(Sample(run_id="r", device=dev, step=step, time=100.0 + step, loss=1.0 + step,
                              grad_norm=1e39 if step == 4 else 0.5, learning_rate=1e-4, overflow=step == 2,
                              skipped_steps=1 if step >= 2 else 0))
        sink.flush()
    sink.close()
    tags = dict(TAGS)
    for dev in ("0", "1"):
        folder = sink.dir_for(dev)
        assert folder.startswith(os.fspath(tmp_path))
        acc = EventAccumulator(folder)
        acc.Reload()
        assert [e.value for e in acc.Scalars(tags["loss"])] == [1.0, 2.0, 3.0, 4.0, 5.0]
        assert [e.value for e in acc.Scalars(tags["grad_norm"])] == [0.5] * 4 + [math.inf]
        assert [e.value for e in acc.Scalars(tags["overflow"])] == [0, 0, 1, 0, 0]
        assert [e.value for e in acc.Scalars(tags["learning_rate"])] == [pytest.approx(1e-4)] * 5
        assert tags["tokens_per_s"] not in acc.Tags()["scalars"]  # a metric never given is no tag


def test_records_from_the_layouts_equal_records_crc_d_over_every_byte(monkeypatch):
    """The pure-Python path (the CRC of a layout and a table look-up per variable byte) gives the same bytes as
    a CRC over the whole event, for steps whose varints have 1 to 10 bytes and values of every kind."""
    monkeypatch.setattr(tfevents, "NATIVE", None)  # the pure-Python path even where a C CRC is installed
    rng = random.Random(7)
    tags = ("train/loss", "time/step_time_s", "x" * 130)
    template = tfevents._Template(tags)
    prefixes = [tfevents.value_prefix(t) for t in tags]
    for step in [0, 5, 127, 128, 16_383, 16_384, 2**35, 2**62, -1]:
        for _ in range(4):
            values = [rng.choice([None, rng.uniform(-1e6, 1e6), math.nan, math.inf, 0.0, 3, True]) for _ in tags]
            if values.count(None) == len(values):
                continue
            wall = rng.uniform(0, 2e9)
            pairs = [(p, v) for p, v in zip(prefixes, values, strict=True) if v is not None]
            event = tfevents.scalars_event(wall, step, pairs)
            head = len(event).to_bytes(8, "little")
            want = b"".join((head, tfevents.mask(tfevents.crc32c_py(head)).to_bytes(4, "little"), event,
                             tfevents.mask(tfevents.crc32c_py(event)).to_bytes(4, "little")))
            assert template.record(wall, step, values) == want
