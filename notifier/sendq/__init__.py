"""The job's send queue, pure (no threads, sockets, files or clock): `SendQueue` (queue.py) decides what waits, what
goes in the next batch, what an answer does and what a full queue drops; entries.py is what it holds and hands out
(items, their drop class and tier, entries, batches, outcomes, limits), faults.py what went wrong with one request
as the job can tell. The transport (notifier/transport/) carries its decisions out."""

from .entries import FRAMING, Batch, Entry, Item, Limits, Outcome, Tier, classify
from .faults import Fault, judge
from .queue import SendQueue

__all__ = ["FRAMING", "Batch", "Entry", "Fault", "Item", "Limits", "Outcome", "SendQueue", "Tier", "classify", "judge"]
