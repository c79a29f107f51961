"""TensorBoard output through tensorboardX: LOG_DIR/RUN_ID/device_N, one scalar tag per metric."""

from __future__ import annotations

from typing import Any

from msmon.common.safenames import inside, slug
from msmon.contract.wire import Sample

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


class TensorBoardSink:
    name = "TensorBoard"

    def __init__(self, log_dir: str, run_id: str) -> None:
        try:
            from tensorboardX import SummaryWriter
        except ImportError as exc:  # pragma: no cover - tensorboardX is a dependency
            raise RuntimeError("monitor_config.tensorboard.enable is true but tensorboardX is not installed: "
                               "pip install tensorboardX, or set enable: false") from exc
        self._cls = SummaryWriter
        self.root = inside(log_dir, slug(run_id))
        self._writers: dict[str, Any] = {}

    def dir_for(self, device: str) -> str:
        return inside(self.root, f"device_{slug(device)}")

    def write(self, s: Sample) -> None:
        w = self._writers.get(s.device)
        if w is None:
            w = self._writers[s.device] = self._cls(logdir=self.dir_for(s.device), flush_secs=5)
        for attr, tag in TAGS:
            v = getattr(s, attr)
            if v is not None:
                w.add_scalar(tag, float(v), s.step, walltime=s.time)

    def flush(self) -> None:
        for w in self._writers.values():
            w.flush()

    def close(self) -> None:
        for w in self._writers.values():
            w.close()
        self._writers.clear()
