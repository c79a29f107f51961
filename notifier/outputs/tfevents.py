"""TensorBoard's event file format, written directly: one record per step holding all its scalars.

An event file is a sequence of TFRecords: `uint64 length | uint32 masked CRC-32C of the length | data |
uint32 masked CRC-32C of the data`, little endian; each record's data is an `Event` protocol buffer. The
first event says the file version (`brain.Event:2`); each later one carries a step, a wall time and a
`Summary` whose values are `(tag, simple_value)` pairs, as tensorboardX's `add_scalar` writes them, so
TensorBoard (and `msmon.offline`'s reader) read them as scalars.

What a step costs. A step's event is a fixed layout per set of tags and length of the step's varint:
constant bytes (field keys, lengths, tags) around the variable ones (the wall time's 8 bytes, the step's
varint, 4 bytes per float). The CRC is linear, so the CRC of an event is the CRC of its layout with the
variable bytes zeroed, XORed with one table entry per variable byte (the table for a byte depends on how
many bytes follow it); the length's CRC is a constant of the layout. A step with 6 scalars so pays about
35 table look-ups in Python instead of a CRC over its 200 bytes, and one record instead of tensorboardX's
one per scalar (each with a numpy conversion, a protobuf object and a lock on a multiprocessing queue).
Where a C CRC-32C is installed (`google-crc32c` or `crc32c`) it is used instead.
"""

from __future__ import annotations

import importlib
import os
import socket
import struct
import time
from collections.abc import Callable, Sequence
from functools import partial, reduce
from operator import getitem, is_not, itemgetter, xor
from typing import Any

_POLY = 0x82F63B78  # CRC-32C (Castagnoli), reflected
_MASK_DELTA = 0xA282EAD8

_T8: list[int] = []
for _i in range(256):
    _c = _i
    for _ in range(8):
        _c = (_c >> 1) ^ _POLY if _c & 1 else _c >> 1
    _T8.append(_c)


def crc32c_py(data: bytes, crc: int = 0) -> int:
    """CRC-32C of `data` (continuing from `crc`, the CRC of what came before) in pure Python, a byte a step."""
    t8 = _T8
    crc ^= 0xFFFFFFFF
    for b in data:
        crc = t8[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _native_crc32c() -> Callable[[bytes], int] | None:
    """A C implementation when one is installed: google-crc32c's `value`, or the crc32c package's `crc32c`."""
    for module, name in (("google_crc32c", "value"), ("crc32c", "crc32c")):
        try:
            mod: Any = importlib.import_module(module)
        except ImportError:
            continue
        fn = getattr(mod, name, None)
        if callable(fn) and fn(b"123456789") == 0xE3069283:  # a pure-Python fallback module is no faster
            if module == "google_crc32c" and getattr(mod, "implementation", "c") != "c":
                continue
            return fn  # type: ignore[no-any-return]
    return None


NATIVE: Callable[[bytes], int] | None = _native_crc32c()
crc32c: Callable[[bytes], int] = NATIVE or crc32c_py


def mask(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def masked_crc(data: bytes) -> int:
    return mask(crc32c(data))


# _SHIFT[k][v]: the CRC register's change from byte v followed by k zero bytes (no initial or final XOR); tuples,
# which the garbage collector stops visiting once it has seen they hold only numbers
_SHIFT: list[tuple[int, ...]] = [tuple(_T8)]


def _shift(k: int) -> tuple[int, ...]:
    while len(_SHIFT) <= k:
        t8, last = _T8, _SHIFT[-1]
        _SHIFT.append(tuple([t8[c & 0xFF] ^ (c >> 8) for c in last]))
    return _SHIFT[k]


def _varint(n: int) -> bytes:
    if 0 <= n < 0x80:
        return bytes((n,))
    if n < 0:
        n += 1 << 64  # protobuf int64: a negative is ten bytes of two's complement
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(number: int, wire: int) -> bytes:
    return _varint((number << 3) | wire)


def value_prefix(tag: str) -> bytes:
    """The bytes of `Summary.value { tag: <tag> simple_value: ` before the float: constant per tag."""
    name = tag.encode()
    inner = _field(1, 2) + _varint(len(name)) + name + _field(2, 5)  # Value.tag, then simple_value's key
    return _field(1, 2) + _varint(len(inner) + 4) + inner  # Summary.value, length-delimited


_pack_f = struct.Struct("<f").pack
_pack_d = struct.Struct("<d").pack
_pack_q = struct.Struct("<Q").pack
_pack_i = struct.Struct("<I").pack
_WALL = _field(1, 1)  # Event.wall_time, a double
_STEP = _field(2, 0)  # Event.step, an int64 varint
_SUMMARY = _field(5, 2)  # Event.summary
_VERSION = _field(3, 2)  # Event.file_version


def scalars_event(wall_time: float, step: int, values: Sequence[tuple[bytes, float]]) -> bytes:
    """An `Event` with the step's scalars: (value_prefix(tag), value) pairs."""
    summary = b"".join([prefix + _pack_f(v) for prefix, v in values])
    return b"".join((_WALL, _pack_d(wall_time), _STEP, _varint(step), _SUMMARY, _varint(len(summary)), summary))


def record(data: bytes) -> bytes:
    """One TFRecord around `data`."""
    head = _pack_q(len(data))
    return b"".join((head, _pack_i(masked_crc(head)), data, _pack_i(masked_crc(data))))


class _Layout:
    """An event's bytes for one set of present tags and one length of the step's varint: one struct that packs the
    whole event, the CRC of its constant bytes (the variable ones zeroed), the table for each variable byte (by how
    many bytes follow it), and the record's head (the length and its CRC, constants here)."""

    __slots__ = ("args", "struct", "variable", "tables", "base", "head")

    def __init__(self, prefixes: Sequence[bytes], step_len: int) -> None:
        summary = _SUMMARY + _varint(sum(len(p) + 4 for p in prefixes))
        fmt = f"<{len(_WALL)}sd{len(_STEP)}s{step_len}s{len(summary)}s" + "".join(f"{len(p)}sf" for p in prefixes)
        self.struct = struct.Struct(fmt)
        self.args: list[Any] = [_WALL, 0.0, _STEP, bytes(step_len), summary]
        for p in prefixes:
            self.args += [p, 0.0]
        zeroed = self.struct.pack(*self.args)
        at = len(_WALL)
        offsets = list(range(at, at + 8))  # the wall time's bytes, then the step's, then each float's
        at += 8 + len(_STEP)
        offsets += range(at, at + step_len)
        at += step_len + len(summary)
        for p in prefixes:
            at += len(p)
            offsets += range(at, at + 4)
            at += 4
        n = len(zeroed)
        self.variable = itemgetter(*offsets)
        self.tables = [_shift(n - 1 - i) for i in offsets]
        self.base = crc32c_py(zeroed)
        head = _pack_q(n)
        self.head = head + _pack_i(masked_crc(head))


_present = partial(is_not, None)
_getitem = getitem


class _Template:
    """Records of scalars events for a fixed list of tags, each step any of them (None: absent); the CRC from the
    layouts, in C calls only (map and reduce over the tables), or the C CRC-32C where one is installed."""

    def __init__(self, tags: Sequence[str]) -> None:
        self.prefixes = [value_prefix(t) for t in tags]
        self._layouts: dict[tuple[Any, ...], _Layout] = {}

    def record(self, wall_time: float, step: int, values: Sequence[float | None]) -> bytes:
        stepv = _varint(step)
        key = (*map(type, values), len(stepv))
        layout = self._layouts.get(key)
        if layout is None:
            prefixes = [p for p, v in zip(self.prefixes, values) if v is not None]  # noqa: B905 - as long
            layout = self._layouts[key] = _Layout(prefixes, len(stepv))
        args = layout.args
        args[1] = wall_time
        args[3] = stepv
        args[6::2] = filter(_present, values)
        data = layout.struct.pack(*args)
        if NATIVE is not None:
            return b"".join((layout.head, data, _pack_i(mask(NATIVE(data)))))
        crc = reduce(xor, map(_getitem, layout.tables, layout.variable(data)), layout.base)
        return b"".join((layout.head, data, _pack_i(mask(crc))))


_counter = 0


def file_name(now: float | None = None) -> str:
    """`events.out.tfevents.<time>.<host>.<pid>.<n>`, the name TensorBoard looks for (as tensorboardX names
    its files: a second writer in the same second and process gets another n)."""
    global _counter
    _counter += 1
    stamp = int(time.time() if now is None else now)
    return f"events.out.tfevents.{stamp:010d}.{socket.gethostname()}.{os.getpid()}.{_counter}"


class EventFileWriter:
    """Appends scalar events to one new event file in `log_dir`. Not thread-safe: one writer thread owns it
    (the Monitor's background writer). Records gather in memory until `flush`, which writes them at once."""

    def __init__(self, log_dir: str, tags: Sequence[str]) -> None:
        os.makedirs(log_dir, exist_ok=True)
        now = time.time()
        self.path = os.path.join(log_dir, file_name(now))
        self._file = open(self.path, "wb")  # noqa: SIM115 - kept open until close()
        self._template = _Template(tags)
        self._pending: list[bytes] = [record(_WALL + _pack_d(now) + _VERSION + _varint(13) + b"brain.Event:2")]

    def scalars(self, wall_time: float, step: int, values: Sequence[float | None]) -> None:
        """One event with all of a step's scalars: `values` in the order of the writer's tags, None for a tag
        without a value at this step. A value beyond float32's range is an OverflowError (nothing written)."""
        self._pending.append(self._template.record(wall_time, step, values))

    def flush(self) -> None:
        if self._pending:
            self._file.write(b"".join(self._pending))
            self._pending.clear()
        self._file.flush()

    def close(self) -> None:
        if not self._file.closed:
            self.flush()
            self._file.close()
