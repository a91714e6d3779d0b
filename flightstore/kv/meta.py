"""What a KV bucket keeps in its RocksDB ``meta`` column family besides rows: the applied log
offset, the row count, each writer's last batch sequence (and time), undo fences, the value format.
Written by the write path (:mod:`flightstore.kv.writes`), recovery and undo; read by the tablet,
its integrity checks and :mod:`flightstore.kv.undo`.

:func:`read_meta` reads the whole column family with a read-only RocksDB open (no fsync, no new
MANIFEST or WAL; about a seventh of a read-write open): a tablet whose KV needs no recovery answers
its applied offset, row count and writers' state from that copy and opens RocksDB for writing only
when a read or write of rows needs it (see :class:`~flightstore.kv.tablet.KvTablet`).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

from rocksdict import AccessType, Options, Rdict

__all__ = ["UNDO_FENCE_PREFIX", "WRITER_META_PREFIXES", "MetaCopy", "read_meta", "writer_value"]

_APPLIED = b"applied_offset"
_ROWS = b"row_count"
_WRITER = b"writer:"  # + writer id: (last sequence, last write ms); 8-byte values predate the time
UNDO_FENCE_PREFIX = b"undo:"  # + writer id: its last undo (kv/undo.py)
WRITER_META_PREFIXES = (_WRITER, UNDO_FENCE_PREFIX)  # what a writer keeps in the meta column family
_VALUE_FORMAT = b"value_format"  # present: every value leads with its schema version
_INT = struct.Struct(">q")
_WRITER_STATE = struct.Struct(">qq")


def writer_value(sequence: int, last_ms: int | None) -> bytes:
    """A writer's meta value: its last sequence and (when known) the ms of its last write."""
    return _INT.pack(sequence) if last_ms is None else _WRITER_STATE.pack(sequence, last_ms)


class MetaCopy:
    """The meta column family as a read-only open found it, answering as the live column family
    does (``get``, ``items(from_key=...)``). Valid while nothing writes the KV: a tablet swaps it
    for the live column family before its first RocksDB write."""

    def __init__(self, items: Iterator[tuple[bytes, bytes]]) -> None:
        self._values = dict(items)

    def get(self, key: bytes) -> bytes | None:
        return self._values.get(key)

    def items(self, from_key: bytes = b"") -> Iterator[tuple[bytes, bytes]]:
        """Pairs in key order from ``from_key`` on (RocksDB's bytewise order)."""
        return iter(sorted((k, v) for k, v in self._values.items() if k >= from_key))


def _read_only_options() -> Options:
    """Options of a look at the meta column family: one thread opens the SST files (RocksDB's 16
    by default cost twice the CPU of the whole open), and only a few are opened up front (the
    rows' files are not needed: all of them would be, each its index and filter read)."""
    options = Options(raw_mode=True)
    options.set_max_file_opening_threads(1)
    options.set_max_open_files(64)
    return options


def read_meta(directory: Path) -> MetaCopy | None:
    """The meta column family of the KV in ``directory`` through a read-only RocksDB open; None
    when it cannot be read that way (no KV there, a corrupt or foreign one: the caller opens it
    for writing, which repairs or rebuilds it). Changes nothing RocksDB keeps (rocksdict rewrites
    its own ``rocksdict-config.json`` with the same options, as every open does)."""
    if not (directory / "CURRENT").exists():
        return None
    try:
        db = Rdict(str(directory), options=_read_only_options(), column_families={"meta": _read_only_options()},
                   access_type=AccessType.read_only())
    except Exception:  # noqa: BLE001 - rocksdict raises plain Exception("Corruption: ...")
        return None
    try:
        return MetaCopy(db.get_column_family("meta").items())
    except Exception:  # noqa: BLE001 - as above: the read-write open decides what to do
        return None
    finally:
        db.close()
