"""Offline tools: readers, replay, calibrate, backtest, plot. Only the CLI imports these."""
