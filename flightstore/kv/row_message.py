"""One stored row as an Arrow IPC record batch message, written from its value bytes.

A single-key lookup answers at most one row. Decoding the stored value into arrays, a table and a
batch, then serializing that batch, costs a dozen pyarrow calls, and under concurrent lookup
streams each call that releases the GIL costs ~35 us of hand-over on top of its own work
(``bench/gil_handoffs.py``). The row's IPC message, though, is a fixed flatbuffer whose only
per-row parts are each column's null count and each buffer's offset and length, followed by the
row's bytes: :class:`RowMessage` keeps that flatbuffer (made once by pyarrow from a sample row of
the projection) and per row patches those numbers and joins the value's byte slices as the body:
plain Python, no Arrow call. The message is the one ``batch.serialize()`` makes of
:meth:`RowCodec.decode_value <flightstore.kv.encoding.RowCodec.decode_value>`'s row (the tests
compare the bytes), so a reader decodes exactly the same row.
"""

from __future__ import annotations

import struct
from typing import Any, Sequence

import pyarrow as pa

from flightstore.errors import CorruptData

__all__ = ["RowMessage", "message_layout", "value_spans"]

_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_U16 = struct.Struct("<H")
_I64 = struct.Struct("<q")
_PAD = [b"\x00" * ((8 - n) % 8) for n in range(8)]  # by length % 8: the zeros up to 8-byte alignment
_NULL_BITMAP = b"\x00" + _PAD[1]  # one null value's validity bitmap, padded
_FALSE, _TRUE = b"\x00" + _PAD[1], b"\x01" + _PAD[1]  # one boolean value's data, padded
_FIXED, _BOOLEAN, _VARIABLE, _ZERO = 0, 1, 2, 3  # what a column step does


def _field(data: bytes, table: int, index: int) -> int | None:
    """Position in flatbuffer ``data`` of field ``index`` of the table at ``table``, or None when
    the field is absent (default value)."""
    vtable = table - _I32.unpack_from(data, table)[0]
    size = _U16.unpack_from(data, vtable)[0]
    if 4 + 2 * index + 2 > size:
        return None
    offset = _U16.unpack_from(data, vtable + 4 + 2 * index)[0]
    return table + offset if offset else None


def _target(data: bytes, at: int) -> int:
    """Where the uoffset at ``at`` points."""
    return at + _U32.unpack_from(data, at)[0]


def message_layout(message: bytes) -> tuple[int, int, int, int, int, int]:
    """``(metadata end, FieldNode vector start, node count, Buffer vector start, buffer count,
    bodyLength position)`` of an encapsulated IPC record batch message (continuation marker,
    metadata length, flatbuffer ``Message``, body), positions from the message's start.
    ValueError when it is not a plain one (compressed, variadic buffers, no bodyLength)."""
    marker, length = struct.unpack_from("<Ii", message, 0)
    if marker != 0xFFFFFFFF:
        raise ValueError("not an encapsulated IPC message")
    base = 8  # flatbuffer offsets count from the metadata's start
    data = message[base:base + length]
    root = _target(data, 0)
    header_type, header, body_length = _field(data, root, 1), _field(data, root, 2), _field(data, root, 3)
    if header_type is None or data[header_type] != 3 or header is None or body_length is None:
        raise ValueError("not a record batch message with a body")
    batch = _target(data, header)
    nodes, buffers = _field(data, batch, 1), _field(data, batch, 2)
    if nodes is None or buffers is None or _field(data, batch, 3) is not None or _field(data, batch, 4) is not None:
        raise ValueError("a record batch message with compression or variadic buffers")
    nodes, buffers = _target(data, nodes), _target(data, buffers)
    return (base + length, base + nodes + 4, _U32.unpack_from(data, nodes)[0],
            base + buffers + 4, _U32.unpack_from(data, buffers)[0], base + body_length)


def value_spans(value: bytes, header_size: int, variable: Sequence[Any]) -> list[tuple[int, int]]:
    """(start, length) in ``value`` of each variable-width slot's bytes (``variable``: the codec's
    variable slots in value order; their bytes follow the ``header_size``-byte header in that
    order). CorruptData when the value's length does not match its header."""
    if len(value) < header_size:
        raise CorruptData(f"row value shorter than its {header_size}-byte header")
    position = header_size
    spans = []
    for slot in variable:
        length = _U32.unpack_from(value, slot.start)[0]
        spans.append((position, length))
        position += length
    if position != len(value):
        raise CorruptData("row value length does not match its header")
    return spans


class RowMessage:
    """The IPC record batch message of one stored row's ``columns`` (see the module doc).

    ``slots`` maps each column to its :class:`~flightstore.kv.encoding._Slot` in the codec's
    value layout; ``variable`` lists the codec's variable-width slots in value order (the spans
    of their bytes follow the header in that order); ``header_size`` and ``prefix`` (the bytes of
    a schema version tag) are the codec's. ``zero_int32`` appends a non-null int32 column of 0
    (a lookup stream's key index of a single key)."""

    def __init__(self, slots: Sequence[Any], variable: Sequence[Any], header_size: int, prefix: int,
                 zero_int32: bool = False) -> None:
        self.header_size = header_size
        self._variable = tuple(variable)
        steps, arrays = [], []
        for slot in slots:
            byte, bit = divmod(slot.index, 8)
            if slot.variable:
                large = pa.types.is_large_string(slot.type) or pa.types.is_large_binary(slot.type)
                offsets = struct.Struct("<2q" if large else "<2i")
                steps.append((_VARIABLE, prefix + byte, 1 << bit, slot.start, slot.start + slot.width,
                              self._variable.index(slot), offsets))
                arrays.append(pa.Array.from_buffers(slot.type, 1, [
                    None, pa.py_buffer(offsets.pack(0, 1)), pa.py_buffer(b"x")]))
            elif pa.types.is_boolean(slot.type):
                steps.append((_BOOLEAN, prefix + byte, 1 << bit, slot.start, slot.start + 1, -1, None))
                arrays.append(pa.Array.from_buffers(slot.type, 1, [None, pa.py_buffer(b"\x01")]))
            else:
                steps.append((_FIXED, prefix + byte, 1 << bit, slot.start, slot.start + slot.width, -1,
                              _PAD[slot.width % 8]))
                arrays.append(pa.Array.from_buffers(slot.type, 1, [None, pa.py_buffer(b"\x00" * slot.width)]))
        if zero_int32:
            steps.append((_ZERO, 0, 0, 0, 0, -1, None))  # validity bit 0: never null
            arrays.append(pa.array([0], pa.int32()))
        names = [f"c{i}" for i in range(len(arrays))]
        sample = pa.RecordBatch.from_arrays(arrays, names=names).serialize().to_pybytes()
        end, nodes, node_count, buffers, buffer_count, body_length = message_layout(sample)
        if node_count != len(steps):
            raise ValueError("a row message has one field node per column")
        self.types = tuple(array.type for array in arrays)  # of the message's columns
        self._fitting: pa.Schema | None = None  # the schema fits() last said yes to
        self._steps = tuple(steps)
        self._metadata = sample[:end]
        self._nodes = struct.Struct(f"<{2 * node_count}q")
        self._node_at = nodes
        self._buffers = struct.Struct(f"<{2 * buffer_count}q")
        self._buffer_at = buffers
        self._body_length_at = body_length

    def fits(self, schema: pa.Schema) -> bool:
        """Whether a reader may decode the messages with ``schema`` (its types are the
        columns'); remembered for the last schema (callers pass the same memoized one)."""
        if schema is self._fitting:
            return True
        if tuple(schema.types) != self.types:
            return False
        self._fitting = schema
        return True

    def message(self, value: bytes, head: bytes = b"") -> tuple[bytes, int]:
        """``head`` followed by the IPC message of ``value``'s row, and the row's buffer bytes
        (what ``get_total_buffer_size`` says of the decoded row). CorruptData for a value whose
        bytes do not match the codec's layout, as decoding it says."""
        spans = value_spans(value, self.header_size, self._variable)
        pieces: list[bytes] = []
        nodes: list[int] = []
        buffers: list[int] = []
        offset = 0  # of the next buffer in the body
        held = 0
        for kind, validity_byte, validity_bit, start, end, variable, extra in self._steps:
            if value[validity_byte] & validity_bit:
                nodes += (1, 1)
                buffers += (offset, 1)
                pieces.append(_NULL_BITMAP)
                offset += 8
                held += 1
            else:
                nodes += (1, 0)
                buffers += (offset, 0)
            if kind == _FIXED:
                width = end - start
                buffers += (offset, width)
                pieces += (value[start:end], extra)
                offset += width + len(extra)
                held += width
            elif kind == _VARIABLE:
                begin, length = spans[variable]
                offsets = extra.pack(0, length)
                pad = _PAD[length % 8]
                buffers += (offset, extra.size, offset + extra.size, length)
                pieces += (offsets, value[begin:begin + length], pad)
                offset += extra.size + length + len(pad)
                held += extra.size + length
            elif kind == _BOOLEAN:
                buffers += (offset, 1)
                pieces.append(_TRUE if value[start] != 0 else _FALSE)
                offset += 8
                held += 1
            else:  # _ZERO: an int32 of 0
                buffers += (offset, 4)
                pieces.append(b"\x00" * 8)
                offset += 8
                held += 4
        metadata = bytearray(self._metadata)
        self._nodes.pack_into(metadata, self._node_at, *nodes)
        self._buffers.pack_into(metadata, self._buffer_at, *buffers)
        _I64.pack_into(metadata, self._body_length_at, offset)
        return b"".join((head, metadata, *pieces)), held
