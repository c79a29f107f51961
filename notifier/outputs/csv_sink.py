"""CSV output: one row per sampled step, with a header that never changes between runs."""

from __future__ import annotations

import csv
import math
import os
from typing import IO, Any

from msmon.common.safenames import slug
from msmon.contract.wire import Sample

CSV_COLUMNS: tuple[str, ...] = (
    "time", "run_id", "device", "step", "loss", "learning_rate", "grad_norm",
    "samples_per_s", "tokens_per_s", "step_time", "max_step_time", "local_grad_norm",
    "data_time", "overflow", "loss_scale", "skipped_steps",
)


def _cell(v: Any) -> Any:
    if v is None:
        return ""
    if isinstance(v, bool):
        return int(v)  # the overflow flag: 1 / 0
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return v


class CsvSink:
    """Writes `path` (with `{run_id}` / `{device}` filled in); one file per device if the path says so."""

    name = "CSV"

    def __init__(self, path_template: str, run_id: str) -> None:
        self.template = path_template
        self.run_id = run_id
        self._files: dict[str, tuple[IO[str], Any]] = {}

    def path_for(self, device: str) -> str:
        """The file for `device`: the run id and device enter the path only as safe slugs
        (msmon.common.safenames), so a run id like `../../x` stays a file name."""
        return self.template.format(run_id=slug(self.run_id), device=slug(device))

    def _writer(self, device: str) -> Any:
        path = self.path_for(device)
        entry = self._files.get(path)
        if entry is None:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            new = not os.path.exists(path) or os.path.getsize(path) == 0
            f = open(path, "a", newline="", encoding="utf-8")  # noqa: SIM115 - kept open for the run
            w = csv.writer(f)
            if new:
                w.writerow(CSV_COLUMNS)
            entry = self._files[path] = (f, w)
        return entry[1]

    def write(self, s: Sample) -> None:
        self._writer(s.device).writerow([_cell(getattr(s, c)) for c in CSV_COLUMNS])

    def flush(self) -> None:
        for f, _ in self._files.values():
            f.flush()

    def close(self) -> None:
        for f, _ in self._files.values():
            f.close()
        self._files.clear()
