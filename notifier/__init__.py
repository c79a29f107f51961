"""msmon notifier: runs inside the training job. Light on imports: pyyaml and msgspec only.

The names below load on first use (PEP 562), so importing a submodule alone (the bot imports
`msmon.contract.wire`) does not load the Monitor, the config loader with YAML, or the transport and
its threads.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from msmon.contract.wire import Event, Sample, Severity, Status

    from .config import ConfigError, MonitorConfig, load_config
    from .control import JobControl
    from .monitor import Monitor

_WHERE = {"ConfigError": ".config", "MonitorConfig": ".config", "load_config": ".config", "Monitor": ".monitor",
          "JobControl": ".control",
          "Event": "msmon.contract.wire", "Sample": "msmon.contract.wire", "Severity": "msmon.contract.wire",
          "Status": "msmon.contract.wire"}

__all__ = ["ConfigError", "Event", "JobControl", "Monitor", "MonitorConfig", "Sample", "Severity", "Status",
           "load_config"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'notifier' has no attribute {name!r}")
    value = getattr(importlib.import_module(where, __name__), name)
    globals()[name] = value  # once: later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])
