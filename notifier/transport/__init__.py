"""Job -> bot transport, by the flow: `BotTransport` (transport.py) is the façade the Monitor and job control call,
which builds the parts: the sender (sender.py: the training thread's inbox, the queue under its lock, the thread that
sends envelopes), the spool on disk (spool.py), the heartbeat, the one owner of what a heartbeat says (heartbeat.py),
the command long-poll (poller.py), the configured-action requests (asks.py), every request's one way to the bot
(link.py, over notifier/http.py or a `Backend` such as notifier/nats_transport.py) and the bounded timings
(timing.py). What is sent when is the pure queue's decision (notifier/sendq/)."""

from .transport import (
    SPOOL_MAX_AGE,
    Backend,
    BotTransport,
    Reply,
    Spool,
    SpoolRecord,
    batch_key,
    check_url,
    envelope_body,
)

__all__ = ["SPOOL_MAX_AGE", "Backend", "BotTransport", "Reply", "Spool", "SpoolRecord", "batch_key", "check_url",
           "envelope_body"]
