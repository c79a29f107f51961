"""A run's rules: each sample through a device's detectors and the alert gate, what gets through made an `Event`.

`Rules` holds what every device shares (the active rules, their levels per phase, the alert gate, the
configured actions) and builds each device's own rules (device.py). `judge` is on the hot
path: it runs for every sample. A rule whose detector raises is taken out for that device alone.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable

from msmon.contract.wire import Event, Sample, Severity, Status, Window
from msmon.core.detectors import RULES, DetectorContext, Finding
from msmon.core.detectors.base import SKIP
from msmon.core.gate import AlertGate, Verdict
from msmon.core.levels import Levels, PhaseSpec

from ..config import MonitorConfig
from ..config.model import ActionConfig
from ..transport import BotTransport
from .device import Device, Rule, rule_off

log = logging.getLogger("msmon")

NO_EVENTS: list[Event] = []  # what a call that raised nothing returns (the one list, never changed)


def active_rules(cfg: MonitorConfig, metrics: set[str]) -> list[str]:
    """The rules enabled in some phase whose metrics are all reported, in RULES' order."""
    active = []
    for name, (_, det_cls) in RULES.items():
        params = cfg.alert.rules.get(name)
        enabled_somewhere = params.enable or any(p.rules.get(name, {}).get("enable") for p in cfg.alert.phases)
        if enabled_somewhere and det_cls.requires <= metrics:
            active.append(name)
    return active


def known_rule(rule: str) -> str:
    """`rule`, or a ValueError naming the closest rule there is."""
    if rule not in RULES:
        from msmon.config.errors import closest

        hint = closest(rule, RULES)
        raise ValueError(f"unknown rule {rule!r}" + (f"; did you mean {hint}?" if hint else ""))
    return rule


class Rules:
    """The run's active rules, their levels per phase and the alert gate: judges each device's samples."""

    def __init__(self, cfg: MonitorConfig, metrics: set[str], run_id: str) -> None:
        self.config = cfg
        self.run_id = run_id
        self.gate = AlertGate(cfg.alert.alert_interval, cfg.alert.baseline_steps, cfg.alert.resolve_after)
        self.levels = Levels({name: cfg.alert.rules.get(name) for name in RULES},
                             [PhaseSpec(p.name, p.start_step, p.end_step, p.rules) for p in cfg.alert.phases])
        self._phase = self.levels.at(0)
        self.active = active_rules(cfg, metrics)
        self.levels.order(self.active)
        self.transport: BotTransport | None = None  # where events go besides the log (the Monitor sets it)

    def device(self, name: str, job_steps: int | None, peers: dict[str, float]) -> Device:
        """A device's fresh rules (not yet registered)."""
        cfg = self.config
        ctx = DetectorContext(device=name, total_steps=cfg.training.total_steps, job_steps=job_steps,
                              warmup_steps=cfg.training.warmup_steps, target_loss=cfg.training.target_loss,
                              peers=peers)
        rules = [Rule(n, RULES[n][1](cfg.alert.rules.get(n), ctx)) for n in self.active]
        dev = Device(name, rules, ctx, cfg.training.grad_accumulation_steps)
        ctx.recent = dev.recent  # a rule may read the device's recent samples (grad_norm_creep's losses)
        return dev

    def judge(self, dev: Device, sample: Sample) -> list[Event]:
        """`sample` through `dev`'s rules with the levels of the phase in force; the events raised (usually none)."""
        step = sample.step
        phase = self._phase
        if not phase.start <= step < phase.end:
            phase = self._phase = self.levels.at(step)
        events: list[Event] | None = None
        gate = self.gate
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
        return events if events is not None else NO_EVENTS

    def _disable(self, d: Device, r: Rule, step: int) -> None:
        """Take a crashed rule out (for this device only): training and the other rules go on."""
        log.exception("msmon: rule %s failed at step %d on device %s of run %s and is now off for this device; "
                      "training and the other rules continue. Please report this with the traceback.",
                      r.name, step, d.name, self.run_id)
        r.update = rule_off

    def _event(self, d: Device, s: Sample, r: Rule, f: Finding | None, v: Verdict, phase: str) -> Event:
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

    def log_notices(self, devices: Iterable[Device]) -> None:
        """Log each rule's one-off notice from its first sample (grad_norm out of scale), once."""
        for d in devices:
            for r in d.rules:
                note = getattr(r.detector, "notice", None)
                if note:
                    r.detector.notice = None
                    log.warning("msmon: run %s device %s: %s", self.run_id, d.name, note)

    @staticmethod
    def firing(devices: Iterable[Device]) -> list[tuple[str, str, Severity]]:
        """The alerts firing now on `devices`, as (device, rule, severity)."""
        return [(d.name, r.name, r.gate.firing) for d in devices for r in d.rules if r.gate.firing is not None]

    @staticmethod
    def note_lr_change(devices: Iterable[Device]) -> None:
        """The LR was changed on purpose: each rule that judges LR moves expects the next one."""
        for d in devices:
            for r in d.rules:
                expect = getattr(r.detector, "expect_change", None)
                if expect is not None:
                    expect()

    def acknowledge(self, devices: dict[str, Device], rule: str, device: str | None = None) -> str:
        """A person acknowledged `rule`'s alert (chat `ack`): on each device (or the one named) a shift the rule
        holds against its pre-shift reference is accepted as the new normal, so the alert resolves once the rule
        has learned it. What was done, in words."""
        known_rule(rule)
        accepted, seen = [], []
        for name, d in list(devices.items()):
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
