"""The spool: what the bot has not taken yet, on disk, one JSONL file per run and device.

One `SpoolRecord` a line through the wire codec; the sender rewrites the file whole and atomically from
the queue's snapshot while the bot is down and at close, and a job that starts with the same run id and
device sends what it holds first. Dead letters (what the bot refuses on its own) go beside it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable

import msgspec

from msmon.common.safenames import inside, slug
from msmon.contract.wire import ActionResult, Event, Sample, decode, encode

from ..sendq.entries import Entry, Item

log = logging.getLogger("msmon")


class SpoolRecord(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One line of the spool: exactly one of the three kinds of item."""

    event: Event | None = None
    sample: Sample | None = None
    action: ActionResult | None = None

    @classmethod
    def of(cls, item: Item) -> SpoolRecord:
        if isinstance(item, Event):
            return cls(event=item)
        if isinstance(item, Sample):
            return cls(sample=item)
        return cls(action=item)

    @property
    def item(self) -> Item | None:
        return self.event or self.sample or self.action

    @staticmethod
    def line(item: Item, data: bytes) -> bytes:
        """`encode(SpoolRecord.of(item))` for an item already encoded as `data`, without encoding it again."""
        if isinstance(item, Event):
            return b'{"event":' + data + b"}"
        if isinstance(item, Sample):
            return b'{"sample":' + data + b"}"
        return b'{"action":' + data + b"}"


def entry_line(entry: Entry) -> bytes:
    """The spool's (and the batch key's) line of a queued entry: from its bytes where it has them."""
    return SpoolRecord.line(entry.item, entry.data) if entry.data else encode(SpoolRecord.of(entry.item))


SPOOL_MAX_AGE = 7 * 86_400.0  # seconds a spool of another run and device may sit untouched before a job removes it


class Spool:
    """What the bot has not taken yet, on disk: `<run>@<device>.spool.jsonl` under `directory`
    (names from `safenames.slug`, checked with `inside`), rewritten whole and atomically."""

    def __init__(self, directory: str, run_id: str, device: str) -> None:
        self.directory = directory
        os.makedirs(directory, exist_ok=True)
        stem = f"{slug(run_id)}@{slug(device)}"  # '@' never occurs in a slug: no two jobs share a file
        self.path = inside(directory, stem + ".spool.jsonl")
        self.dead_path = inside(directory, stem + ".dead.jsonl")
        self._legacy_stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in f"{run_id}-{device}")
        self.bad_lines = 0

    def empty(self) -> bool:
        try:
            return os.path.getsize(self.path) == 0
        except OSError:
            return True

    def load(self) -> list[Item]:
        """The spooled items, oldest first; unreadable lines (a torn write, a disk fault) are counted
        in `bad_lines` and skipped. Spools of earlier msmon versions are read too, then removed."""
        items: list[Item] = []
        for path, parse in [(self.path, self._record), *self._legacy()]:
            try:
                with open(path, "rb") as f:
                    lines = f.read().splitlines()
            except OSError:
                continue
            for line in lines:
                if not line.strip():
                    continue
                try:
                    items.append(parse(line))
                except (msgspec.ValidationError, msgspec.DecodeError, ValueError, KeyError):
                    self.bad_lines += 1
            if path != self.path:
                with contextlib.suppress(OSError):
                    os.remove(path)
        return items

    @staticmethod
    def _record(line: bytes) -> Item:
        item = decode(line, SpoolRecord).item
        if item is None:
            raise ValueError("an empty spool record")
        return item

    def _legacy(self) -> list[tuple[str, Callable[[bytes], Item]]]:
        kinds: dict[bytes, type[Event] | type[Sample] | type[ActionResult]] = {
            b"e": Event, b"s": Sample, b"a": ActionResult}

        def parse(line: bytes) -> Item:
            return decode(line[1:], kinds[line[:1]])

        paths = [inside(self.directory, f"{self._legacy_stem}.{k}.jsonl") for k in ("high", "mid", "low")]
        return [(p, parse) for p in paths if os.path.exists(p)]

    def write(self, items: list[Item] | list[Entry]) -> int:
        """Replace the spool with `items` (queued entries: from the bytes they were queued with; none: remove it);
        returns the bytes written."""
        if not items:
            with contextlib.suppress(FileNotFoundError):
                os.remove(self.path)
            return 0
        data = b"\n".join(entry_line(x) if isinstance(x, Entry) else encode(SpoolRecord.of(x)) for x in items) + b"\n"
        tmp = self.path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        return len(data)

    def prune_others(self, max_age: float, now: float) -> list[str]:
        """Remove the spools of other runs and devices in this directory untouched for `max_age` seconds (a
        run id that never comes back would keep its spool for ever); the names removed. Dead letters stay."""
        removed: list[str] = []
        try:
            names = os.listdir(self.directory)
        except OSError:
            return removed
        for name in names:
            path = os.path.join(self.directory, name)
            if path == self.path or not name.endswith((".spool.jsonl", ".spool.jsonl.tmp")):
                continue
            with contextlib.suppress(OSError):
                if now - os.stat(path).st_mtime > max_age:
                    os.remove(path)
                    removed.append(name)
        return removed

    def dead_letter(self, entries: list[Entry]) -> None:
        """Keep what the bot refuses on its own, for a person to look at (appended, never sent again)."""
        with open(self.dead_path, "ab") as f:
            for e in entries:
                f.write(entry_line(e) + b"\n")


def open_spool(directory: str, run_id: str, device: str) -> Spool:
    """The run and device's spool, the spools of other runs untouched for `SPOOL_MAX_AGE` removed (and said)."""
    spool = Spool(directory, run_id, device)
    stale = spool.prune_others(SPOOL_MAX_AGE, time.time())
    if stale:
        log.warning("msmon: removed %d spool(s) untouched for %.0f days from %s (runs that never came back: "
                    "their unsent items are gone): %s", len(stale), SPOOL_MAX_AGE / 86400, directory,
                    ", ".join(stale[:5]) + (" ..." if len(stale) > 5 else ""))
    return spool


__all__ = ["SPOOL_MAX_AGE", "Spool", "SpoolRecord", "entry_line", "open_spool"]
