"""msmon: chatops alerting for large-model training on MindSpore.

What runs where: `notifier/` in the training job, `bot/` in the service a team runs once, and here what
both share and what runs offline:

- `msmon.contract`: the wire Structs, the codec and the one job-action vocabulary (msgspec only);
- `msmon.core`: the sans-I/O detectors, alert gate, levels, trend and field specs (no YAML, clock, thread or file);
- `msmon.common`: small helpers job and bot share (safe file names, URL checks, Retry-After);
- `msmon.config`: the config framework (YAML with line numbers, the validator, ConfigError);
- `msmon.offline`: readers (MindFormers' logs in `mindformers.py`), replay, calibrate, backtest, plot (only the
  CLI and the demo import them);
- `msmon.cli`: the `msmon` command, one module per subcommand;
- `msmon.demo`: `msmon demo`.

Imports go down this list of layers only: cli, demo, offline, then bot and notifier (apart from each
other), config, then common and core (apart from each other), contract. pyproject.toml's import-linter
contracts check it (`make lint`); tests/project/test_layout.py checks what importing each part actually loads.
"""
