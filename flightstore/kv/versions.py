"""Row values of every schema version of a table: ALTER TABLE without rewriting RocksDB.

Each KV value starts with the schema version that wrote it (two bytes, see
:data:`flightstore.kv.encoding.VERSION_TAG`). :class:`VersionedRowCodec` writes the current version
and reads any: values of the current version decode as they always did (the common case costs one
vectorized comparison); older ones decode with their own version's layout and come out conformed to
the current schema (columns added since are NULL, widened columns cast), in the original order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pyarrow as pa

from flightstore.errors import CorruptData, InvalidInput
from flightstore.kv.encoding import VERSION_TAG, RowCodec
from flightstore.kv.row_message import RowMessage
from flightstore.schema import conform

__all__ = ["VersionedRowCodec", "value_versions"]

_FEW_ROWS = 16


def _as_binary(values: Sequence[bytes] | pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if isinstance(values, pa.Array):
        return values
    try:
        return pa.array(values if isinstance(values, list) else list(values), pa.large_binary())
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as exc:
        raise InvalidInput(f"row values must be bytes: {exc}") from exc


def value_versions(values: pa.Array) -> np.ndarray:
    """The schema version leading each value of a binary array (vectorized)."""
    n = len(values)
    if n == 0:
        return np.zeros(0, np.uint16)
    if values.null_count:
        raise InvalidInput("cannot decode a null row value")
    width = 8 if pa.types.is_large_binary(values.type) else 4
    offsets = np.frombuffer(values.buffers()[1], f"<i{width}", count=n + 1, offset=values.offset * width)
    starts = offsets[:-1].astype(np.int64)
    if ((offsets[1:] - starts) < VERSION_TAG.size).any():
        raise CorruptData("row value shorter than its schema version tag")
    data = np.frombuffer(values.buffers()[2], np.uint8)
    return data[starts].astype(np.uint16) | (data[starts + 1].astype(np.uint16) << 8)


class VersionedRowCodec:
    """Encodes rows of the current schema version; decodes values of any version of the table.

    ``schemas`` maps every schema version that may have written a value to its schema;
    ``version`` is the current one. Same interface as :class:`RowCodec`.
    """

    def __init__(self, schemas: Mapping[int, pa.Schema], version: int) -> None:
        self.schema = schemas[version]
        self.version = version
        self._schemas = dict(schemas)
        self._codecs: dict[int, RowCodec] = {version: RowCodec(self.schema, version)}
        self._current = self._codecs[version]

    def _codec(self, version: int) -> RowCodec:
        codec = self._codecs.get(version)
        if codec is None:
            schema = self._schemas.get(version)
            if schema is None:
                raise CorruptData(f"a KV value carries schema version {version}, which the table "
                                  f"never had (versions {sorted(self._schemas)})")
            codec = self._codecs[version] = RowCodec(schema, version)
        return codec

    def encode(self, data: pa.Table | pa.RecordBatch) -> list[bytes]:
        """Values of the current version (see :meth:`RowCodec.encode`)."""
        return self._current.encode(data)

    def decode_value(self, value: bytes, columns: Sequence[str] | None = None) -> pa.Table:
        """:meth:`decode` of one value (a point lookup's answer)."""
        if value[:2] == self._current.tag:
            return self._current.decode_value(value, columns)
        return self.decode([value], columns)

    def row_message_of(self, value: bytes, columns: Sequence[str], key_index: bool = False) -> RowMessage | None:
        """:meth:`RowCodec.row_message` for ``value``: None when ``value`` is of an older schema
        version (its row is conformed to the current schema by :meth:`decode`)."""
        if value[:2] != self._current.tag:
            return None
        return self._current.row_message(columns, key_index)

    def decode(self, values: Sequence[bytes] | pa.Array | pa.ChunkedArray,
               columns: Sequence[str] | None = None) -> pa.Table:
        """Rows of ``values`` (any mix of versions) as ``columns`` of the current schema."""
        if isinstance(values, list) and len(values) <= _FEW_ROWS and \
                all(isinstance(v, bytes) for v in values):
            tag = self._current.tag
            if all(v[:2] == tag for v in values):
                return self._current.decode(values, columns)
            values = _as_binary(values)
        else:
            values = _as_binary(values)
        versions = value_versions(values)
        if len(versions) == 0 or (versions == self.version).all():
            return self._current.decode(values, columns)
        names = list(self.schema.names if columns is None else columns)
        for name in names:
            if name not in self.schema.names:
                raise InvalidInput(f"{name!r} is not a column of {self.schema.names}")
        parts, positions = [], []
        for version in np.unique(versions):
            rows = np.flatnonzero(versions == version)
            codec = self._codec(int(version))
            stored = [c for c in names if c in codec.schema.names]
            part = codec.decode(values.take(pa.array(rows)), stored)
            parts.append(conform(part, self.schema, names, len(rows)))
            positions.append(rows)
        order = np.argsort(np.concatenate(positions), kind="stable")
        return pa.concat_tables(parts).take(pa.array(order))
