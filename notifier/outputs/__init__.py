"""Where samples go besides the detectors: log lines, CSV, TensorBoard (the last two off-thread)."""

from .csv_sink import CSV_COLUMNS, CsvSink
from .logline import format_log_line
from .writer import BackgroundWriter, Sink

__all__ = ["CSV_COLUMNS", "BackgroundWriter", "CsvSink", "Sink", "format_log_line"]
