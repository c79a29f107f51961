"""The alerts' stored state, kept in memory in front of SQLite.

Ingest (bot/ingest/envelope.py) is the only writer of alert rows, so a write-through copy of each fingerprint's row
(what was sent for it, its severity and status) stays exact and saves a query per event. A
suppressed repeat that changes neither severity nor status only moves the row's last step: those
touches are held here and written in one statement by `flush()` (the app calls it every second and
before any read of the alerts), instead of one upsert per event of a storm.

Changes are staged during a transaction and applied when it commits (`commit()`), or dropped with
it (`discard()`), so a rolled-back envelope leaves the copy as it was. Bounded: past `max_entries`
the least recently used entries are forgotten (and read back from SQLite when needed).

On a shared store (PostgreSQL, several replicas: `store.shared`) another replica writes alert rows
too, so memory never decides: `get` reads the rows in the envelope's transaction, after the ingest
took the run's lock (`store.lock_run`), and only the current transaction's staged changes are kept.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from bot.pipeline.flow import NEVER, NotifyState
from bot.store.sqlite import Store


class Entry:
    __slots__ = ("notify", "severity", "status", "acked")

    def __init__(self, notify: NotifyState, severity: str | None, status: str | None, acked: bool = False) -> None:
        self.notify, self.severity, self.status, self.acked = notify, severity, status, acked


class AlertIndex:
    def __init__(self, store: Store, max_entries: int = 100_000) -> None:
        self.store, self.max_entries = store, max_entries
        self.shared = store.shared  # other writers: read every row from the store, keep nothing
        self.entries: OrderedDict[str, Entry] = OrderedDict()
        self.staged: dict[str, Entry] = {}
        self.touches: dict[str, tuple[int, float]] = {}  # fingerprint -> (last step, time): not yet written

    def get(self, fps: Iterable[str]) -> dict[str, Entry]:
        """The entry of every fingerprint that has a row (staged changes first, then memory, then SQLite)."""
        out: dict[str, Entry] = {}
        missing: list[str] = []
        for fp in fps:
            e = self.staged.get(fp) or (None if self.shared else self.entries.get(fp))
            if e is None:
                missing.append(fp)
            else:
                out[fp] = e
        if missing:
            for fp, (notify, severity, status, acked) in self.store.alert_states(missing).items():
                out[fp] = Entry(notify, severity, status, acked)
                if self.shared:
                    self.staged[fp] = out[fp]  # this transaction's view (dropped at its end)
                else:
                    self.entries[fp] = out[fp]
            self._trim()
        return out

    def stage(self, fp: str, notify: NotifyState | None, severity: str, status: str) -> Entry:
        """A row written in the current transaction (`notify` None: what was sent is unchanged); its new entry."""
        old = self.staged.get(fp) or self.entries.get(fp)
        self.touches.pop(fp, None)  # the row's own write carries a newer step
        acked = old is not None and old.acked and old.status != "resolved" and status != "resolved"
        e = self.staged[fp] = Entry(notify or (old.notify if old else NEVER), severity, status, acked)
        return e

    def acked(self, fps: Iterable[str]) -> None:
        """Someone acknowledged these alerts (already written to SQLite)."""
        for fp in fps:
            e = self.entries.get(fp)
            if e is not None:
                e.acked = True

    def touch(self, fp: str, step: int, now: float) -> None:
        self.touches[fp] = (step, now)

    def commit(self) -> None:
        if self.shared:
            self.staged.clear()
            return
        for fp, e in self.staged.items():
            self.entries[fp] = e
            self.entries.move_to_end(fp)
        self.staged.clear()
        self._trim()

    def discard(self) -> None:
        self.staged.clear()

    def flush(self) -> int:
        """Write the held touches (call inside a transaction); how many rows."""
        if not self.touches:
            return 0
        rows = [(step, t, fp) for fp, (step, t) in self.touches.items()]
        self.touches.clear()
        self.store.touch_alerts(rows)
        return len(rows)

    def _trim(self) -> None:
        while len(self.entries) > self.max_entries:
            self.entries.popitem(last=False)
