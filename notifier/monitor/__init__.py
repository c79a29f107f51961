"""The Monitor, by the flow of one step: `Monitor` (monitor.py) times the step and decides whether it is sampled;
sampling.py makes a sampled step a `Sample` and sends it out (files, log line, bot); rules.py runs it through each
device's detectors and the alert gate and makes the `Event`s; device.py is what is kept per device, state.py the
`state_dict` saved with a checkpoint, describe.py the start-up summary."""

from .describe import describe
from .device import WINDOW_SAMPLES
from .monitor import STATE_FORMAT, STATE_VERSION, Monitor

__all__ = ["STATE_FORMAT", "STATE_VERSION", "WINDOW_SAMPLES", "Monitor", "describe"]
