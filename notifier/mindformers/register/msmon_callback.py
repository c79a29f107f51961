"""Loaded by MindFormers' `auto_register: msmon_callback.MsmonCallback` from the folder run_mindformer.py's
--register_path names (notifier.mindformers.REGISTER_PATH, or a copy of this file in a folder of your own)."""

from notifier.mindformers import MsmonCallback

__all__ = ["MsmonCallback"]
