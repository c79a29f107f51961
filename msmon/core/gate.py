"""The alert state machine for one rule on one device: pure, fed one verdict per sample.

It turns a detector's per-sample verdicts into events: N in a row before alerting, nothing
during an explicit baseline period (`baseline_steps`, default 0) but NaN/Inf and findings against
absolute levels (a user's threshold, a gross jump), a rise from WARNING to ERROR always passes,
`alert_interval` steps between the reminders of one episode (never between two episodes: a new
episode always goes out), and a RESOLVED event once the rule has been clear for `resolve_after` samples.
"""

from __future__ import annotations

from msmon.contract.wire import Severity, Status
from msmon.core.detectors.base import SKIP, Finding


class GateState:
    __slots__ = ("n_warn", "n_err", "clear", "firing", "emitted", "last_emit")

    def __init__(self) -> None:
        self.n_warn = 0  # samples in a row at WARNING or above
        self.n_err = 0  # samples in a row at ERROR
        self.clear = 0  # clear samples in a row while firing
        self.firing: Severity | None = None
        self.emitted = False  # whether this firing episode produced an event
        self.last_emit: dict[Severity, int] = {}


class Verdict:
    __slots__ = ("severity", "status", "repeat")

    def __init__(self, severity: Severity, status: Status, repeat: bool = False) -> None:
        self.severity = severity
        self.status = status
        self.repeat = repeat

    def __repr__(self) -> str:
        return f"Verdict({self.severity.value}, {self.status.value}, repeat={self.repeat})"


class AlertGate:
    def __init__(self, alert_interval: int, baseline_steps: int, resolve_after: int) -> None:
        self.alert_interval = alert_interval
        self.baseline_steps = baseline_steps
        self.resolve_after = resolve_after

    def admit(
        self, st: GateState, f: Finding | None, step: int, consecutive: int, immediate: bool = False
    ) -> Verdict | None:
        """Update `st` with one sample's finding; the event to emit, if any.

        `immediate` (NaN/Inf) skips the consecutive count and the baseline period. A `SKIP`
        finding (nothing to judge in this sample) leaves the state as it is.
        """
        if f is SKIP:
            return None
        if f is None or f.level is None:
            st.n_warn = st.n_err = 0
            if st.firing is None:
                return None
            st.clear += 1
            if st.clear < self.resolve_after:
                return None
            sev, emitted = st.firing, st.emitted
            st.firing, st.emitted, st.clear = None, False, 0
            return Verdict(sev, Status.RESOLVED) if emitted else None
        st.clear = 0
        st.n_warn += 1
        st.n_err = st.n_err + 1 if f.level is Severity.ERROR else 0
        need = 1 if immediate else consecutive
        if st.n_err >= need:
            level = Severity.ERROR
        elif st.n_warn >= need:
            level = Severity.WARNING
        else:
            return None
        if step < self.baseline_steps and not immediate and not f.absolute:
            return None
        interval = self.alert_interval
        if st.firing is None or level.rank > st.firing.rank or f.new:
            # A new episode (the last one resolved), a rise, or a finding of its own inside the episode (`new`):
            # always sent. alert_interval spaces the reminders of one episode; it never hides a new one.
            if st.firing is None or level.rank > st.firing.rank:
                st.firing = level
            st.last_emit[level] = step
            st.emitted = True
            return Verdict(level, Status.FIRING)
        sev = st.firing
        last = st.last_emit.get(sev)
        if interval > 0 and (last is None or step - last >= interval):
            st.last_emit[sev] = step
            repeat = st.emitted
            st.emitted = True
            return Verdict(sev, Status.FIRING, repeat=repeat)
        return None
