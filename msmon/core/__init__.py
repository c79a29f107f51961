"""The sans-I/O core: detectors, the alert gate, the rules' levels over a run's phases, trend fits and the
field specs the detectors declare their parameters with. Imports no YAML, clock, thread or file: only
`msmon.contract` and the pure stdlib."""
