"""`Monitor`: framework-neutral. Feed it one step at a time; it samples, detects, alerts and logs.

    mon = Monitor.from_config("train.yaml", run_id="run-42")
    for step in ...:
        events = mon.step(step, loss=..., lr=..., grad_norm=..., tokens=...)
    mon.close()

Every call is cheap: a step that is not sampled costs a clock read and two modulo operations.
Detection is pure code (see `detectors/` and `gate.py`); files are written off-thread.

The Monitor composes the parts: `step()` times every step and decides which are sampled (inline: the hot
path), sampling.py makes a sampled step a `Sample` and gives it to the outputs, rules.py
runs a device's rules on it and makes the events, device.py is what is kept per device and
state.py saves and loads it (`state_dict`).
"""

from __future__ import annotations

import logging
import os
import sys
import time as _time
from collections.abc import Callable, Mapping
from typing import Any

from msmon.contract.subjects import is_nats_url
from msmon.contract.wire import MAX_ID, Event, Sample, Severity
from msmon.core.detectors import RuleParams
from msmon.core.gate import AlertGate

from ..config import MonitorConfig, load_config
from ..outputs import BackgroundWriter, CsvSink, Sink
from ..outputs.logline import LineRecords
from ..transport import BotTransport
from ..world import World, detect, refuse_lone_actions
from . import state as monitor_state
from .describe import describe
from .device import WINDOW_SAMPLES, Device
from .rules import NO_EVENTS, Rules, known_rule
from .sampling import Sampler

__all__ = ["STATE_FORMAT", "STATE_VERSION", "WINDOW_SAMPLES", "Monitor", "describe"]

log = logging.getLogger("msmon")

STATE_FORMAT, STATE_VERSION = monitor_state.STATE_FORMAT, monitor_state.STATE_VERSION
_STEP_LINE = 0  # the line of Monitor.step the step's log line is reported from (set below the class)


def _ensure_visible_logging() -> None:
    """If the program configured no logging at all, msmon's own lines would vanish: print them."""
    if not log.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s msmon %(levelname)s %(message)s"))
        log.addHandler(handler)
        if log.level == logging.NOTSET:
            log.setLevel(logging.INFO)


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
        self._per_device = cfg.per_device_metrics
        self._rules = Rules(cfg, set(cfg.metrics), self.run_id)
        self._levels = self._rules.levels
        self._ctx_peers: dict[str, float] = {}
        self._job_steps: int | None = None  # plan(): the steps the job says it will run, where none is declared
        self._devices: dict[str, Device] = {}
        self._ignored: set[str] = set()
        self._sampler = Sampler(cfg, self.run_id, self._devices, self._rules,
                                LineRecords(log, __file__, _STEP_LINE, "step"))
        self._closed = False
        self._held_at: float | None = None  # hold_clock(): when a pause on purpose began
        _ensure_visible_logging()
        self._writer: BackgroundWriter | None = None
        self.transport: BotTransport | None = None
        if not self.enabled:
            log.info("msmon: monitoring is off for run %s (monitor_config.monitor_on is %s); set "
                     "monitor_on: true to enable it", self.run_id,
                     "not set and defaults to false" if cfg.given is not None and "monitor_on" not in cfg.given
                     else "false")
            return
        self._start(cfg, sinks, transport)

    @classmethod
    def from_config(
        cls, source: MonitorConfig | Mapping[str, Any] | str | os.PathLike[str], run_id: str = "run", **kw: Any
    ) -> Monitor:
        return cls(source, run_id, **kw)

    # -- set-up -----------------------------------------------------------------------------

    def _start(self, cfg: MonitorConfig, sinks: list[Sink] | None, transport: BotTransport | None) -> None:
        """Monitoring is on: the outputs and the transport started, what will be monitored logged."""
        # before any thread starts: a multi-rank run never applies a configured action on one rank alone
        refuse_lone_actions([(f"monitor_config.actions[{i}].action", a.action) for i, a in enumerate(cfg.actions)],
                            self.world, "given" if transport is not None else cfg.bot.url, cfg.bot.commands)
        if sinks is None:
            sinks = self._default_sinks(cfg)
        if sinks:
            self._writer = self._sampler.writer = BackgroundWriter(sinks)
        self.transport = transport if transport is not None else self._default_transport(cfg)
        self._sampler.transport = self._rules.transport = self.transport
        if self.transport is not None:
            self.transport.plan(cfg.training.total_steps, cfg.training.target_loss)
        for line in describe(cfg, self.run_id):
            log.info("msmon: %s", line)
        if self.world.multi and cfg.actions:
            log.info("msmon: %s: the actions above are asked of the bot, which has every rank of run %s apply them "
                     "at the same step", self.world.describe(), self.run_id)

    def _default_sinks(self, cfg: MonitorConfig) -> list[Sink]:
        sinks: list[Sink] = []
        if cfg.csv.enable:
            sinks.append(CsvSink(cfg.csv.path, self.run_id))
        if cfg.tensorboard.enable:
            from ..outputs.tensorboard_sink import TensorBoardSink  # tensorboardX only when asked for

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
            from ..nats_transport import NatsBackend

            backend = NatsBackend(b.url, b.project, self.run_id, self.default_device, token, prefix=b.nats_prefix)
        return BotTransport(b.url, self.run_id, self.default_device, token, project=b.project, labels=b.labels,
                            backend=backend, spool_dir=b.spool_dir, spool_max_bytes=int(b.spool_max_mb * (1 << 20)),
                            heartbeat_interval=b.heartbeat_interval, rank=self.world.rank, host=self.world.host,
                            world=self.world.size if self.world.multi else None)

    def _device(self, name: str) -> Device | None:
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

    def _build_device(self, name: str) -> Device:
        """A device's fresh rules (not yet registered)."""
        return self._rules.device(name, self._job_steps, self._ctx_peers)

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

    def step(self, step: int, *, loss: float | None = None, lr: float | None = None, grad_norm: float | None = None,
             samples: float | None = None, tokens: float | None = None, throughput: float | None = None,
             time: float | None = None, device: str | int | None = None, local_grad_norm: float | None = None,
             data_time: float | None = None, overflow: bool | None = None, loss_scale: float | None = None,
             ) -> list[Event]:
        """Report one finished step; returns the events it raised (usually none).

        Call it on every step: non-sampled steps only time the step (unless a loss or grad norm given for them is
        NaN/Inf: that is sampled, and alerts, at once). `samples` / `tokens` are counts for this step (throughput is
        derived); `throughput=` is an already measured tokens/s; `time=` a timestamp (for replays); `device` labels
        per-device metrics; `local_grad_norm` this rank's own grad norm before the all-reduce (data parallel;
        `grad_norm` is then the reduced gradient's), reported as is (the bot compares it across ranks); `data_time`
        the seconds this step waited for its input (from the previous step's end to this one's begin, measured on
        the host: a custom loop times its `next(batch)`; MonitorCallback does it), reported as its mean per step over
        the sample's span, `Sample.data_time` (the bot's straggler rule compares it across ranks: in lockstep data
        parallel the step time is every rank's, the input wait is its own). `overflow` / `loss_scale`: fp16 dynamic
        loss scaling, whether this step overflowed (its update skipped: a skipped step is counted, not alerted on;
        its grad norm, Inf or NaN, is not a measurement) and the scale it ran with; give them on every step where
        they are free to read (the rule `loss_scale` pages when every step overflows). A NaN or Inf loss is an ERROR
        whatever `overflow` says."""
        if not self.enabled:
            return NO_EVENTS
        now = self._clock() if time is None else time
        dev = self._devices.get(self.default_device if device is None else str(device))
        if dev is None and (dev := self._device(self.default_device if device is None else str(device))) is None:
            return NO_EVENTS  # per_device_metrics is off and another device is the one monitored
        if dev.infer is not None:
            return self._sampler.infer(dev, (step, now, loss, lr, grad_norm, samples, tokens, throughput,
                                             local_grad_norm, data_time, overflow, loss_scale), self.step)
        prev = dev.prev_t
        if prev is not None:
            ds = step - dev.prev_step  # > 1 when a call covers several steps (dataset sink mode)
            dt = (now - prev) / ds if ds > 1 else now - prev
            if dt > dev.max_dt:
                dev.max_dt = dt
        dev.prev_t, dev.prev_step = now, step
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
        accum = dev.accum
        if accum > 1:
            opt, micro = divmod(step + dev.shift, accum)
            if (opt % si and (not li or opt % li) and (loss is None or loss - loss == 0.0)
                    and (grad_norm is None or overflow or grad_norm - grad_norm == 0.0)):
                return NO_EVENTS  # a micro-step of an optimizer step that is not sampled
            return self._sampler.micro_step(dev, opt, micro == accum - 1, step, now, loss, lr, grad_norm, throughput,
                                            time is not None, local_grad_norm, overflow, loss_scale)
        if (step % si and (not li or step % li)  # not sampled; but a NaN/Inf handed in is, at once, not 9 steps later
                and (loss is None or loss - loss == 0.0)
                and (grad_norm is None or overflow or grad_norm - grad_norm == 0.0)):  # a skipped step's is no NaN
            return NO_EVENTS
        return self._sampler.sample(dev, step, step, now, loss, lr, grad_norm, throughput, time is not None,
                                    local_grad_norm, overflow, loss_scale)

    def settle(self) -> list[Event]:
        """Rows still held while their device's accumulation is inferred (a log shorter than the inference needs)
        go through the rules now, read as the rows so far show; their events. `close()` and `state_dict()` do it."""
        return self._sampler.settle(self.step)

    def samples(self, step: int) -> bool:
        """Whether `step` will be sampled (so a caller can skip reading metrics on the others)."""
        if not self.enabled:
            return False
        accum = self._accum
        if accum is not None and accum > 1:
            step //= accum
        return not (step % self._si and (not self._li or step % self._li))

    # -- level changes --------------------------------------------------------------------------

    def acknowledge(self, rule: str, device: str | None = None) -> str:
        """A person acknowledged `rule`'s alert (chat `ack`): on each device (or the one named) a shift the rule
        holds against its pre-shift reference is accepted as the new normal, so the alert resolves once the rule
        has learned it. What was done, in words."""
        return self._rules.acknowledge(self._devices, rule, device)

    def set_threshold(self, rule: str, value: float, level: str = "warning") -> float | None:
        """Change a rule's WARNING or ERROR level live, in every phase; returns the old level."""
        old = self._levels.set(known_rule(rule), value, level)
        log.info("msmon: run %s: %s %s level set to %g (was %s)", self.run_id, rule, level, value, old)
        return old

    def loosen(self, rule: str, *, value: float | None = None, factor: float | None = None) -> tuple[str, Any]:
        """Scale a rule's levels live, in every phase: by `factor`, or so that its main level (WARNING if
        set, else ERROR) becomes `value`; the other level moves in proportion. Returns a description
        and an opaque `undo` for `restore()`."""
        desc, undo = self._levels.loosen(known_rule(rule), value=value, factor=factor)
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
        return monitor_state.save(self.run_id, self._rules, self._devices, self._sampler.count, self._sampler.seen,
                                  self._ignored, self._ctx_peers)

    def load_state_dict(self, state: Mapping[str, Any], *, continue_clock: bool = True) -> None:
        """Carry on from `state_dict()`'s data: no new baseline period, and an alert firing when it was saved
        stays firing (it is not raised again as new). `continue_clock=False` for a restarted process: the
        time it was stopped is not a step, so step times and rates start afresh at the next step. A state
        that is damaged, from another msmon version or from another config is a `StateError` saying why;
        the Monitor is then unchanged."""
        loaded = monitor_state.load(state, self._rules, self._build_device, continue_clock)
        monitor_state.apply_levels(self._rules, loaded.levels)
        self._devices.clear()  # the one dict the sampler shares
        self._devices.update(loaded.devices)
        self._ctx_peers.clear()
        self._ctx_peers.update(loaded.peers)
        self._sampler.seen, self._ignored, self._sampler.count = loaded.seen, loaded.ignored, loaded.samples
        log.info("msmon: run %s resumed from a saved state: %d device(s), %d samples learned", self.run_id,
                 len(loaded.devices), loaded.samples)

    # -- what the Monitor knows ---------------------------------------------------------------

    @property
    def last_step(self) -> int | None:
        """The newest step sampled on any device (as passed to `step()`); None before the first."""
        steps = [d.last_step for d in self._devices.values() if d.last_t is not None or d.last_step]
        return max(steps) if steps else None

    def firing(self) -> list[tuple[str, str, Severity]]:
        """The alerts firing now, as (device, rule, severity): what a rewind closes, what marks a checkpoint."""
        return self._rules.firing(self._devices.values())

    def recent(self, device: str | None = None) -> list[Sample]:
        """The recent samples of `device` (None: the default one), oldest first: the chart's window."""
        d = self._devices.get(self.default_device if device is None else device)
        if d is None and device is None and self._devices:  # one device tracked for all (per_device_metrics off)
            d = next(iter(self._devices.values()))
        return list(d.recent) if d is not None else []

    @property
    def sample_count(self) -> int:
        """Samples taken so far, every device together."""
        return self._sampler.count

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
        return self._rules.gate

    def whatif_samples(self) -> dict[str, list[Sample]]:
        """Each device's recent samples kept for judging a threshold change (`msmon.core.whatif`), oldest first."""
        return {name: dev.whatif.samples() for name, dev in list(self._devices.items())}

    def note_lr_change(self) -> None:
        """The LR was changed on purpose (scale_lr): the LR rule must not call the next move a bug."""
        self._rules.note_lr_change(self._devices.values())

    # -- pauses and the end ---------------------------------------------------------------------

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


_STEP_LINE = Monitor.step.__code__.co_firstlineno
