"""The log line users already know: `[step 100] loss: 2.341 | lr: 1.2e-5 | grad_norm: 1.02 | ...`."""

from __future__ import annotations

import logging
import os
import sys
import threading
import time

from msmon.contract.wire import Sample


def _sci(x: float) -> str:
    """1.2e-05 -> 1.2e-5: the short form people write."""
    text = f"{x:.3g}"
    if "e" in text:
        mant, exp = text.split("e")
        text = f"{mant}e{int(exp)}"
    return text


def format_log_line(s: Sample, with_device: bool = False) -> str:
    loss, lr, g, tps = s.loss, s.learning_rate, s.grad_norm, s.tokens_per_s
    if (loss is not None and lr is not None and g is not None and tps is not None and s.local_grad_norm is None
            and not with_device):
        # the usual line (a job with every metric), in one formatting pass: the same text as below
        return (f"[step {s.step}] loss: {loss:.4g} | lr: {_sci(lr)} | grad_norm: {g:.3g} | "
                f"throughput: {tps:.0f} tokens/s")
    parts = []
    if loss is not None:
        parts.append(f"loss: {loss:.4g}")
    if lr is not None:
        parts.append(f"lr: {_sci(lr)}")
    if g is not None:
        parts.append(f"grad_norm: {g:.3g}")
    if s.local_grad_norm is not None:
        parts.append(f"local_grad_norm: {s.local_grad_norm:.3g}")
    if tps is not None:
        parts.append(f"throughput: {tps:.0f} tokens/s")
    elif s.samples_per_s is not None:
        sps = s.samples_per_s
        parts.append(f"throughput: {sps:.0f} samples/s" if sps >= 100 else f"throughput: {sps:.3g} samples/s")
    head = f"[step {s.step}]" + (f" [device {s.device}]" if with_device else "")
    return f"{head} " + " | ".join(parts) if parts else head


class LineRecords:
    """The step line's `LogRecord`, made as `logger.makeRecord` makes it, for a quarter of its cost.

    `makeRecord` takes ~24k instructions a line (callgrind), as much as the rest of msmon's own part of the
    line: most of it goes to what is the same on every line (the file name split from its path, the level's
    name, an ABC isinstance check of the argument). Here a record made once is the template: each line copies
    its attributes and sets those that change (the time, the thread, the process) exactly as
    `LogRecord.__init__` of this Python sets them. The message is the line itself with no arguments (what
    `getMessage()` returns is the same). The record then goes through `logger.handle`, so the program's
    filters, handlers, levels and formats apply as to any line. A program that installed its own record
    factory (`logging.setLogRecordFactory`), a logger class with its own `makeRecord`, or a Python whose
    `LogRecord` this does not know (other than 3.11) gets `makeRecord` itself."""

    __slots__ = ("logger", "pathname", "lineno", "func", "_template")

    def __init__(self, logger: logging.Logger, pathname: str, lineno: int, func: str) -> None:
        self.logger, self.pathname, self.lineno, self.func = logger, pathname, lineno, func
        self._template: dict[str, object] | None = None

    def __call__(self, line: str) -> logging.LogRecord:
        logger = self.logger
        if (not _KNOWN_RECORD or logging.getLogRecordFactory() is not logging.LogRecord
                or type(logger).makeRecord is not logging.Logger.makeRecord):
            return logger.makeRecord(logger.name, logging.INFO, self.pathname, self.lineno, line, (), None, self.func)
        template = self._template
        if template is None or template["name"] != logger.name:
            template = self._template = logger.makeRecord(logger.name, logging.INFO, self.pathname, self.lineno, "",
                                                          (), None, self.func).__dict__.copy()
        record: logging.LogRecord = _new_record(logging.LogRecord)
        record.__dict__ = attrs = template.copy()
        # as LogRecord.__init__ (3.11) sets them
        ct = time.time()
        attrs["msg"] = line
        attrs["created"] = ct
        attrs["msecs"] = int((ct - int(ct)) * 1000) + 0.0
        attrs["relativeCreated"] = (ct - logging._startTime) * 1000  # type: ignore[attr-defined]
        if logging.logThreads:
            attrs["thread"] = threading.get_ident()
            attrs["threadName"] = threading.current_thread().name
        else:
            attrs["thread"] = attrs["threadName"] = None
        if not logging.logMultiprocessing:
            attrs["processName"] = None
        else:
            attrs["processName"] = "MainProcess"
            mp = sys.modules.get("multiprocessing")
            if mp is not None:
                try:  # noqa: SIM105 - as logging does (contextlib.suppress costs more)
                    attrs["processName"] = mp.current_process().name
                except Exception:  # noqa: BLE001, S110 - as logging does
                    pass
        attrs["process"] = os.getpid() if logging.logProcesses and hasattr(os, "getpid") else None
        return record


_new_record = object.__new__
_KNOWN_RECORD = sys.version_info[:2] == (3, 11)  # the LogRecord.__init__ that LineRecords repeats
