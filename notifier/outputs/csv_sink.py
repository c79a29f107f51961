"""CSV output: one row per sampled step, with a header that never changes between runs."""

from __future__ import annotations

import csv
import io
import math
import os
from operator import attrgetter
from typing import IO, Any

import msgspec

from msmon.common.safenames import slug
from msmon.contract.wire import Sample

CSV_COLUMNS: tuple[str, ...] = (
    "time", "run_id", "device", "step", "loss", "learning_rate", "grad_norm",
    "samples_per_s", "tokens_per_s", "step_time", "max_step_time", "local_grad_norm",
    "data_time", "overflow", "loss_scale", "skipped_steps",
)
_NUMBERS = attrgetter(*(c for c in CSV_COLUMNS if c not in ("run_id", "device")))  # time, step, loss, ...
_LINE_END = b"\r\n"  # the csv module's, as rows written before this writer have it


def _cell(v: Any) -> Any:
    if v is None:
        return ""
    if isinstance(v, bool):
        return int(v)  # the overflow flag: 1 / 0
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return v


def _csv_line(cells: list[Any]) -> bytes:
    """`cells` as the csv module writes them (quoted where a cell needs it)."""
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\r\n").writerow(cells)
    return buf.getvalue().encode()


class CsvSink:
    """Writes `path` (with `{run_id}` / `{device}` filled in); one file per device if the path says so.

    A row is the sample's numbers through msgspec's JSON encoder (its shortest float form, which `float()`
    and every CSV reader read back exactly), nulls made empty cells and the flag 1 / 0: a few C calls a row
    instead of the csv module's look at every cell. A row with a NaN or an infinity (JSON has no such
    number) goes through the csv module and is written `nan`, `inf`, `-inf`."""

    name = "CSV"

    def __init__(self, path_template: str, run_id: str) -> None:
        self.template = path_template
        self.run_id = run_id
        self._files: dict[str, tuple[IO[bytes], bytes]] = {}  # device -> (file, its run_id,device cells)
        self._encode = msgspec.json.Encoder().encode

    def path_for(self, device: str) -> str:
        """The file for `device`: the run id and device enter the path only as safe slugs
        (msmon.common.safenames), so a run id like `../../x` stays a file name."""
        return self.template.format(run_id=slug(self.run_id), device=slug(device))

    def _open(self, device: str) -> tuple[IO[bytes], bytes]:
        entry = self._files.get(device)
        if entry is None:
            path = self.path_for(device)
            shared = next((e for d, e in self._files.items() if self.path_for(d) == path), None)
            ids = _csv_line([self.run_id, device])[:-2]
            if shared is not None:  # one file for every device: the path has no {device}
                entry = self._files[device] = (shared[0], ids)
                return entry
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            new = not os.path.exists(path) or os.path.getsize(path) == 0
            f = open(path, "ab")  # noqa: SIM115 - kept open for the run
            if new:
                f.write(_csv_line(list(CSV_COLUMNS)))
            entry = self._files[device] = (f, ids)
        return entry

    def write(self, s: Sample) -> None:
        f, ids = self._open(s.device)
        numbers = _NUMBERS(s)
        body = self._encode(numbers)
        if body.count(b"null") != numbers.count(None):  # a NaN or an infinity, which JSON writes as null
            f.write(_csv_line([_cell(getattr(s, c)) for c in CSV_COLUMNS]))
            return
        body = body[1:-1].replace(b"null", b"").replace(b"true", b"1").replace(b"false", b"0")
        comma = body.index(b",")
        f.write(b"".join((body[:comma + 1], ids, body[comma:], _LINE_END)))

    def flush(self) -> None:
        for f in {id(f): f for f, _ in self._files.values()}.values():
            f.flush()

    def close(self) -> None:
        for f in {id(f): f for f, _ in self._files.values()}.values():
            f.close()
        self._files.clear()
