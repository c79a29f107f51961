"""What jobs send, taken in: the HTTP ingest (envelope.py, with the run's attempts in runs.py and the
shedding under overload in overload.py), the NATS JetStream consumer (nats.py), the watchdog that turns
silence into alerts (watchdog.py), and the deadlines that cut slow requests (deadlines.py)."""
