"""A sampled step made a `Sample`: its rates since the last sample; out to the files, the log, the bot and the rules.

`Monitor.step` times every step and decides which are sampled (the step-interval gate stays there, inline:
a step that is not sampled must cost a few comparisons, not a call). A sampled one comes here: `sample`
takes the step time, throughput and input wait over the span since the device's last sample, makes the
`Sample`, hands it to the background writer, the transport and the step's log line, and then to the rules
(rules.py). With gradient accumulation, `micro_step` sums a sampled optimizer step's micro-step
losses and samples it at its last micro-step; while a device's rows per optimizer step are still being
inferred, `infer` holds its calls. The first samples are checked for metrics the config wants and the job
never reports.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from msmon.contract.wire import Event, Sample

from ..config import MonitorConfig
from ..outputs import BackgroundWriter, format_log_line
from ..outputs.logline import LineRecords
from ..transport import BotTransport
from .device import Device
from .rules import NO_EVENTS, Rules

log = logging.getLogger("msmon")

Step = Callable[..., list[Event]]  # Monitor.step, which held calls go back through


class Sampler:
    """Makes a device's sampled steps `Sample`s and gives them to the outputs and the rules."""

    def __init__(self, cfg: MonitorConfig, run_id: str, devices: dict[str, Device], rules: Rules,
                 line_record: LineRecords) -> None:
        self.run_id = run_id
        self._devices = devices  # the Monitor's, shared
        self._rules = rules
        self._line_record = line_record
        self._li = cfg.log_interval or 0
        self._seq_len = cfg.training.seq_length
        self._per_device = cfg.per_device_metrics
        self._alerting = cfg.alert.enable
        metrics: set[str] = set(cfg.metrics)
        self._want = {m: m in metrics for m in ("loss", "learning_rate", "grad_norm", "throughput")}
        self._want_loss, self._want_lr = self._want["loss"], self._want["learning_rate"]
        self._want_grad, self._want_throughput = self._want["grad_norm"], self._want["throughput"]
        self.writer: BackgroundWriter | None = None  # the Monitor sets them once started
        self.transport: BotTransport | None = None
        self.count = 0  # samples taken, every device together
        self.seen: set[str] = set()  # the metrics reported so far (of loss, learning_rate, grad_norm)

    def sample(
        self, dev: Device, step: int, raw: int, now: float, loss: float | None, lr: float | None,
        grad_norm: float | None, throughput: float | None, timed: bool = True, local_grad_norm: float | None = None,
        overflow: bool | None = None, loss_scale: float | None = None,
    ) -> list[Event]:
        """Sample `dev` at `step` (`raw`: the step number as passed in); the events its rules raised."""
        want_tp = self._want_throughput
        step_time = tokens_s = samples_s = elapsed = data_s = None
        if dev.last_t is not None:
            elapsed = now - dev.last_t
            steps = raw - dev.last_step
            if elapsed > 0.0 and steps > 0:
                step_time = elapsed / steps
                if dev.data_n:
                    data_s = dev.data / steps
                if want_tp:
                    if dev.samples:
                        samples_s = dev.samples / elapsed
                    if dev.tokens:
                        tokens_s = dev.tokens / elapsed
                    elif dev.samples and self._seq_len:
                        tokens_s = dev.samples * self._seq_len / elapsed
        if throughput is not None and want_tp:
            tokens_s = throughput
            if not timed:
                elapsed = None  # a rate measured elsewhere: how fast step() is called is not its span
        max_dt = dev.max_dt if dev.max_dt > 0.0 else None
        dev.last_t, dev.last_step, dev.max_dt, dev.tokens, dev.samples = now, raw, 0.0, 0.0, 0.0
        dev.data, dev.data_n = 0.0, 0
        if overflow:  # the step was skipped: its gradient (Inf/NaN by definition) measured nothing
            grad_norm = local_grad_norm = None
        sample = Sample(
            run_id=self.run_id, device=dev.name, step=step, time=now,
            loss=float(loss) if loss is not None and self._want_loss else None,
            learning_rate=float(lr) if lr is not None and self._want_lr else None,
            grad_norm=float(grad_norm) if grad_norm is not None and self._want_grad else None,
            local_grad_norm=float(local_grad_norm) if local_grad_norm is not None and self._want_grad else None,
            samples_per_s=samples_s, tokens_per_s=tokens_s, step_time=step_time, max_step_time=max_dt,
            elapsed=elapsed, data_time=data_s, overflow=None if overflow is None else bool(overflow),
            loss_scale=None if loss_scale is None else float(loss_scale),
            skipped_steps=dev.skipped if overflow is not None or dev.skipped else None,
        )
        dev.recent.append(sample)
        dev.whatif.add(sample)
        if self.writer is not None:
            self.writer.put(sample)
        if self.transport is not None:
            self.transport.sample(sample)  # (its step is the one the next heartbeat reports)
        self.count += 1
        if self.count <= 3:
            self._check_missing(sample)
        li = self._li
        if li and step % li == 0 and log.isEnabledFor(logging.INFO):
            # made here, not by log.info: logging's search of the stack for the caller (findCaller) costs more than
            # the rest of the line; LineRecords makes the record as makeRecord would, cheaper
            log.handle(self._line_record(format_log_line(sample, with_device=self._per_device)))
        return self._rules.judge(dev, sample) if self._alerting else NO_EVENTS

    def micro_step(
        self, dev: Device, opt: int, last: bool, raw: int, now: float, loss: float | None, lr: float | None,
        grad_norm: float | None, throughput: float | None, timed: bool, local_grad_norm: float | None,
        overflow: bool | None, loss_scale: float | None,
    ) -> list[Event]:
        """A micro-step of the sampled optimizer step `opt` (gradient accumulation; `last`: its last micro-step):
        its loss summed, `opt` sampled at the last with their mean. A NaN or Inf samples `opt` at once."""
        if ((loss is None or loss - loss == 0.0)
                and (grad_norm is None or overflow or grad_norm - grad_norm == 0.0)):
            if loss is not None:
                dev.acc_loss += loss
                dev.acc_n += 1
            if not last:
                return NO_EVENTS
            loss = dev.acc_loss / dev.acc_n if dev.acc_n else None
        # else a NaN/Inf in a micro-step: its optimizer step is sampled at once, sampled step or not
        dev.acc_loss, dev.acc_n = 0.0, 0
        return self.sample(dev, opt, raw, now, loss, lr, grad_norm, throughput, timed, local_grad_norm, overflow,
                           loss_scale)

    def infer(self, dev: Device, call: tuple[Any, ...], step: Step) -> list[Event]:
        """Hold `call` (step()'s arguments) while the device's rows per optimizer step are being inferred; once they
        are, step every held call through the rules (their events returned now). A NaN or Inf answers at once."""
        infer = dev.infer
        assert infer is not None
        dev.held.append(call)
        step_no, _, loss, lr, grad_norm = call[:5]
        if call[10] and (grad_norm is None or grad_norm - grad_norm != 0.0):  # a step skipped by loss scaling
            answer = infer.skip(step_no)
        else:
            answer = infer.feed(step_no, lr, grad_norm)
        if answer is None and (loss is not None and loss - loss != 0.0
                               or grad_norm is not None and not call[10] and grad_norm - grad_norm != 0.0):
            answer = infer.settle()
        return NO_EVENTS if answer is None else self._answered(dev, answer, step)

    def settle(self, step: Step) -> list[Event]:
        """Rows still held while their device's accumulation is inferred (a log shorter than the inference needs)
        go through the rules now, read as the rows so far show; their events."""
        events: list[Event] = []
        for dev in list(self._devices.values()):
            if dev.infer is not None:
                events.extend(self._answered(dev, dev.infer.settle(), step))
        return events

    def _answered(self, dev: Device, answer: tuple[int, int], step: Step) -> list[Event]:
        k, end = answer
        dev.accum, dev.shift, dev.infer = k, (k - 1 - end) % k, None
        if k > 1:
            log.info("msmon: device %s of run %s logs %d rows per optimizer step (its LR and grad norm repeat over "
                     "runs of %d rows): read as gradient accumulation of %d micro-steps, the rules judge optimizer "
                     "steps (declare training.grad_accumulation_steps to set it)", dev.name, self.run_id, k, k, k)
        held, dev.held = dev.held, []
        events: list[Event] = []
        for (s, now, loss, lr, grad, samples, tokens, tp, local, data, overflow, scale) in held:
            events.extend(step(s, loss=loss, lr=lr, grad_norm=grad, samples=samples, tokens=tokens, throughput=tp,
                               time=now, device=dev.name, local_grad_norm=local, data_time=data, overflow=overflow,
                               loss_scale=scale))
        return events if events else NO_EVENTS

    def _check_missing(self, s: Sample) -> None:
        if self.count > 1:  # a rule's one-off notice from the first sample (grad_norm out of scale)
            self._rules.log_notices(self._devices.values())
        for metric, present in (("loss", s.loss), ("learning_rate", s.learning_rate), ("grad_norm", s.grad_norm)):
            if present is not None:
                self.seen.add(metric)
        if self.count < 3:
            return
        for metric in ("loss", "learning_rate", "grad_norm"):
            if self._want[metric] and metric not in self.seen:
                arg = {"learning_rate": "lr"}.get(metric, metric)
                log.warning("msmon: %s is in monitor_config.metrics but run %s has not reported it in its first 3 "
                            "samples, so the rules on it are idle. Pass %s= to Monitor.step() (for grad_norm: use "
                            "notifier.mindspore's grad-norm train step), or drop it from metrics.",
                            metric, self.run_id, arg)
