"""`Monitor`: framework-neutral. Feed it one step at a time; it samples, detects, alerts and logs.

    mon = Monitor.from_config("train.yaml", run_id="run-42")
    for step in ...:
        events = mon.step(step, loss=..., lr=..., grad_norm=..., tokens=...)
    mon.close()

Every call is cheap: a step that is not sampled costs a clock read and two modulo operations.
Detection is pure code (see `detectors/` and `gate.py`); files are written off-thread.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import sys
import time as _time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from msmon.contract.subjects import is_nats_url
from msmon.contract.wire import MAX_ID, Event, Sample, Severity, Status, Window
from msmon.core.accumulation import Infer
from msmon.core.detectors import RULES, DetectorContext, Finding, RuleParams
from msmon.core.detectors.base import SKIP
from msmon.core.gate import AlertGate, GateState, Verdict
from msmon.core.levels import Levels, PhaseSpec
from msmon.core.state import StateError, decode, dump_attrs, encode, load_attrs
from msmon.core.whatif import Recent

from .config import MonitorConfig, load_config
from .config.model import ActionConfig
from .describe import describe
from .outputs import BackgroundWriter, CsvSink, Sink, format_log_line
from .outputs.logline import LineRecords
from .transport import BotTransport
from .world import World, detect, refuse_lone_actions

__all__ = ["Monitor", "describe"]

log = logging.getLogger("msmon")

_EMPTY: list[Event] = []
_LOG_LINE_AT = 0  # the line of Monitor._sample that logs the step's line (set below the class)
WINDOW_SAMPLES = 120  # recent samples kept per device for an event's chart


def _ensure_visible_logging() -> None:
    """If the program configured no logging at all, msmon's own lines would vanish: print them."""
    if not log.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s msmon %(levelname)s %(message)s"))
        log.addHandler(handler)
        if log.level == logging.NOTSET:
            log.setLevel(logging.INFO)


class _Rule:
    __slots__ = ("name", "detector", "update", "gate", "immediate", "hint", "metric")

    def __init__(self, name: str, detector: Any) -> None:
        self.name = name
        self.detector = detector
        self.update = detector.update
        self.gate = GateState()
        self.immediate = name == "nonfinite"
        self.hint: str = detector.hint
        self.metric: str = detector.metric


class _Device:
    """Everything the Monitor keeps for one device; bounded whatever the length of the run."""

    __slots__ = ("name", "rules", "prev_t", "prev_step", "max_dt", "last_t", "last_step",
                 "tokens", "samples", "data", "data_n", "acc_loss", "acc_n", "recent", "whatif", "skipped",
                 "accum", "shift", "infer", "held", "ctx")

    def __init__(self, name: str, rules: list[_Rule], ctx: DetectorContext, accum: int | None = 1) -> None:
        self.name = name
        self.rules = rules
        self.prev_t: float | None = None  # time of the previous step() call
        self.prev_step = 0  # its step number
        self.max_dt = 0.0  # slowest time per step between two calls since the last sample
        self.last_t: float | None = None  # time of the last sample
        self.last_step = 0  # step number (as passed in) of the last sample
        self.tokens = 0.0
        self.samples = 0.0
        self.data = 0.0  # seconds waited for input since the last sample (step(data_time=)), over data_n calls
        self.data_n = 0
        self.acc_loss = 0.0  # gradient accumulation: sum of micro-step losses
        self.acc_n = 0
        # rows per optimizer step: declared (training.grad_accumulation_steps), else inferred from the first rows
        # (msmon.core.accumulation), which are held meanwhile; `shift` aligns the step numbers to the groups
        self.accum = accum or 1
        self.shift = 0
        self.infer: Infer | None = None if accum else Infer()
        self.held: list[tuple[Any, ...]] = []
        self.skipped = 0  # steps skipped by dynamic loss scaling (step(overflow=True)) so far
        self.recent: deque[Sample] = deque(maxlen=WINDOW_SAMPLES)
        self.whatif = Recent()  # the last WHATIF_SAMPLES samples, compact: what a threshold change is judged on
        self.ctx = ctx  # what its rules know of the run (Monitor.plan adds to it)


class Monitor:
    def __init__(
        self,
        config: MonitorConfig | Mapping[str, Any] | str | os.PathLike[str],
        run_id: str = "run",
        *,
        device: str | int | None = None,
        clock: Callable[[], float] = _time.time,
        sinks: list[Sink] | None = None,
        transport: BotTransport | None = None,
        world: World | None = None,
    ) -> None:
        cfg = load_config(config)
        self.config = cfg
        self.world = detect() if world is None else world  # rank, world size, host: read once
        self.run_id = cfg.bot.run_id or run_id
        # the device this process reports as: given, else its rank in the job's world (RANK_ID / RANK_SIZE as msrun
        # and MindFormers set them, notifier.world), as MonitorCallback does; "0" for a single process
        self.default_device = str(device) if device is not None else \
            str(self.world.rank) if self.world.rank is not None else "0"
        for what, value in (("run_id", self.run_id), ("device", self.default_device)):
            if not value or len(value) > MAX_ID:
                raise ValueError(f"msmon: {what} must be 1 to {MAX_ID} characters (the bot refuses longer ones), "
                                 f"got {len(value)}: {value[:40]!r}...")
        self._clock = clock
        self.enabled = cfg.monitor_on
        self._si = cfg.step_interval
        self._li = cfg.log_interval or 0
        self._accum = cfg.training.grad_accumulation_steps
        self._seq_len = cfg.training.seq_length
        self._per_device = cfg.per_device_metrics
        metrics: set[str] = set(cfg.metrics)
        self._want = {m: m in metrics for m in ("loss", "learning_rate", "grad_norm", "throughput")}
        self._want_loss, self._want_lr = self._want["loss"], self._want["learning_rate"]
        self._want_grad, self._want_throughput = self._want["grad_norm"], self._want["throughput"]
        self._alerting = cfg.alert.enable
        self._gate = AlertGate(cfg.alert.alert_interval, cfg.alert.baseline_steps, cfg.alert.resolve_after)
        self._levels = Levels({name: cfg.alert.rules.get(name) for name in RULES},
                              [PhaseSpec(p.name, p.start_step, p.end_step, p.rules) for p in cfg.alert.phases])
        self._phase = self._levels.at(0)
        self._active = self._active_rules(cfg, metrics)
        self._levels.order(self._active)
        self._ctx_peers: dict[str, float] = {}
        self._job_steps: int | None = None  # plan(): the steps the job says it will run, where none is declared
        self._devices: dict[str, _Device] = {}
        self._ignored: set[str] = set()
        self._seen: set[str] = set()
        self._n_samples = 0
        self._closed = False
        self._held_at: float | None = None  # hold_clock(): when a pause on purpose began
        self._line_record = LineRecords(log, __file__, _LOG_LINE_AT, "step")
        _ensure_visible_logging()
        self._writer: BackgroundWriter | None = None
        self.transport: BotTransport | None = None
        if not self.enabled:
            log.info("msmon: monitoring is off for run %s (monitor_config.monitor_on is %s); set "
                     "monitor_on: true to enable it", self.run_id,
                     "not set and defaults to false" if cfg.given is not None and "monitor_on" not in cfg.given
                     else "false")
            return
        # before any thread starts: a multi-rank run never applies a configured action on one rank alone
        refuse_lone_actions([(f"monitor_config.actions[{i}].action", a.action) for i, a in enumerate(cfg.actions)],
                            self.world, "given" if transport is not None else cfg.bot.url, cfg.bot.commands)
        if sinks is None:
            sinks = self._default_sinks(cfg)
        if sinks:
            self._writer = BackgroundWriter(sinks)
        self.transport = transport if transport is not None else self._default_transport(cfg)
        if self.transport is not None:
            self.transport.plan(cfg.training.total_steps, cfg.training.target_loss)
        for line in describe(cfg, self.run_id):
            log.info("msmon: %s", line)
        if self.world.multi and cfg.actions:
            log.info("msmon: %s: the actions above are asked of the bot, which has every rank of run %s apply them "
                     "at the same step", self.world.describe(), self.run_id)

    @classmethod
    def from_config(
        cls, source: MonitorConfig | Mapping[str, Any] | str | os.PathLike[str], run_id: str = "run", **kw: Any
    ) -> Monitor:
        return cls(source, run_id, **kw)

    # -- set-up -----------------------------------------------------------------------------

    def _default_sinks(self, cfg: MonitorConfig) -> list[Sink]:
        sinks: list[Sink] = []
        if cfg.csv.enable:
            sinks.append(CsvSink(cfg.csv.path, self.run_id))
        if cfg.tensorboard.enable:
            from .outputs.tensorboard_sink import TensorBoardSink  # tensorboardX only when asked for

            sinks.append(TensorBoardSink(cfg.tensorboard.log_dir, self.run_id))
        return sinks

    def _default_transport(self, cfg: MonitorConfig) -> BotTransport | None:
        b = cfg.bot
        if not b.url:
            return None
        token = os.environ.get(b.token_env)
        if not token:
            log.warning("msmon: bot.url is set but the environment variable %s (bot.token_env) is empty: the bot "
                        "will refuse run %s until the job has its token", b.token_env, self.run_id)
        log.info("msmon: sending run %s to the bot at %s (spool: %s)", self.run_id, b.url, b.spool_dir)
        backend = None  # bot.url nats://...: through NATS JetStream instead of HTTP (notifier/nats_transport.py)
        if is_nats_url(b.url):
            from .nats_transport import NatsBackend

            backend = NatsBackend(b.url, b.project, self.run_id, self.default_device, token, prefix=b.nats_prefix)
        return BotTransport(b.url, self.run_id, self.default_device, token, project=b.project, labels=b.labels,
                            backend=backend, spool_dir=b.spool_dir, spool_max_bytes=int(b.spool_max_mb * (1 << 20)),
                            heartbeat_interval=b.heartbeat_interval, rank=self.world.rank, host=self.world.host,
                            world=self.world.size if self.world.multi else None)

    @staticmethod
    def _active_rules(cfg: MonitorConfig, metrics: set[str]) -> list[str]:
        active = []
        for name, (_, det_cls) in RULES.items():
            params = cfg.alert.rules.get(name)
            enabled_somewhere = params.enable or any(p.rules.get(name, {}).get("enable") for p in cfg.alert.phases)
            if enabled_somewhere and det_cls.requires <= metrics:
                active.append(name)
        return active

    def _device(self, name: str) -> _Device | None:
        d = self._devices.get(name)
        if d is not None:
            return d
        if not self._per_device and self._devices:
            if name not in self._ignored:
                self._ignored.add(name)
                first = next(iter(self._devices))
                log.info("msmon: ignoring samples from device %s: per_device_metrics is false, so only device %s "
                         "is monitored in run %s", name, first, self.run_id)
            return None
        d = self._devices[name] = self._build_device(name)
        return d

    def _build_device(self, name: str) -> _Device:
        """A device's fresh rules (not yet registered)."""
        cfg = self.config
        ctx = DetectorContext(device=name, total_steps=cfg.training.total_steps, job_steps=self._job_steps,
                              warmup_steps=cfg.training.warmup_steps, target_loss=cfg.training.target_loss,
                              peers=self._ctx_peers)
        rules = [_Rule(n, RULES[n][1](cfg.alert.rules.get(n), ctx)) for n in self._active]
        dev = _Device(name, rules, ctx, cfg.training.grad_accumulation_steps)
        ctx.recent = dev.recent  # a rule may read the device's recent samples (grad_norm_creep's losses)
        return dev

    def plan(self, steps: int | None) -> None:
        """The steps the job itself says it will run (MonitorCallback: MindSpore's epochs x steps per epoch, at
        the start of training), where the config declares no `training.total_steps`: lr_schedule then judges the
        run's length by them (an LR still rising past mid-run, decayed to 0 long before the end), and the bot's
        progress shows them. Steps as the Monitor is given them: divided by a declared accumulation factor."""
        cfg = self.config
        if cfg.training.total_steps is not None or steps is None or steps <= 0:
            return
        k = cfg.training.grad_accumulation_steps or 1
        self._job_steps = max(steps // k, 1)
        log.info("msmon: run %s: the job says it will run %d steps; lr_schedule judges the run's length by them "
                 "(training.total_steps in the config sets it instead)", self.run_id, self._job_steps)
        for dev in self._devices.values():
            dev.ctx.job_steps = self._job_steps
        if self.transport is not None:
            self.transport.plan(self._job_steps, cfg.training.target_loss)

    # -- the hot path ----------------------------------------------------------------------

    def step(
        self,
        step: int,
        *,
        loss: float | None = None,
        lr: float | None = None,
        grad_norm: float | None = None,
        samples: float | None = None,
        tokens: float | None = None,
        throughput: float | None = None,
        time: float | None = None,
        device: str | int | None = None,
        local_grad_norm: float | None = None,
        data_time: float | None = None,
        overflow: bool | None = None,
        loss_scale: float | None = None,
    ) -> list[Event]:
        """Report one finished step; returns the events it raised (usually none).

        Call it on every step: non-sampled steps only time the step (unless a loss or grad norm given
        for them is NaN/Inf: that is sampled, and alerts, at once). `samples` / `tokens` are
        counts for this step (throughput is derived); `throughput=` is an already measured
        tokens/s; `time=` a timestamp (for replays); `device` labels per-device metrics;
        `local_grad_norm` this rank's own grad norm before the all-reduce (data parallel; `grad_norm` is
        then the reduced gradient's), reported as is (the bot compares it across ranks); `data_time` the
        seconds this step waited for its input (from the previous step's end to this one's begin, measured
        on the host: a custom loop times its `next(batch)`; MonitorCallback does it), reported as its mean per
        step over the sample's span, `Sample.data_time` (the bot's straggler rule compares it across ranks:
        in lockstep data parallel the step time is every rank's, the input wait is its own).
        `overflow` / `loss_scale`: fp16 dynamic loss scaling, whether this step overflowed (its update skipped: a
        skipped step is counted, not alerted on; its grad norm, Inf or NaN, is not a measurement) and the scale it
        ran with; give them on every step where they are free to read (the rule `loss_scale` pages when every step
        overflows). A NaN or Inf loss is an ERROR whatever `overflow` says.
        """
        if not self.enabled:
            return _EMPTY
        now = self._clock() if time is None else time
        dev = self._devices.get(self.default_device if device is None else str(device))
        if dev is None:
            dev = self._device(self.default_device if device is None else str(device))
            if dev is None:
                return _EMPTY
        if dev.infer is not None:
            return self._infer(dev, (step, now, loss, lr, grad_norm, samples, tokens, throughput, local_grad_norm,
                                     data_time, overflow, loss_scale))
        prev = dev.prev_t
        if prev is not None:
            ds = step - dev.prev_step  # > 1 when a call covers several steps (dataset sink mode)
            dt = (now - prev) / ds if ds > 1 else now - prev
            if dt > dev.max_dt:
                dev.max_dt = dt
        dev.prev_t = now
        dev.prev_step = step
        if tokens is not None:
            dev.tokens += tokens
        if samples is not None:
            dev.samples += samples
        if data_time is not None and data_time >= 0.0:
            dev.data += data_time
            dev.data_n += 1
        if overflow:
            dev.skipped += 1
        si, li = self._si, self._li
        raw = step
        accum = dev.accum
        if accum > 1:
            opt, micro = divmod(step + dev.shift, accum)
            if ((loss is None or loss - loss == 0.0)
                    and (grad_norm is None or overflow or grad_norm - grad_norm == 0.0)):
                if opt % si and (not li or opt % li):
                    return _EMPTY
                if loss is not None:
                    dev.acc_loss += loss
                    dev.acc_n += 1
                if micro != accum - 1:
                    return _EMPTY
                loss = dev.acc_loss / dev.acc_n if dev.acc_n else None
            # else a NaN/Inf in a micro-step: its optimizer step is sampled at once, sampled step or not
            dev.acc_loss, dev.acc_n = 0.0, 0
            step = opt
        elif (step % si and (not li or step % li)
              # not a sampled step; but a NaN/Inf handed in anyway is sampled at once, not 9 steps later
              and (loss is None or loss - loss == 0.0)
              and (grad_norm is None or overflow or grad_norm - grad_norm == 0.0)):  # a skipped step's is no NaN
            return _EMPTY
        return self._sample(dev, step, raw, now, loss, lr, grad_norm, throughput, time is not None, local_grad_norm,
                            overflow, loss_scale)

    def _infer(self, dev: _Device, call: tuple[Any, ...]) -> list[Event]:
        """Hold `call` (step()'s arguments) while the device's rows per optimizer step are being inferred; once they
        are, step every held call through the rules (their events returned now). A NaN or Inf answers at once."""
        infer = dev.infer
        assert infer is not None
        dev.held.append(call)
        step, _, loss, lr, grad_norm = call[:5]
        if call[10] and (grad_norm is None or grad_norm - grad_norm != 0.0):  # a step skipped by loss scaling
            answer = infer.skip(step)
        else:
            answer = infer.feed(step, lr, grad_norm)
        if answer is None and (loss is not None and loss - loss != 0.0
                               or grad_norm is not None and not call[10] and grad_norm - grad_norm != 0.0):
            answer = infer.settle()
        return _EMPTY if answer is None else self._answered(dev, answer)

    def settle(self) -> list[Event]:
        """Rows still held while their device's accumulation is inferred (a log shorter than the inference needs)
        go through the rules now, read as the rows so far show; their events. `close()` and `state_dict()` do it."""
        events: list[Event] = []
        for dev in list(self._devices.values()):
            if dev.infer is not None:
                events.extend(self._answered(dev, dev.infer.settle()))
        return events

    def _answered(self, dev: _Device, answer: tuple[int, int]) -> list[Event]:
        k, end = answer
        dev.accum, dev.shift, dev.infer = k, (k - 1 - end) % k, None
        if k > 1:
            log.info("msmon: device %s of run %s logs %d rows per optimizer step (its LR and grad norm repeat over "
                     "runs of %d rows): read as gradient accumulation of %d micro-steps, the rules judge optimizer "
                     "steps (declare training.grad_accumulation_steps to set it)", dev.name, self.run_id, k, k, k)
        held, dev.held = dev.held, []
        events: list[Event] = []
        for (s, now, loss, lr, grad, samples, tokens, tp, local, data, overflow, scale) in held:
            events.extend(self.step(s, loss=loss, lr=lr, grad_norm=grad, samples=samples, tokens=tokens, throughput=tp,
                                    time=now, device=dev.name, local_grad_norm=local, data_time=data,
                                    overflow=overflow, loss_scale=scale))
        return events if events else _EMPTY

    def samples(self, step: int) -> bool:
        """Whether `step` will be sampled (so a caller can skip reading metrics on the others)."""
        if not self.enabled:
            return False
        accum = self._accum
        if accum is not None and accum > 1:
            step //= accum
        return not (step % self._si and (not self._li or step % self._li))

    def _sample(
        self, dev: _Device, step: int, raw: int, now: float, loss: float | None, lr: float | None,
        grad_norm: float | None, throughput: float | None, timed: bool = True, local_grad_norm: float | None = None,
        overflow: bool | None = None, loss_scale: float | None = None,
    ) -> list[Event]:
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
            elapsed=elapsed, data_time=data_s,
            overflow=None if overflow is None else bool(overflow),
            loss_scale=None if loss_scale is None else float(loss_scale),
            skipped_steps=dev.skipped if overflow is not None or dev.skipped else None,
        )
        dev.recent.append(sample)
        dev.whatif.add(sample)
        if self._writer is not None:
            self._writer.put(sample)
        transport = self.transport
        if transport is not None:
            transport.sample(sample)  # (its step is the one the next heartbeat reports)
        self._n_samples += 1
        if self._n_samples <= 3:
            self._check_missing(sample)
        li = self._li
        if li and step % li == 0 and log.isEnabledFor(logging.INFO):
            # the record made here, not by log.info: its caller is known, and logging's search of the stack for it
            # (findCaller) costs more than the rest of the line; LineRecords makes it as makeRecord would, cheaper
            log.handle(self._line_record(format_log_line(sample, with_device=self._per_device)))
        if not self._alerting:
            return _EMPTY
        phase = self._phase
        if not phase.start <= step < phase.end:
            phase = self._phase = self._levels.at(step)
        events: list[Event] | None = None
        gate = self._gate
        for rule, params in zip(dev.rules, phase.ordered):  # noqa: B905 - same length by construction
            try:
                finding = rule.update(sample, params)
            except Exception:  # noqa: BLE001 - a detector bug must never stop training
                self._disable(dev, rule, step)
                continue
            if finding is SKIP:
                continue
            alert_state = rule.gate
            if finding is None and alert_state.firing is None and not alert_state.n_warn:
                continue
            if not params.enable:
                finding = None
            verdict = gate.admit(alert_state, finding, step, params.consecutive, rule.immediate)
            if verdict is not None:
                if events is None:
                    events = []
                events.append(self._event(dev, sample, rule, finding, verdict, phase.name))
        return events if events is not None else _EMPTY

    # -- helpers off the hot path ------------------------------------------------------------

    def _disable(self, d: _Device, r: _Rule, step: int) -> None:
        """Take a crashed rule out (for this device only): training and the other rules go on."""
        log.exception("msmon: rule %s failed at step %d on device %s of run %s and is now off for this device; "
                      "training and the other rules continue. Please report this with the traceback.",
                      r.name, step, d.name, self.run_id)
        r.update = _off

    def _check_missing(self, s: Sample) -> None:
        if self._n_samples > 1:  # a rule's one-off notice from the first sample (grad_norm out of scale)
            for d in self._devices.values():
                for r in d.rules:
                    note = getattr(r.detector, "notice", None)
                    if note:
                        r.detector.notice = None
                        log.warning("msmon: run %s device %s: %s", self.run_id, d.name, note)
        for metric, present in (("loss", s.loss), ("learning_rate", s.learning_rate), ("grad_norm", s.grad_norm)):
            if present is not None:
                self._seen.add(metric)
        if self._n_samples < 3:
            return
        for metric in ("loss", "learning_rate", "grad_norm"):
            if self._want[metric] and metric not in self._seen:
                arg = {"learning_rate": "lr"}.get(metric, metric)
                log.warning("msmon: %s is in monitor_config.metrics but run %s has not reported it in its first 3 "
                            "samples, so the rules on it are idle. Pass %s= to Monitor.step() (for grad_norm: use "
                            "notifier.mindspore's grad-norm train step), or drop it from metrics.",
                            metric, self.run_id, arg)

    def _event(self, d: _Device, s: Sample, r: _Rule, f: Finding | None, v: Verdict, phase: str) -> Event:
        resolved = v.status is Status.RESOLVED
        if resolved or f is None:
            message = f"{r.name} is back to normal"
            value = threshold = math.nan
            baseline = None
        else:
            message, value, threshold, baseline = f.message, f.value, f.threshold, f.baseline
        ev = Event(
            run_id=self.run_id, device=d.name, step=s.step, time=s.time, rule=r.name, severity=v.severity,
            status=v.status, value=value, threshold=threshold, message=message, hint="" if resolved else r.hint,
            metric=r.metric, baseline=baseline, phase=phase, repeat=v.repeat,
            actions=[] if resolved or v.repeat else self._actions_for(r.name, v.severity),
            window=Window.of(d.recent),
        )
        _log_event(ev)
        if self.transport is not None:
            self.transport.event(ev)
        return ev

    def _actions_for(self, rule: str, severity: Severity) -> list[dict[str, object]]:
        out = []
        for a in self.config.actions:
            if a.rule in ("*", rule) and severity.rank >= Severity(a.severity).rank:
                out.append(_action_dict(a))
        return out

    def _known(self, rule: str) -> str:
        if rule not in RULES:
            from msmon.config.errors import closest

            hint = closest(rule, RULES)
            raise ValueError(f"unknown rule {rule!r}" + (f"; did you mean {hint}?" if hint else ""))
        return rule

    def acknowledge(self, rule: str, device: str | None = None) -> str:
        """A person acknowledged `rule`'s alert (chat `ack`): on each device (or the one named) a shift the rule
        holds against its pre-shift reference is accepted as the new normal, so the alert resolves once the rule
        has learned it. What was done, in words."""
        self._known(rule)
        accepted, seen = [], []
        for name, d in list(self._devices.items()):
            if device is not None and name != device:
                continue
            for r in d.rules:
                ack = getattr(r.detector, "acknowledge", None)
                if r.name == rule and ack is not None:
                    seen.append(name)
                    if ack():
                        accepted.append(name)
        if accepted:
            log.info("msmon: run %s: %s acknowledged: the level now is the new normal on device(s) %s", self.run_id,
                     rule, ", ".join(accepted))
            return (f"{rule}: the level now is taken as the new normal on device(s) {', '.join(accepted)} (learned "
                    "afresh; the alert resolves once the rule has learned it)")
        if not seen:
            return f"{rule}: nothing to accept (the rule holds no reference to release here)"
        return f"{rule}: no shift held on device(s) {', '.join(seen)}; nothing to accept"

    def set_threshold(self, rule: str, value: float, level: str = "warning") -> float | None:
        """Change a rule's WARNING or ERROR level live, in every phase; returns the old level."""
        old = self._levels.set(self._known(rule), value, level)
        log.info("msmon: run %s: %s %s level set to %g (was %s)", self.run_id, rule, level, value, old)
        return old

    def loosen(self, rule: str, *, value: float | None = None, factor: float | None = None) -> tuple[str, Any]:
        """Scale a rule's levels live, in every phase: by `factor`, or so that its main level (WARNING if
        set, else ERROR) becomes `value`; the other level moves in proportion. Returns a description
        and an opaque `undo` for `restore()`."""
        desc, undo = self._levels.loosen(self._known(rule), value=value, factor=factor)
        log.info("msmon: run %s: %s", self.run_id, desc)
        return desc, undo

    def restore(self, undo: Any) -> None:
        """Put back the levels `loosen()` changed."""
        self._levels.restore(undo)

    # -- saving and resuming ------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Everything the Monitor has learned, as JSON-safe data (`json.dumps` takes it as is): every rule's
        detector memory and alert state per device, the recent samples charts show, the levels (live threshold
        changes included). Bounded: the windows are. `load_state_dict` in a Monitor built from the same config
        carries on as if the run had never stopped."""
        self.settle()
        devices = {}
        for name, d in self._devices.items():
            devices[name] = {
                "timing": encode([getattr(d, k) for k in _TIMING]),
                "recent": [encode(msgspec.to_builtins(s)) for s in d.recent],
                "rules": {r.name: {"detector": dump_attrs(r.detector), "gate": dump_attrs(r.gate),
                                   "off": r.update is _off} for r in d.rules},
            }
        return {
            "format": STATE_FORMAT, "version": STATE_VERSION, "run_id": self.run_id, "rules": list(self._active),
            "phases": [ph.name for ph in self._levels.phases],
            "levels": [[[p.warning, p.error] for p in ph.ordered] for ph in self._levels.phases],
            "params": self._shape(), "samples": self._n_samples, "seen": sorted(self._seen),
            "ignored": sorted(self._ignored), "peers": encode(self._ctx_peers), "devices": devices,
        }

    def load_state_dict(self, state: Mapping[str, Any], *, continue_clock: bool = True) -> None:
        """Carry on from `state_dict()`'s data: no new baseline period, and an alert firing when it was saved
        stays firing (it is not raised again as new). `continue_clock=False` for a restarted process: the
        time it was stopped is not a step, so step times and rates start afresh at the next step. A state
        that is damaged, from another msmon version or from another config is a `StateError` saying why;
        the Monitor is then unchanged."""
        _check_header(state, self._active, [ph.name for ph in self._levels.phases])
        shape, saved = self._shape(), state.get("params")
        if saved != shape:
            differ = [r for r in self._active if not isinstance(saved, dict) or saved.get(r) != shape[r]]
            raise StateError(f"msmon: the state was saved with other settings for {', '.join(differ) or 'the rules'} "
                             "(window sizes and the like shape what a rule has learned): resume with the same "
                             "monitor_config, or start without the state")
        try:
            devices = {name: self._load_device(name, saved, continue_clock)
                       for name, saved in dict(state["devices"]).items()}
            levels = [[[_level_value(v) for v in pair] for pair in row] for row in state["levels"]]
            peers = decode(state["peers"], "state.peers")
            seen, ignored, n = set(state["seen"]), set(state["ignored"]), int(state["samples"])
        except StateError:
            raise
        except (KeyError, TypeError, ValueError, msgspec.ValidationError) as e:
            raise StateError(f"msmon: damaged monitor state ({type(e).__name__}: {e})") from None
        if len(levels) != len(self._levels.phases) or any(len(r) != len(self._active) for r in levels):
            raise StateError("msmon: the saved levels do not match this config's phases and rules")
        for ph, row in zip(self._levels.phases, levels, strict=True):
            for p, (warning, error) in zip(ph.ordered, row, strict=True):
                p.warning, p.error = warning, error
        self._devices = devices
        self._ctx_peers.clear()
        self._ctx_peers.update(peers)
        self._seen, self._ignored, self._n_samples = seen, ignored, n
        log.info("msmon: run %s resumed from a saved state: %d device(s), %d samples learned", self.run_id,
                 len(devices), n)

    @property
    def last_step(self) -> int | None:
        """The newest step sampled on any device (as passed to `step()`); None before the first."""
        steps = [d.last_step for d in self._devices.values() if d.last_t is not None or d.last_step]
        return max(steps) if steps else None

    def _shape(self) -> dict[str, Any]:
        """Each active rule's settings but its levels (those are state: they change live), JSON-safe."""
        out = {}
        for name in self._active:
            p = self.config.alert.rules.get(name)
            out[name] = {f.name: encode(getattr(p, f.name)) for f in dataclasses.fields(p)
                         if f.name not in ("warning", "error", "levels")}
        return out

    def _load_device(self, name: str, saved: Mapping[str, Any], continue_clock: bool) -> _Device:
        where = f"state.devices[{name}]"
        d = self._build_device(name)  # not registered until every part has loaded
        timing = decode(saved["timing"], f"{where}.timing")
        if not isinstance(timing, list) or len(timing) != len(_TIMING):
            raise StateError(f"msmon: {where}.timing: expected {len(_TIMING)} values")
        for k, v in zip(_TIMING, timing, strict=True):
            setattr(d, k, v)
        if not continue_clock:
            d.prev_t = d.last_t = None
            d.max_dt = 0.0
        d.recent.extend(msgspec.convert(decode(s, f"{where}.recent"), Sample) for s in saved["recent"])
        rules = dict(saved["rules"])
        if set(rules) != {r.name for r in d.rules}:
            raise StateError(f"msmon: {where}: saved rules {sorted(rules)} are not this config's active rules")
        for r in d.rules:
            kept = rules[r.name]
            load_attrs(r.detector, kept["detector"], f"{where}.{r.name}")
            load_attrs(r.gate, kept["gate"], f"{where}.{r.name}.gate")
            if kept["off"]:
                r.update = _off
        return d

    def firing(self) -> list[tuple[str, str, Severity]]:
        """The alerts firing now, as (device, rule, severity): what a rewind closes, what marks a checkpoint."""
        return [(d.name, r.name, r.gate.firing) for d in self._devices.values() for r in d.rules
                if r.gate.firing is not None]

    def recent(self, device: str | None = None) -> list[Sample]:
        """The recent samples of `device` (None: the default one), oldest first: the chart's window."""
        d = self._devices.get(self.default_device if device is None else device)
        if d is None and device is None and self._devices:  # one device tracked for all (per_device_metrics off)
            d = next(iter(self._devices.values()))
        return list(d.recent) if d is not None else []

    @property
    def sample_count(self) -> int:
        """Samples taken so far, every device together."""
        return self._n_samples

    def now(self) -> float:
        """The Monitor's clock (wall time unless a test or a replay gave it another): what step times are taken on."""
        return self._clock()

    def levels_of(self, rule: str) -> list[tuple[str, RuleParams]]:
        """`rule`'s parameters in each phase, as (phase, parameters), the live levels included (a KeyError for a rule
        that is not active)."""
        return self._levels.of(rule)

    @property
    def gate(self) -> AlertGate:
        """The alert state machine every rule's findings go through (its settings: alert_interval and the like)."""
        return self._gate

    def whatif_samples(self) -> dict[str, list[Sample]]:
        """Each device's recent samples kept for judging a threshold change (`msmon.core.whatif`), oldest first."""
        return {name: dev.whatif.samples() for name, dev in list(self._devices.items())}

    def note_lr_change(self) -> None:
        """The LR was changed on purpose (scale_lr): the LR rule must not call the next move a bug."""
        for d in self._devices.values():
            for r in d.rules:
                expect = getattr(r.detector, "expect_change", None)
                if expect is not None:
                    expect()

    def hold_clock(self) -> None:
        """A pause on purpose begins (JobControl's `pause`): the time until `release_clock()` is not
        training, so it is left out of step times and throughput (no step_stall, no throughput drop)."""
        if self._held_at is None:
            self._held_at = self._clock()

    def release_clock(self) -> None:
        """The pause ends: every device's last step and last sample move on by the time held."""
        held, self._held_at = self._held_at, None
        if held is None:
            return
        span = self._clock() - held
        if span <= 0.0:
            return
        for d in self._devices.values():
            if d.prev_t is not None:
                d.prev_t += span
            if d.last_t is not None:
                d.last_t += span

    def flush(self) -> None:
        """Write out queued CSV / TensorBoard rows now."""
        if self._writer is not None:
            self._writer.flush()

    def close(self, ended: bool = True) -> None:
        """Flush and close the output files; `ended`: training ended normally (the bot is told, so it
        raises no job_gone). Safe to call twice."""
        if self._closed:
            return
        if self.enabled:
            self.settle()
        self._closed = True
        if self._writer is not None:
            self._writer.close()
        if self.transport is not None:
            self.transport.close(final=ended)

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(ended=exc[0] is None)


_LOG_LINE_AT = Monitor._sample.__code__.co_firstlineno
STATE_FORMAT = "msmon.monitor.state"
STATE_VERSION = 1
_TIMING = ("prev_t", "prev_step", "max_dt", "last_t", "last_step", "tokens", "samples", "acc_loss", "acc_n",
           "skipped")


def _check_header(state: Any, rules: list[str], phases: list[str]) -> None:
    """A `StateError` unless `state` is a monitor state of this version for these rules and phases."""
    if not isinstance(state, Mapping) or state.get("format") != STATE_FORMAT:
        raise StateError(f"msmon: not a monitor state (no format {STATE_FORMAT!r}): was it written by "
                         "Monitor.state_dict()?")
    if state.get("version") != STATE_VERSION:
        raise StateError(f"msmon: monitor state version {state.get('version')!r}, this msmon reads version "
                         f"{STATE_VERSION}: start without the state (the rules learn afresh)")
    if state.get("rules") != rules or state.get("phases") != phases:
        raise StateError(f"msmon: the state was saved with rules {state.get('rules')} and phases "
                         f"{state.get('phases')}, this config has {rules} and {phases}: resume with the same "
                         "monitor_config, or start without the state")


def _level_value(v: Any) -> float | None:
    if v is None or isinstance(v, (int, float)) and not isinstance(v, bool):
        return v
    raise StateError(f"msmon: a saved level is {v!r}, not a number or null")


def _off(s: Sample, p: RuleParams) -> Finding | None:
    """The update of a rule taken out after a crash."""
    return None


def _action_dict(a: ActionConfig) -> dict[str, object]:
    return a.params()


def _log_event(ev: Event) -> None:
    where = f"[run {ev.run_id} step {ev.step} device {ev.device}]"
    if ev.status is Status.RESOLVED:
        log.info("%s RESOLVED %s: %s", where, ev.rule, ev.message)
        return
    level = logging.ERROR if ev.severity is Severity.ERROR else logging.WARNING
    again = " (still firing)" if ev.repeat else ""
    acts = ""
    if ev.actions:
        acts = " Automatic actions: " + ", ".join(str(a["action"]) for a in ev.actions) + "."
    log.log(level, "%s %s %s%s: %s. %s%s", where, ev.severity.value, ev.rule, again, ev.message, ev.hint, acts)
