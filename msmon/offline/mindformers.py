"""MindFormers' training log lines read into metrics: pure code, lines in, records out.

MindFormers' `MFLossMonitor` (`mindformers/core/callback/callback.py`) prints one line per printed step,
behind its logger's prefix (`2025-04-07 15:34:27,308 - mindformers[...] - INFO - ` on stdout, so in
`msrun_log/worker_N.log`; `[INFO] 2023-07-11 10:47:36,427 [...] print_output_info: ` in `log/rank_N/info.log`):

    current  { Epoch:[%3d/%3d], step:[%5d/%5d], loss: %5.6f, per_step_time: %dms, lr: %s, overflow cond: %s,
             loss_scale: %s, global_norm: %s, train_throughput_per_npu: %.3fT
             (non-sink mode: `loss:[%5.6f/%5.6f], `; no `lr: ` when the LR cannot be computed; an optional
             `lm_loss: `, `load_balancing_loss: `, `mtp_loss: `, `indexer_loss: ` after the loss), then its
             progress line `  %4.1f%% |███   | %.5f samples/s/p  H:MM:SS }`. Releases differ (read from each
             one's callback.py): the loss is `%5.3f` up to 1.6 and `%5.6f` from 1.7; `global_norm` is printed
             from 1.3, the throughput tail from 1.6; 1.0 prints samples/s/p with `%.2f`. The `%s` values are
             NumPy's float32 arrays as str() prints them (`lr: 5e-05`, `global_norm: [3.5912347]`,
             `loss_scale: 65536.0`), or a word (`None`, `unavailable`) when MindFormers has none.
    older    Epoch:[%3d/%3d], step:[%5d/%5d], loss:[%5.3f/%5.3f], time:%5.3f ms, lr:%s, overflow cond: %s,
             loss_scale: %s   (after `print_output_info: ` in its file format; sink mode: `loss: %5.3f, `)

`step` counts within the epoch, so the global step is `(epoch - 1) * steps_per_epoch + step` (what
MindFormers itself writes to TensorBoard); in sink mode it jumps by the sink size. The 2022 generation
(`Epoch:[..], step:[..], loss:[a/b], time:.. ms, lr:..`, no overflow fields) counted epochs from 0: a
log with an epoch 0 is read so. A value in words (`lr:Not Set LR.`) is MindFormers saying it has none. Throughput is the
progress line's samples/s per device (the unit of MindFormers' `throughput_baseline`); time is the
prefix's timestamp, read as UTC (the log does not say its zone; only differences matter to msmon).

Damaged lines (a missing colon, a number with its dot lost, a field cut off) are read field by field:
what can be read is kept, a field that is there but unreadable is missing (None) and listed in the
`Report`; a value is never guessed. A number printed with a fixed format (the loss's `%5.3f` or `%5.6f`, the
progress line's `%.5f` or `%.2f`) must look like it, so `loss: 10649` (the dot lost) is missing, not ten
thousand; a number that NumPy printed always has a dot or an exponent (`[3.5912347]`, `5e-05`), so `[35912347]`
is missing too, and so is an unclosed `[3.59`. A line that ends inside a field MindFormers always follows
with another (the loss, the LR, `overflow cond`) was cut there: that value is missing; so is the last value of
a file's last line when the line has no newline (a log of a killed rank, or one still being written).
`overflow cond` (the step overflowed under dynamic loss scaling and was skipped) and `loss_scale` are read
(`Record.overflow`, `Record.loss_scale`; a skipped step's global_norm is not a measurement, msmon's Monitor leaves
it out); `per_step_time` and `train_throughput_per_npu` are not (the time comes from the timestamps).

A data-parallel run's per-rank values come from MindFormers' `TrainingStateMonitor` (monitor_config
`device_local_loss_format` / `device_local_norm_format` with 'log'), one line each in the rank's own log:

    state    Epoch:[%3d/%3d], step:[%5d/%5d] %s: %.4f      (1.6, 1.7; `%s: %s` from 1.8)

whose tags `device_accum_local_lm_loss` (`device_accum_local_loss` in older docs) and `device_local_norm` are
read into the record of the same step (`local_loss`, `local_grad_norm`: the rank's own loss and its gradient
norm before the all-reduce), or a record of their own when MFLossMonitor did not print that step; its other
tags (`local_norm/NAME`, `weight_norm`, `micro_local_lm_loss`, `adam_m_norm/NAME`, ...) are passed over. Its
`dump_path/rank_N/*.npy` files are the graph's transient dumps, removed by the callback as it reads them:
the logs (or TensorBoard's `rank_N` folders, msmon.offline.readers) are what a finished run keeps.
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

MARKER = re.compile(rb"Epoch\s*:?\s*\[\s*\d+\s*/")  # what a MindFormers training line looks like, in bytes


@dataclass(slots=True)
class Record:
    """One training line: its line number, the global step and what could be read of it."""

    line: int
    step: int
    loss: float | None = None
    lr: float | None = None
    grad_norm: float | None = None
    throughput: float | None = None  # samples/s per device, from the progress line after it
    time: float | None = None  # seconds since the epoch, from the line's timestamp
    local_loss: float | None = None  # TrainingStateMonitor's device_accum_local_loss: this rank's own loss
    local_grad_norm: float | None = None  # its device_local_norm: this rank's grad norm before the all-reduce
    overflow: bool | None = None  # `overflow cond`: dynamic loss scaling skipped this step
    loss_scale: float | None = None  # `loss_scale`: the scale the step ran with
    printed: bool = True  # False: only TrainingStateMonitor's lines so far (MFLossMonitor's may follow)


@dataclass
class Report:
    """What a log held: training lines read, lines skipped (no readable step) and fields read as missing."""

    lines: int = 0
    skipped: list[tuple[int, str]] = field(default_factory=list)  # (line, why)
    missing: list[tuple[int, str, str]] = field(default_factory=list)  # (line, field, the text as it stands)

    def summary(self, where: str, shown: int = 4) -> str | None:
        """One sentence for the user, or None when nothing was damaged."""
        found = sorted([(n, f"{why} (skipped)") for n, why in self.skipped]
                       + [(n, f"{name} {text!r} is not a number (read as missing)") for n, name, text in self.missing])
        if not found:
            return None
        listed = "; ".join(f"line {n}: {what}" for n, what in found[:shown])
        more = f"; and {len(found) - shown} more" if len(found) > shown else ""
        return (f"{where}: {len({n for n, _ in found})} damaged line(s) among {self.lines:,} MindFormers training "
                f"lines; what could be read was kept, the rest is missing, nothing was guessed: {listed}{more}")


_K = r"\s*:?\s*"  # a key's colon, which damaged lines sometimes lose
_PAIR = re.compile(r"\[\s*(\d+)\s*/\s*(\d+)\s*\]")
_EPOCH = re.compile(r"Epoch" + _K + r"(\[[^\]]*\]?)")
_STEP = re.compile(r"(?<![\w-])step(?!\w)" + _K + r"(\[[^\]]*\]?)")
_VALUE = r"(\[[^\]]*\]|Tensor\([^)]*\)|[^,\s]*)"
_LOSS = re.compile(r"(?<![\w-])loss(?!\w)" + _K + _VALUE)
_LR = re.compile(r"(?<![\w-])lr(?!\w)" + _K + _VALUE)
_NORM = re.compile(r"global_norm" + _K + _VALUE)
_OVERFLOW = re.compile(r"overflow cond" + _K + _VALUE)
_SCALE = re.compile(r"loss_scale" + _K + _VALUE)
# TrainingStateMonitor's line: step:[s/S], a space, its tag and value (MFLossMonitor's has a comma after the step)
_STATE = re.compile(r"\]\s+([A-Za-z_][\w./-]*)\s*:?\s*(.*?)\s*$")
_STATE_FIELD = {"device_accum_local_lm_loss": "local_loss", "device_accum_local_loss": "local_loss",
                "device_local_norm": "local_grad_norm"}
_NOT_STATE = ("per_step_time", "overflow cond", "loss_scale")  # MFLossMonitor's keys: a damaged line of its own
_PROGRESS = re.compile(r"\d+(?:\.\d+)?%\s*\|[^|]*\|\s*(\S*)\s*samples/s/p")
_STAMP = re.compile(r"(\d{4})-(\d\d)-(\d\d)[ T](\d\d):(\d\d):(\d\d)(?:[,.](\d{1,6}))?")
_LOSS_FORM = re.compile(r"-?\d+\.(?:\d{3}|\d{6})|-?nan|-?inf", re.IGNORECASE)  # %5.3f (to 1.6), %5.6f (1.7 on)
_SAMPLES = re.compile(r"\d+\.(?:\d{5}|\d{2})|nan|inf", re.IGNORECASE)  # %.5f (1.1 on), %.2f (1.0)
# What str() of a NumPy float (or a Python float) prints: a dot, or an exponent after one digit and its decimals
# (`0.75`, `[1.]`, `5e-05`, `1.5e+30`), so a lost dot shows
_SHOWN = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d(?:\.\d*)?[eE][-+]?\d+|nan|inf)", re.IGNORECASE)


def _words(raw: str) -> bool:
    """Words where a value goes (MindFormers' "CPU Mode Not Support Compute LR Now.", a None): not a damaged
    number. A number's own letters cut short ("n" of nan, "in" of inf) are no words: that value was cut."""
    text = _strip(raw).lstrip("+-").lower()
    return text.isalpha() and not any(w.startswith(text) for w in ("nan", "inf", "infinity"))




def _pair(text: str) -> tuple[int, int] | None:
    m = _PAIR.fullmatch(text.strip())
    return (int(m.group(1)), int(m.group(2))) if m else None


def _strip(text: str) -> str:
    """`[44.31]`, `Tensor(shape=[], dtype=Float32, value= 44.31)` -> `44.31`: the one value a %s printed."""
    text = text.strip()
    if text.startswith("Tensor(") and "value=" in text:
        text = text.split("value=", 1)[1].rstrip(")")
    return text.strip().strip("[]").strip()


def _number(text: str, form: re.Pattern[str] = _SHOWN) -> float | None:
    if text.lstrip().startswith("[") != text.rstrip().endswith("]"):
        return None  # `[3.59` (cut) or `3.59]`
    text = _strip(text)
    return float(text) if form.fullmatch(text) else None


def _timestamp(text: str) -> float | None:
    m = _STAMP.search(text)
    if m is None:
        return None
    y, mo, d, h, mi, s, frac = m.groups()
    try:
        whole = calendar.timegm((int(y), int(mo), int(d), int(h), int(mi), int(s), 0, 0, 0))
    except (ValueError, OverflowError):
        return None
    return whole + (int(frac) / 10 ** len(frac) if frac else 0.0)


class _Line:
    """The fields of one training line, each read on its own so one damaged field spares the others."""

    def __init__(self, number: int, text: str, report: Report, cut: bool = False) -> None:
        self.number, self.text, self.report = number, text, report
        self.end = len(text.rstrip())  # where the line's last value ends
        self.cut = cut  # the line may end mid-value (a file's last line with no newline)

    def value(self, name: str, pattern: re.Pattern[str], form: re.Pattern[str] = _SHOWN,
              last: bool = True) -> float | None:
        """The field's number; `last`: the field may end a whole line (else a line ending in it was cut)."""
        m = pattern.search(self.text)
        if m is None:
            return None  # not printed (e.g. no lr on a CPU run)
        raw = m.group(1)
        if raw.startswith("[") and "/" in raw:  # loss:[current/mean of the epoch]: the current one
            raw = raw.strip("[]").split("/")[0]
        v = None if m.end(1) >= self.end and (self.cut or not last) else _number(raw, form)
        if v is None and not _words(raw):  # a cut or damaged value; words ("Not Set LR.", None) say "not known"
            self.report.missing.append((self.number, name, raw.strip()))
        return v

    def flag(self, name: str, pattern: re.Pattern[str]) -> bool | None:
        """A True/False field (`overflow cond`); None when absent, and listed as missing when unreadable."""
        m = pattern.search(self.text)
        if m is None:
            return None
        raw = _strip(m.group(1)).lower()
        if raw in ("true", "false", "1", "0") and m.end(1) < self.end:  # never a line's last field
            return raw in ("true", "1")
        self.report.missing.append((self.number, name, m.group(1).strip()))
        return None

    def scaling(self, into: Record) -> None:
        """The line's `overflow cond` and `loss_scale` into `into`."""
        into.overflow, into.loss_scale = self.flag("overflow cond", _OVERFLOW), self.value("loss_scale", _SCALE)

    def step(self) -> tuple[int, int, int] | None:
        """(epoch, step in it, steps per epoch), or None (the line is skipped, and listed) when Epoch:[e/E] or
        step:[s/S] is unreadable."""
        pairs: list[tuple[int, int]] = []
        for name, pattern in (("Epoch", _EPOCH), ("step", _STEP)):
            m = pattern.search(self.text)
            pair = _pair(m.group(1)) if m else None
            if pair is None:
                self.report.skipped.append((self.number, f"no readable {name}:[N/M]"))
                return None
            pairs.append(pair)
        (epoch, _), (step, per_epoch) = pairs
        return epoch, step, per_epoch


_TRAINING = re.compile(MARKER.pattern.decode())


def _state(text: str) -> re.Match[str] | None:
    """TrainingStateMonitor's `Epoch:[..], step:[..] TAG: VALUE`, not MFLossMonitor's line (damaged or not)."""
    step = _STEP.search(text)
    if step is None or any(key in text for key in _NOT_STATE):
        return None
    state = _STATE.match(text, step.end(1) - 1)
    return None if state is None or state.group(1) == "loss" else state  # `loss` is MFLossMonitor's, comma lost


def _read_printed(line: _Line, into: Record) -> None:
    """MFLossMonitor's fields into `into`. The loss, the LR (but in the 2022 generation's line) and `overflow cond`
    are never a line's last field; global_norm and loss_scale may be."""
    into.loss = line.value("loss", _LOSS, _LOSS_FORM, last=False)
    into.lr = line.value("lr", _LR, last="per_step_time" not in line.text)
    into.grad_norm = line.value("global_norm", _NORM)
    line.scaling(into)


def records(lines: Iterable[str], report: Report | None = None) -> Iterator[Record]:
    """The training records of a MindFormers log, in the order printed; `report` collects the damage."""
    rep = report if report is not None else Report()
    pending: Record | None = None
    first_epoch = 1  # 0 in the 2022 generation, which printed `cur_epoch_num - 1`
    bar_due = False  # the pending record's progress line (its throughput) has not come yet
    newlines = False  # the lines come with their newlines (a file): one without is a cut last line
    for number, text in enumerate(lines, start=1):
        cut = newlines and not text.endswith("\n")
        newlines = newlines or text.endswith("\n")
        if bar_due and "samples/s/p" in text and (bar := _PROGRESS.search(text)) and pending is not None:
            pending.throughput = _number(bar.group(1), _SAMPLES)
            if pending.throughput is None:
                rep.missing.append((number, "samples/s/p", bar.group(1)))
            bar_due = False
            continue
        start = _TRAINING.search(text) if "Epoch" in text else None
        if start is None:
            continue
        prefix = text[:start.start()]  # the logger's: the time (and a path, which the fields must not be read from)
        line = _Line(number, text[start.start():], rep, cut)
        state = _state(line.text)
        if state is not None and state.group(1) not in _STATE_FIELD:
            continue  # another of TrainingStateMonitor's values (local_norm/NAME, weight_norm, ...): not read
        rep.lines += 1
        where = line.step()
        if where is None:
            continue
        epoch, in_epoch, per_epoch = where
        first_epoch = min(first_epoch, epoch)
        step = (epoch - first_epoch) * per_epoch + in_epoch
        if state is not None:  # TrainingStateMonitor: a rank's own value, for this step's record
            if pending is None or pending.step != step:
                if pending is not None:
                    yield pending
                pending = Record(number, step, time=_timestamp(prefix), printed=False)
                bar_due = False
            raw = state.group(2)
            value = None if cut else _number(raw)
            if value is None:
                rep.missing.append((number, state.group(1), raw))
            setattr(pending, _STATE_FIELD[state.group(1)], value)
            continue
        if pending is not None and pending.step == step and not pending.printed:
            # MFLossMonitor's line after TrainingStateMonitor's for the same step: one record
            pending.line, pending.printed = number, True
            _read_printed(line, pending)
            pending.time = _timestamp(prefix) or pending.time
            bar_due = True
            continue
        if pending is not None:
            yield pending
        pending = Record(number, step, time=_timestamp(prefix))
        _read_printed(line, pending)
        bar_due = True
    if pending is not None:
        yield pending
