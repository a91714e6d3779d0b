"""What a KV bucket keeps in its RocksDB ``meta`` column family besides rows: the applied log
offset, the row count, each writer's last batch sequence (and time), undo fences, the value format.
Written by the write path (:mod:`flightstore.kv.writes`), recovery and undo; read by the tablet,
its integrity checks and :mod:`flightstore.kv.undo`.
"""

from __future__ import annotations

import struct

__all__ = ["UNDO_FENCE_PREFIX", "WRITER_META_PREFIXES", "writer_value"]

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
