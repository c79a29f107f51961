"""The folder run_mindformer.py's --register_path names for msmon (notifier.mindformers.REGISTER_PATH)."""
