"""How many devices (ranks) one run may report from: each costs the bot memory (its metric ring of
bot.window_samples samples, about 44 KB at 600; its place in the run's row and rank view), so one job
token cannot grow the bot without bound by inventing devices. A device past `bot.max_devices` is refused
(HTTP 422, a NATS message dropped as poison) with what to do; the devices a run already has go on.

Pure and bounded: the devices of the `max_runs` most recently seen runs are kept here, a run not here is
read back from the store."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable

from msmon.common.text import CONTROL_LINE, one_line


def id_problem(field: str, value: str) -> str | None:
    """Why a job's id (`field`: run_id, device, rule) cannot be kept: a control character in it (a newline would
    write its own line into `status` and the logs); None when it can."""
    if CONTROL_LINE.search(value):
        return (f"{field} {one_line(value[:80])!r} has a control character (a newline would write its own line "
                f"into status and logs): name it with printable characters")
    return None


class TooManyDevices(ValueError):
    """A device the run may not add; the message is the whole answer."""


class DeviceGate:
    def __init__(self, limit: int, max_runs: int, stored: Callable[[str], Iterable[str]]) -> None:
        self.limit, self.max_runs, self.stored = limit, max_runs, stored
        self._runs: OrderedDict[str, set[str]] = OrderedDict()

    def admit(self, run_id: str, device: str) -> None:
        """Nothing for a device the run has or may add (now remembered); TooManyDevices otherwise."""
        devices = self._runs.get(run_id)
        if devices is None:
            devices = self._runs[run_id] = set(self.stored(run_id))
            while len(self._runs) > self.max_runs:
                self._runs.popitem(last=False)
        else:
            self._runs.move_to_end(run_id)
        if device in devices:
            return
        problem = id_problem("device", device)
        if problem is not None:
            raise TooManyDevices(problem)
        if len(devices) >= self.limit:
            raise TooManyDevices(f"run {run_id[:80]!r} already reports from {len(devices):,} devices, the most one run "
                                 f"may (bot.max_devices); device {device[:80]!r} is refused. Let fewer ranks report, "
                                 "or raise bot.max_devices")
        devices.add(device)
