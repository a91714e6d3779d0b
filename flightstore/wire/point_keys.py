"""A LOOKUP body of one key of integer columns, read and written without Arrow.

A client's single-key lookup sends its key as one IPC record batch of one row
(:func:`~flightstore.wire.lookups.encode_batch`). When the key columns are all integers that
message is, byte for byte, a fixed prefix (continuation marker, flatbuffer metadata: one row, no
nulls, each buffer's offset and length) followed by each column's value, little-endian, padded to
8 bytes. :class:`PointKeys` holds that prefix for a key schema (made once by pyarrow) and reads
the values of a body that matches it with one ``struct`` call: no ``read_record_batch``, no
validation, no table. A body that does not match (several keys, a null, another writer's
metadata) is read the general way, so this only ever answers what the general path would. The
client writes a single key's message the same way (:meth:`PointKeys.encode`): the same bytes as
encoding a batch of it, without building one.
"""

from __future__ import annotations

import struct
from typing import Any

import pyarrow as pa

__all__ = ["PointKeys"]

_FORMATS = {8: "b7x", 16: "h6x", 32: "i4x", 64: "q"}


class PointKeys:
    """The one-row key messages of ``key_schema`` (every column an integer; see the module doc)."""

    def __init__(self, key_schema: pa.Schema) -> None:
        if not len(key_schema) or not all(pa.types.is_integer(f.type) for f in key_schema):
            raise ValueError("PointKeys reads keys of integer columns")
        sample = pa.RecordBatch.from_arrays([pa.array([0], f.type) for f in key_schema],
                                            schema=key_schema).serialize().to_pybytes()
        body = 8 * len(key_schema)
        self.names = tuple(key_schema.names)
        self._prefix = sample[:-body]
        self._size = len(sample)
        fmt = "".join(_FORMATS[f.type.bit_width][0].upper() + _FORMATS[f.type.bit_width][1:]
                      if pa.types.is_unsigned_integer(f.type) else _FORMATS[f.type.bit_width]
                      for f in key_schema)
        self._values = struct.Struct("<" + fmt)
        probe = pa.RecordBatch.from_arrays([pa.array([i + 1], f.type) for i, f in enumerate(key_schema)],
                                           schema=key_schema).serialize().to_pybytes()
        if self.values(probe) != tuple(range(1, len(key_schema) + 1)):  # the layout is as assumed
            raise ValueError(f"unexpected IPC layout of a key of {key_schema}")

    def values(self, body: Any, at: int = 0) -> tuple[int, ...] | None:
        """The key of the message in ``body`` from ``at`` (bytes or any buffer) as Python ints in
        key column order, or None when it is not one row of this schema without nulls."""
        view = memoryview(body).cast("B")  # (a pyarrow buffer's items are signed chars)
        if len(view) - at != self._size or view[at:at + len(self._prefix)] != self._prefix:
            return None
        return self._values.unpack_from(view, at + len(self._prefix))

    def encode(self, keys: Any) -> bytes | None:
        """The message of one key given as a dict of key columns (others ignored) each holding
        one Python int (a list or tuple of one), as the general encoding would write it; None for
        anything else (several keys, a null, a bool, a value out of its column's range)."""
        values = []
        for name in self.names:
            column = keys.get(name)
            if type(column) not in (list, tuple) or len(column) != 1 or type(column[0]) is not int:
                return None
            values.append(column[0])
        try:
            return self._prefix + self._values.pack(*values)
        except struct.error:  # out of the column's range: the general path says so
            return None

    @staticmethod
    def of(key_schema: pa.Schema) -> PointKeys | None:
        """The reader of ``key_schema``'s one-row keys, or None when its keys are not all integers."""
        try:
            return PointKeys(key_schema)
        except ValueError:
            return None
