"""TensorBoard output: LOG_DIR/RUN_ID/device_N, one scalar tag per metric, one event per sampled step.

Written by `tfevents.EventFileWriter` (TensorBoard's own record format, put together directly): a step's
scalars go in one event, so a step costs one record and two CRCs whatever the number of metrics.
tensorboardX's `add_scalar` pays a numpy conversion, a protobuf object, a queue lock and a record per
scalar (bench/bench_job_cost.py has the instruction counts of both).
"""

from __future__ import annotations

import math
from operator import attrgetter

from msmon.common.safenames import inside, slug
from msmon.contract.wire import Sample

from .tfevents import EventFileWriter

TAGS: tuple[tuple[str, str], ...] = (
    ("loss", "train/loss"),
    ("learning_rate", "train/learning_rate"),
    ("grad_norm", "train/grad_norm"),
    ("local_grad_norm", "train/local_grad_norm"),
    ("tokens_per_s", "throughput/tokens_per_s"),
    ("samples_per_s", "throughput/samples_per_s"),
    ("step_time", "time/step_time_s"),
    ("max_step_time", "time/max_step_time_s"),
    ("data_time", "time/data_time_s"),
    ("overflow", "train/overflow"),
    ("loss_scale", "train/loss_scale"),
    ("skipped_steps", "train/skipped_steps"),
)
_FLOAT_MAX = 3.4028234663852886e38  # the largest float32: simple_value is one


def _f32(v: float) -> float:
    """A value as simple_value (a float32) holds it: beyond its range it is an infinity, as a cast makes it."""
    v = float(v)
    if -_FLOAT_MAX <= v <= _FLOAT_MAX or v != v:
        return v
    return math.copysign(math.inf, v)


class TensorBoardSink:
    name = "TensorBoard"

    def __init__(self, log_dir: str, run_id: str) -> None:
        self.root = inside(log_dir, slug(run_id))
        self._writers: dict[str, EventFileWriter] = {}
        self._values = attrgetter(*(attr for attr, _ in TAGS))
        self._tags = [tag for _, tag in TAGS]

    def dir_for(self, device: str) -> str:
        return inside(self.root, f"device_{slug(device)}")

    def write(self, s: Sample) -> None:
        w = self._writers.get(s.device)
        if w is None:
            w = self._writers[s.device] = EventFileWriter(self.dir_for(s.device), self._tags)
        values = self._values(s)
        if values.count(None) == len(values):
            return
        try:
            w.scalars(s.time, s.step, values)
        except OverflowError:  # a value beyond float32: written as the infinity a cast makes it
            w.scalars(s.time, s.step, [None if v is None else _f32(v) for v in values])

    def flush(self) -> None:
        for w in self._writers.values():
            w.flush()

    def close(self) -> None:
        for w in self._writers.values():
            w.close()
        self._writers.clear()
