"""Offline tools: readers, replay, calibrate, backtest, plot. Only the CLI and the demo import these."""
