"""Backtest: score a config on labelled traces (engine, sources, report)."""
