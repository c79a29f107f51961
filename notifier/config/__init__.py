"""monitor_config: schema, loading (with !include), MindFormers' own monitor keys taken beside msmon's
(`mindformers.py`), and errors that say what to fix."""

from msmon.config.errors import ConfigError, Issue

from .loader import load_config
from .model import ALL_METRICS, ActionConfig, AlertConfig, MonitorConfig, PhaseConfig, RulesConfig

__all__ = [
    "ALL_METRICS",
    "ActionConfig",
    "AlertConfig",
    "ConfigError",
    "Issue",
    "MonitorConfig",
    "PhaseConfig",
    "RulesConfig",
    "load_config",
]
