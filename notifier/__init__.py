"""msmon notifier: runs inside the training job. Light on imports: pyyaml and msgspec only."""

from .config import ConfigError, MonitorConfig, load_config
from .monitor import Monitor
from .wire import Event, Sample, Severity, Status

__all__ = ["ConfigError", "Event", "Monitor", "MonitorConfig", "Sample", "Severity", "Status", "load_config"]
__version__ = "0.1.0"
