"""Issue 13 part 6: a live threshold change is judged on the run's last 600 samples, kept compact."""

from __future__ import annotations

import random

from msmon.core.whatif import WHATIF_SAMPLES, Recent
from notifier import Monitor
from notifier.levels_effect import change_levels
from tests.fakes.helpers import FakeClock, config


def test_the_what_if_window_is_the_last_600_samples_of_each_device():
    rng = random.Random(2)
    mon = Monitor(config(alert={"baseline_steps": 0, "grad_norm_threshold": 10.0}), "w", sinks=[],
                  clock=FakeClock())
    for step in range(1, 1001):
        # grad norm 6 at steps 450-451: over the WARNING 5 of the level 10, under the 7.5 of 15; 550 steps ago,
        # outside the chart's 120 samples, inside the what-if's 600
        g = 6.0 if step in (450, 451) else 1.0 + rng.random()
        mon.step(step, loss=2.0, grad_norm=g)
    _, said = change_levels(mon, 1000, "grad_norm", lambda: mon.set_threshold("grad_norm", 15.0, "error"),
                            "set_threshold")
    assert said == (f"over the last {WHATIF_SAMPLES} samples (steps 401-1,000): 0 alerts at 7.5 / 15 instead of "
                    "1 alert at 5 / 10")


def test_the_ring_keeps_bare_numbers_and_is_bounded():
    mon = Monitor(config(), "w", sinks=[], clock=FakeClock())
    for step in range(1, 2001):
        mon.step(step, loss=2.0)
    ring = mon._devices["0"].whatif
    assert isinstance(ring, Recent) and len(ring) == WHATIF_SAMPLES
    assert all(type(t) is tuple for t in ring.ring) and not any(isinstance(v, str) for v in ring.ring[0])
    back = ring.samples()
    assert [s.step for s in back[:2]] == [1401, 1402] and back[0].run_id == "w" and back[0].loss == 2.0
