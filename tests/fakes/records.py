"""Wire records the tests build: an alert event with its window and an envelope (the bot's tests),
a plain event and sample (the transport's)."""

from __future__ import annotations

import math
import time

from msmon.contract.wire import Envelope, Event, Sample, Severity, Status, Window, encode


def event(run="run-42", rule="grad_norm", device="0", sev=Severity.ERROR, status=Status.FIRING, step=100,
          value=12.0) -> Event:
    w = Window(steps=list(range(step - 5, step + 1)), loss=[2.0, 2.1, 2.0, 2.2, math.nan, 2.4],
               learning_rate=[1e-4] * 6, grad_norm=[1.0, 1.2, 2.0, 4.0, 8.0, value], tokens_per_s=[1500.0] * 6)
    return Event(run_id=run, device=device, step=step, time=time.time(), rule=rule, severity=sev, status=status,
                 value=value, threshold=10.0, message=f"grad norm {value} is over the threshold 10", metric="grad_norm",
                 hint="Save a checkpoint now.", window=w)


def envelope(events, run="run-42", project="llm", samples=()) -> bytes:
    return encode(Envelope(run_id=run, device="0", sent_at=time.time(), project=project, events=list(events),
                           samples=list(samples)))


def ev(step: int, sev: Severity = Severity.ERROR, value: float = 1.0) -> Event:
    return Event(run_id="run-1", device="0", step=step, time=float(step), rule="grad_norm", severity=sev,
                 status=Status.FIRING, value=value, threshold=10.0, message="m")


def sample(step: int, loss: float = 2.0) -> Sample:
    return Sample(run_id="run-1", device="0", step=step, time=float(step), loss=loss)
