"""The sans-I/O core: detectors, the alert gate, trend fits. Imports no YAML, clock, thread or file."""
