"""Byte codecs of the primary-key store: order-preserving keys and compact row values.

Keys (:func:`encode_keys`) are built so that RocksDB's byte-wise (memcmp) order equals the SQL order
of the key tuples, and so that a leading subset of the key columns encodes to a byte prefix of the
full key: a primary-key prefix lookup is then one contiguous RocksDB range. Per column:

* integers, dates, times, timestamps, durations, decimals: the fixed-width value big-endian, with the
  sign bit flipped for signed types (two's complement then sorts like unsigned bytes);
* floats: IEEE bits big-endian; negatives have every bit inverted, others get the sign bit set.
  ``-0.0`` is stored as ``0.0`` and every NaN as one canonical NaN (sorting after ``+inf``), because
  SQL treats those as equal and so must a key;
* bool: one byte ``0``/``1``; fixed_size_binary: the raw bytes;
* string/binary: ``0x00`` escaped as ``0x00 0xFF`` and the value terminated by ``0x00 0x00``. The
  terminator sorts below any continuation, so a shorter string sorts first and no encoded value is
  a prefix of another (which keeps prefix ranges exact).

Widths are the column's own: an ``int32`` key and an ``int64`` key encode differently, so lookups
must bring values to the key column's type first (:func:`encode_key_prefix` does, given ``schema``).

Values (:class:`RowCodec`) hold one whole row: a fixed-size header, then the variable-width bytes::

    [schema version: uint16 little-endian, when the codec has one (see :mod:`flightstore.kv.versions`)]
    [null bitmap: ceil(ncols/8) bytes, bit j set = column j is null]
    [every fixed-width column, little-endian, in schema order (bool: 1 byte); null slots zeroed]
    [uint32 little-endian byte length of every variable-width column, in schema order]
    [the bytes of every variable-width column, in schema order, concatenated]

Because the header has one size per schema, decoding gathers it with one numpy fancy index and finds
every variable column's bytes from the lengths, without touching the columns it does not return.
Both directions are vectorized (numpy over Arrow buffers, Arrow compute kernels); the only per-row
Python is the final ``to_pylist()`` that hands ``bytes`` to RocksDB. Decoding a handful of rows (a
point lookup) slices each row's bytes instead: below ~16 rows that beats the vectorized set-up.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flightstore.errors import CorruptData, InvalidInput, SchemaMismatch
from flightstore.kv.row_message import RowMessage, value_spans
from flightstore.schema import Projections

__all__ = ["encode_keys", "encode_key_array", "encode_key_prefix", "integer_key", "integer_key_layout",
           "RowCodec", "VERSION_TAG"]

_EMPTY = pa.scalar(b"", pa.large_binary())
_TERMINATOR = pa.scalar(b"\x00\x00", pa.large_binary())
_DATA = pa.Table | pa.RecordBatch
_U32 = struct.Struct("<I")
_FEW_ROWS = 16  # up to this many rows, RowCodec.decode slices row bytes instead of vectorizing
VERSION_TAG = struct.Struct("<H")  # the schema version leading a versioned value


# ---- shared helpers ---------------------------------------------------------------------------

def _is_variable(t: pa.DataType) -> bool:
    return (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
            or pa.types.is_large_binary(t))


def _is_signed(t: pa.DataType) -> bool:
    """Two's-complement storage whose sign bit must flip for byte order."""
    return (pa.types.is_signed_integer(t) or pa.types.is_temporal(t) or pa.types.is_decimal(t))


def _fixed_width(t: pa.DataType) -> int | None:
    """Bytes per value of a supported fixed-width type (bool: 1), else None."""
    if pa.types.is_boolean(t):
        return 1
    if (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_temporal(t)
            or pa.types.is_decimal(t) or pa.types.is_fixed_size_binary(t)):
        if pa.types.is_interval(t):
            return None
        return t.byte_width
    return None


def _column(data: _DATA, name: str, error: type[Exception]) -> pa.Array:
    """One column of a Table or RecordBatch as a single contiguous Array."""
    index = data.schema.get_field_index(name)
    if index < 0:
        raise error(f"column {name!r} is missing (have {data.schema.names})")
    col = data.column(index)
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    return col


def _le_matrix(arr: pa.Array, width: int) -> np.ndarray:
    """The values of a fixed-width array as an ``n x width`` uint8 view (little-endian bytes)."""
    n = len(arr)
    if n == 0:
        return np.zeros((0, width), np.uint8)
    if pa.types.is_boolean(arr.type):
        raw = np.frombuffer(arr.buffers()[1], np.uint8)
        first = arr.offset // 8
        raw = raw[first: first + (arr.offset % 8 + n + 7) // 8]
        bits = np.unpackbits(raw, bitorder="little")[arr.offset % 8: arr.offset % 8 + n]
        return bits.reshape(n, 1)
    return np.frombuffer(arr.buffers()[1], np.uint8, count=n * width,
                         offset=arr.offset * width).reshape(n, width)


def _binary_from_matrix(matrix: np.ndarray) -> pa.Array:
    """An ``n x w`` uint8 matrix as a large_binary array of n values of w bytes."""
    n, width = matrix.shape
    offsets = np.arange(n + 1, dtype=np.int64) * width
    return pa.Array.from_buffers(pa.large_binary(), n, [
        None, pa.py_buffer(offsets), pa.py_buffer(np.ascontiguousarray(matrix))])


def _validity(null: np.ndarray | None) -> pa.Buffer | None:
    if null is None or not null.any():
        return None
    return pa.py_buffer(np.packbits(~null, bitorder="little"))


# ---- keys -------------------------------------------------------------------------------------

def _key_matrix(arr: pa.Array, name: str) -> np.ndarray:
    """The order-preserving big-endian encoding of a fixed-width key column, ``n x w`` uint8."""
    t = arr.type
    width = _fixed_width(t)
    if pa.types.is_floating(t):
        floats = arr.to_numpy(zero_copy_only=False)
        floats = np.where(floats == 0, floats.dtype.type(0), floats)  # -0.0 -> 0.0
        floats = np.where(np.isnan(floats), floats.dtype.type(np.nan), floats)  # one NaN
        unsigned = np.dtype(f"u{width}")
        bits = floats.view(unsigned)
        sign = unsigned.type(1 << (8 * width - 1))
        bits = np.where(bits & sign, ~bits, bits | sign).astype(unsigned)
        return bits.astype(unsigned.newbyteorder(">")).view(np.uint8).reshape(len(arr), width)
    matrix = _le_matrix(arr, width)
    if pa.types.is_boolean(t) or pa.types.is_fixed_size_binary(t) and not pa.types.is_decimal(t):
        return matrix
    matrix = matrix[:, ::-1]  # little-endian -> big-endian (copies below or in hstack)
    if _is_signed(t):
        matrix = matrix.copy()
        matrix[:, 0] ^= 0x80
    return matrix


def integer_key_layout(types: Sequence[pa.DataType]) -> tuple[tuple[int, int], ...]:
    """For key columns of integer ``types``: each one's (byte width, bias) for :func:`integer_key`
    (:func:`_key_matrix` in plain Python: big-endian bytes, the sign bit flipped for signed types)."""
    return tuple((t.bit_width // 8, (1 << (t.bit_width - 1)) if _is_signed(t) else 0) for t in types)


def integer_key(values: Sequence[int], layout: tuple[tuple[int, int], ...]) -> bytes:
    """:func:`encode_keys` of one row of integer key columns, given as Python ints (non-null, in
    range of their types) with their :func:`integer_key_layout`: no arrays at all."""
    return b"".join([(value + bias).to_bytes(width, "big") for value, (width, bias) in zip(values, layout)])


def _normalize_key_array(arr: pa.Array, name: str) -> pa.Array:
    t = arr.type
    if pa.types.is_dictionary(t):
        arr, t = arr.cast(t.value_type), t.value_type
    if pa.types.is_string_view(t) or pa.types.is_binary_view(t):
        arr, t = arr.cast(pa.large_binary()), pa.large_binary()
    if not (_is_variable(t) or _fixed_width(t) is not None):
        raise InvalidInput(f"key column {name!r} has type {t}, which cannot be a key")
    if arr.null_count:
        raise InvalidInput(f"key column {name!r} contains {arr.null_count} null value(s); "
                           "primary key columns must not be null")
    return arr


def encode_keys(data: pa.Table | pa.RecordBatch, columns: Sequence[str]) -> list[bytes]:
    """One RocksDB key per row: the key columns' order-preserving encodings, concatenated.

    Byte-wise order of the keys equals the SQL order of the ``columns`` tuples, and for every ``k``
    ``encode_keys(data, columns[:k])[i]`` is a byte prefix of ``encode_keys(data, columns)[i]`` (and
    of no key whose leading ``k`` values differ). Raises :class:`InvalidInput` naming the column for
    a missing column, a null in a key column, or a type that cannot be a key.
    """
    if columns and data.num_rows == 1:  # a point lookup's key of integers: no checks beyond its own
        arrays = [_column(data, name, InvalidInput) for name in columns]
        if all(pa.types.is_integer(arr.type) and not arr.null_count for arr in arrays):
            return [integer_key([arr[0].as_py() for arr in arrays], integer_key_layout([arr.type for arr in arrays]))]
    arrays = _key_arrays(data, columns)
    return _join_keys(arrays, columns, data.num_rows).to_pylist()


def encode_key_array(data: pa.Table | pa.RecordBatch, columns: Sequence[str]) -> pa.Array:
    """:func:`encode_keys` as a ``large_binary`` Arrow array, for vectorized work on many keys
    (membership tests, grouping) without a Python ``bytes`` object per row."""
    return _join_keys(_key_arrays(data, columns), columns, data.num_rows)


def _key_arrays(data: pa.Table | pa.RecordBatch, columns: Sequence[str]) -> list[pa.Array]:
    if not columns:
        raise InvalidInput("a key needs at least one column")
    return [_normalize_key_array(_column(data, name, InvalidInput), name) for name in columns]


def _join_keys(arrays: list[pa.Array], columns: Sequence[str], n: int) -> pa.Array:
    parts: list[pa.Array | pa.Scalar] = []
    pending: list[np.ndarray] = []  # consecutive fixed-width columns, joined with one hstack
    for name, arr in zip(columns, arrays):
        if _is_variable(arr.type):
            if pending:
                parts.append(_binary_from_matrix(np.hstack(pending)))
                pending = []
            escaped = pc.replace_substring(arr.cast(pa.large_binary()), b"\x00", b"\x00\xff")
            parts.extend([escaped, _TERMINATOR])
        else:
            pending.append(_key_matrix(arr, name))
    if pending:
        parts.append(_binary_from_matrix(np.hstack(pending)))
    if n == 0:
        return pa.array([], pa.large_binary())
    if len(parts) == 1 and isinstance(parts[0], pa.Array):
        return parts[0]
    return pc.binary_join_element_wise(*parts, _EMPTY)


def encode_key_prefix(values: Mapping[str, Any] | pa.Table | pa.RecordBatch, columns: Sequence[str],
                      schema: pa.Schema | None = None) -> list[bytes]:
    """Keys of the leading key ``columns`` for prefix lookups; same encoding as :func:`encode_keys`.

    ``values`` is a Table/RecordBatch holding ``columns`` or a mapping ``column -> value`` (a scalar
    for one prefix, or a list of values for several). With ``schema`` (the table schema) values are
    cast to the key columns' types first, which a mapping of Python values needs to encode with the
    stored width; without it the mapping's Arrow types are inferred. Bad values raise InvalidInput.
    """
    if isinstance(values, (pa.Table, pa.RecordBatch)):
        table = values
    else:
        arrays = {}
        for name in columns:
            if name not in values:
                raise InvalidInput(f"prefix lookup needs a value for key column {name!r}")
            value = values[name]
            target = schema.field(name).type if schema is not None and name in schema.names else None
            if isinstance(value, (pa.Array, pa.ChunkedArray)):
                arrays[name] = value
                continue
            if not isinstance(value, (list, tuple, np.ndarray)):
                value = [value]
            try:
                arrays[name] = pa.array(value, type=target)
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError) as exc:
                raise InvalidInput(f"key column {name!r}: bad value {value!r}: {exc}") from exc
        if len({len(a) for a in arrays.values()}) > 1:
            raise InvalidInput("prefix lookup values have different lengths")
        table = pa.table(arrays)
    if schema is not None:
        for name in columns:
            if name not in schema.names:
                raise InvalidInput(f"{name!r} is not a column of the table")
            index = table.schema.get_field_index(name)
            want = schema.field(name).type
            if index >= 0 and table.schema.field(index).type != want:
                try:
                    table = table.set_column(index, name, pc.cast(table.column(index), want))
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                    raise InvalidInput(f"key column {name!r}: cannot use value as {want}: {exc}")
    return encode_keys(table, columns)


# ---- values -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Slot:
    """Where one column lives in the row header."""

    index: int  # position in the schema (and bit in the null bitmap)
    name: str
    type: pa.DataType
    start: int  # first header byte: the value (fixed) or its uint32 length (variable)
    width: int  # header bytes: the value width, or 4 for a variable column's length
    variable: bool


class RowCodec:
    """Encodes whole rows of ``schema`` to RocksDB values and back, nulls preserved.

    Supported types: bool, (u)int8..64, float16/32/64, date32/64, time32/64, timestamp (any unit
    and tz), duration, decimal128/256, fixed_size_binary, string, large_string, binary,
    large_binary. Anything else raises InvalidInput at construction.
    """

    def __init__(self, schema: pa.Schema, version: int | None = None) -> None:
        """``version``: every value starts with this schema version (:data:`VERSION_TAG`)."""
        self.schema = schema
        self.version = version
        self._prefix = 0 if version is None else VERSION_TAG.size
        self.tag = b"" if version is None else VERSION_TAG.pack(version)
        bitmap = (len(schema) + 7) // 8
        slots: list[_Slot] = []
        position = self._prefix + bitmap
        for index, f in enumerate(schema):
            width = _fixed_width(f.type)
            if width is None and not _is_variable(f.type):
                raise InvalidInput(f"column {f.name!r} has type {f.type}, which the KV store "
                                   "cannot hold")
            if width is not None:
                slots.append(_Slot(index, f.name, f.type, position, width, False))
                position += width
        for index, f in enumerate(schema):
            if _is_variable(f.type):
                slots.append(_Slot(index, f.name, f.type, position, 4, True))
                position += 4
        self._bitmap_bytes = bitmap
        self._header_size = position
        self._slots = {s.name: s for s in slots}
        self._variable = [s for s in slots if s.variable]  # schema order
        self._projections = Projections(schema, keep_metadata=True)  # decode's output schemas
        self._one_plans: dict[tuple[str, ...] | None, tuple[pa.Schema, tuple]] = {}  # decode_value's
        self._messages: dict[tuple[tuple[str, ...], bool], RowMessage] = {}  # row_message's

    # ---- encode ---------------------------------------------------------------------------
    def encode(self, data: pa.Table | pa.RecordBatch) -> list[bytes]:
        """One value per row holding every schema column (matched by name, cast if needed)."""
        n = data.num_rows
        if n == 0:
            return []
        header = np.zeros((n, self._header_size), np.uint8)
        if self._prefix:
            header[:, : self._prefix] = np.frombuffer(self.tag, np.uint8)
        nulls = None
        variable_parts: list[pa.Array] = []
        for slot in sorted(self._slots.values(), key=lambda s: s.start):
            arr = _column(data, slot.name, SchemaMismatch)
            if arr.type != slot.type:
                try:
                    arr = arr.cast(slot.type)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                    raise SchemaMismatch(f"column {slot.name!r}: {arr.type} does not fit "
                                         f"{slot.type}: {exc}") from exc
            null = arr.is_null().to_numpy(zero_copy_only=False) if arr.null_count else None
            if null is not None:
                if nulls is None:
                    nulls = np.zeros((n, self._bitmap_bytes * 8), bool)
                nulls[:, slot.index] = null
            end = slot.start + slot.width
            if not slot.variable:
                header[:, slot.start:end] = _le_matrix(arr, slot.width)
                if null is not None:
                    header[null, slot.start:end] = 0
                continue
            arr = arr.cast(pa.large_binary())
            lengths = pc.fill_null(pc.binary_length(arr), 0).to_numpy()
            if n and lengths.max() >= 1 << 32:
                raise InvalidInput(f"column {slot.name!r}: a value of 4 GiB or more")
            header[:, slot.start:end] = lengths.astype("<u4").view(np.uint8).reshape(n, 4)
            variable_parts.append(arr)
        if nulls is not None:
            header[:, self._prefix: self._prefix + self._bitmap_bytes] = np.packbits(
                nulls, axis=1, bitorder="little")
        head = _binary_from_matrix(header)
        if not variable_parts:
            return head.to_pylist()
        return pc.binary_join_element_wise(head, *variable_parts, _EMPTY,
                                           null_handling="skip").to_pylist()

    # ---- decode ---------------------------------------------------------------------------
    def decode(self, values: Sequence[bytes] | pa.Array | pa.ChunkedArray,
               columns: Sequence[str] | None = None) -> pa.Table:
        """The rows of ``values`` (from :meth:`encode`) as a Table of the codec's schema.

        With ``columns``, only those, in that order (other variable-width bytes are not read).
        Raises InvalidInput for an unknown column or a null value, CorruptData for bytes that do
        not match the layout.
        """
        names = list(self.schema.names if columns is None else columns)
        for name in names:
            if name not in self._slots:
                raise InvalidInput(f"{name!r} is not a column of {self.schema.names}")
        out_schema = self._projections.of(names)
        if isinstance(values, list) and 0 < len(values) <= _FEW_ROWS \
                and all(isinstance(v, bytes) for v in values):
            if len(values) == 1:
                return self._decode_one(values[0], *self._one_plan(names))
            return self._decode_few(values, names, out_schema)
        arr = _as_binary(values)
        n = len(arr)
        if n == 0:
            return out_schema.empty_table()
        if arr.null_count:
            raise InvalidInput("cannot decode a null row value")
        width = 8 if pa.types.is_large_binary(arr.type) else 4
        offsets = np.frombuffer(arr.buffers()[1], f"<i{width}", count=n + 1,
                                offset=arr.offset * width).astype(np.int64)
        data = arr.buffers()[2]
        data = np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)
        starts = offsets[:-1]
        sizes = offsets[1:] - starts
        size = self._header_size
        if (sizes < size).any():
            raise CorruptData(f"row value shorter than its {size}-byte header")
        header = _gather_rows(data, starts, size)
        # Where each variable column's bytes start, and a check the lengths add up exactly.
        var_start, var_length = {}, {}
        position = starts + size
        for slot in self._variable:
            var_start[slot.name] = position
            var_length[slot.name] = length = _lengths(header, slot)
            position = position + length
        if (position != offsets[1:]).any():
            raise CorruptData("row value length does not match its header")
        null_bits = None
        bitmap = header[:, self._prefix: self._prefix + self._bitmap_bytes]
        if self._bitmap_bytes and bitmap.any():
            null_bits = np.unpackbits(bitmap, axis=1, bitorder="little")
        variable = [self._slots[name] for name in names if self._slots[name].variable]
        gathered = _gather_variables(data, [var_start[s.name] for s in variable],
                                     [var_length[s.name] for s in variable]) if variable else None
        arrays = []
        for name in names:
            slot = self._slots[name]
            null = null_bits[:, slot.index].astype(bool) if null_bits is not None else None
            if slot.variable and gathered is not None:
                offsets, values = gathered[variable.index(slot)]
                arrays.append(_variable_array(offsets, values, slot.type, null))
            elif slot.variable:
                arrays.append(_gather_variable(data, var_start[name], var_length[name], slot.type, null))
            else:
                arrays.append(_fixed_array(header[:, slot.start: slot.start + slot.width],
                                           slot.type, null))
        return pa.Table.from_arrays(arrays, schema=out_schema)

    def decode_value(self, value: bytes, columns: Sequence[str] | None = None) -> pa.Table:
        """:meth:`decode` of one value (a point lookup's answer): the same table, checks and
        errors, by a per-projection plan (:meth:`_one_plan`) instead of per-call type checks."""
        return self._decode_one(value, *self._one_plan(columns))

    def row_message(self, columns: Sequence[str], key_index: bool = False) -> RowMessage:
        """The writer of one value's ``columns`` as an IPC record batch message (a single-key
        lookup's answer, :mod:`flightstore.kv.row_message`), made once per projection;
        ``key_index`` appends a non-null int32 column of 0."""
        key = (tuple(columns), key_index)
        writer = self._messages.get(key)
        if writer is None:
            for name in key[0]:
                if name not in self._slots:
                    raise InvalidInput(f"{name!r} is not a column of {self.schema.names}")
            writer = RowMessage([self._slots[name] for name in key[0]], self._variable, self._header_size,
                                self._prefix, key_index)
            if len(self._messages) < 64:
                self._messages[key] = writer
        return writer

    def _one_plan(self, columns: Sequence[str] | None) -> tuple[pa.Schema, tuple]:
        """The output schema of ``columns`` and, per column, what :meth:`_decode_one` does with
        the value's bytes, worked out once per projection (lookups ask for the same few)."""
        key = None if columns is None else tuple(columns)
        plan = self._one_plans.get(key)
        if plan is None:
            names = list(self.schema.names if columns is None else columns)
            for name in names:
                if name not in self._slots:
                    raise InvalidInput(f"{name!r} is not a column of {self.schema.names}")
            steps = []
            for name in names:
                slot = self._slots[name]
                byte, bit = divmod(slot.index, 8)
                if slot.variable:
                    kind = _ONE_VARIABLE
                    offsets = _ONE_OFFSETS[pa.types.is_large_string(slot.type) or pa.types.is_large_binary(slot.type)]
                else:
                    kind = _ONE_BOOLEAN if pa.types.is_boolean(slot.type) else _ONE_FIXED
                    offsets = None
                steps.append((kind, slot.type, self._prefix + byte, 1 << bit, slot.start,
                              slot.start + slot.width, self._variable.index(slot) if slot.variable else -1,
                              offsets))
            plan = (self._projections.of(names), tuple(steps))
            if len(self._one_plans) < 64:
                self._one_plans[key] = plan
        return plan

    def _decode_one(self, value: bytes, out_schema: pa.Schema, steps: tuple) -> pa.Table:
        """:meth:`_decode_few` of one row, each column's buffers cut straight from the value: no
        per-row lists or joins. Same layout, same checks, same arrays."""
        spans = value_spans(value, self._header_size, self._variable)
        arrays = []
        for kind, type_, validity_byte, validity_bit, start, end, variable, offsets in steps:
            validity = _ONE_NULL if value[validity_byte] & validity_bit else None
            if kind is _ONE_FIXED:
                arrays.append(pa.Array.from_buffers(type_, 1, [validity, pa.py_buffer(value[start:end])]))
            elif kind is _ONE_VARIABLE:
                begin, length = spans[variable]
                arrays.append(pa.Array.from_buffers(type_, 1, [
                    validity, pa.py_buffer(offsets.pack(0, length)), pa.py_buffer(value[begin:begin + length])]))
            else:
                arrays.append(pa.Array.from_buffers(type_, 1, [
                    validity, _ONE_TRUE if value[start] != 0 else _ONE_NULL]))
        return pa.Table.from_arrays(arrays, schema=out_schema)

    def _decode_few(self, values: list[bytes], names: list[str], out_schema: pa.Schema) -> pa.Table:
        """:meth:`decode` for a handful of rows (point lookups): slicing the bytes of each row
        costs less than the vectorized path's fixed numpy set-up. Same layout, same checks."""
        size = self._header_size
        variable: dict[str, list[tuple[int, int]]] = {s.name: [] for s in self._variable}
        for value in values:
            if len(value) < size:
                raise CorruptData(f"row value shorter than its {size}-byte header")
            position = size
            for slot in self._variable:
                length = _U32.unpack_from(value, slot.start)[0]
                variable[slot.name].append((position, length))
                position += length
            if position != len(value):
                raise CorruptData("row value length does not match its header")
        n = len(values)
        arrays = []
        for name in names:
            slot = self._slots[name]
            validity = None
            byte, bit = divmod(slot.index, 8)
            byte += self._prefix
            present = [not (value[byte] >> bit) & 1 for value in values]
            if not all(present):
                validity = pa.py_buffer(_pack_bits(present))
            if slot.variable:
                spans = variable[name]
                offsets, total = [0], 0
                for _, length in spans:
                    total += length
                    offsets.append(total)
                large = pa.types.is_large_string(slot.type) or pa.types.is_large_binary(slot.type)
                if not large and total >= 1 << 31:
                    raise InvalidInput(f"{total} bytes of {slot.type} in one batch; use the large_ type")
                packed = struct.pack(f"<{n + 1}{'q' if large else 'i'}", *offsets)
                data = b"".join(value[start:start + length]
                                for value, (start, length) in zip(values, spans))
                arrays.append(pa.Array.from_buffers(slot.type, n, [validity, pa.py_buffer(packed),
                                                                   pa.py_buffer(data)]))
            elif pa.types.is_boolean(slot.type):
                bits = _pack_bits([value[slot.start] != 0 for value in values])
                arrays.append(pa.Array.from_buffers(slot.type, n, [validity, pa.py_buffer(bits)]))
            else:
                end = slot.start + slot.width
                data = b"".join(value[slot.start:end] for value in values)
                arrays.append(pa.Array.from_buffers(slot.type, n, [validity, pa.py_buffer(data)]))
        return pa.Table.from_arrays(arrays, schema=out_schema)


_ONE_NULL = pa.py_buffer(b"\x00")  # the bitmap of one value that is null (validity) or false
_ONE_TRUE = pa.py_buffer(b"\x01")
_ONE_OFFSETS = {False: struct.Struct("<2i"), True: struct.Struct("<2q")}  # one value's offsets
_ONE_FIXED, _ONE_VARIABLE, _ONE_BOOLEAN = "fixed", "variable", "boolean"  # RowCodec._one_plan's kinds


def _pack_bits(flags: list[bool]) -> bytes:
    """An Arrow (little-endian) bitmap of ``flags``."""
    word = 0
    for position, flag in enumerate(flags):
        if flag:
            word |= 1 << position
    return word.to_bytes((len(flags) + 7) // 8, "little")


def _as_binary(values: Sequence[bytes] | pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if not isinstance(values, pa.Array):
        try:
            return pa.array(values if isinstance(values, list) else list(values), pa.large_binary())
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as exc:
            raise InvalidInput(f"row values must be bytes: {exc}") from exc
    if not (pa.types.is_binary(values.type) or pa.types.is_large_binary(values.type)):
        raise InvalidInput(f"row values must be binary, not {values.type}")
    return values


def _lengths(header: np.ndarray, slot: _Slot) -> np.ndarray:
    block = np.ascontiguousarray(header[:, slot.start: slot.start + 4])
    return block.view("<u4").ravel().astype(np.int64)


# Bytes gathered per step of a vectorized gather: its index array takes 8 bytes per byte gathered.
_GATHER_BYTES = 256 << 10


def _blocks(offsets: np.ndarray) -> Iterator[tuple[int, int]]:
    """``(first, stop)`` row ranges of about :data:`_GATHER_BYTES` bytes each (``offsets``: the
    rows' cumulative sizes, ``n + 1`` of them); a row bigger than that is a block of its own."""
    n = len(offsets) - 1
    first = 0
    while first < n:
        stop = int(np.searchsorted(offsets, offsets[first] + _GATHER_BYTES, side="right")) - 1
        stop = min(n, max(stop, first + 1))
        yield first, stop
        first = stop


def _gather_rows(data: np.ndarray, starts: np.ndarray, size: int) -> np.ndarray:
    """The ``size`` bytes at each of ``starts`` in ``data``, as an ``n x size`` block, gathered a
    block of rows at a time (one index of ``n x size`` int64 would take 8 times the block)."""
    n = len(starts)
    out = np.empty((n, size), np.uint8)
    step = max(1, _GATHER_BYTES // max(1, size))
    span = np.arange(size)
    for first in range(0, n, step):
        out[first:first + step] = data[starts[first:first + step, None] + span]
    return out


def _fixed_array(block: np.ndarray, t: pa.DataType, null: np.ndarray | None) -> pa.Array:
    """An Arrow array from an ``n x width`` block of little-endian value bytes."""
    n = block.shape[0]
    if pa.types.is_boolean(t):
        values = pa.py_buffer(np.packbits(block[:, 0] != 0, bitorder="little"))
    else:
        values = pa.py_buffer(np.ascontiguousarray(block))
    return pa.Array.from_buffers(t, n, [_validity(null), values])


def _gather_variables(data: np.ndarray, starts: list[np.ndarray], lengths: list[np.ndarray]
                      ) -> list[tuple[np.ndarray, np.ndarray]] | None:
    """The bytes of several variable-width columns (each ``lengths[i]`` at ``starts[i]``) gathered
    by one index, column after column: each column's ``(offsets from 0, bytes)``. A gather costs
    the same ~10 numpy calls for one column as for all, so a lookup of a few dozen rows gathers
    its strings once, not once per column. None when the bytes are more than one block's
    (:data:`_GATHER_BYTES`): :func:`_gather_variable` then gathers each column in blocks."""
    n = len(starts[0])
    all_lengths = np.concatenate(lengths) if len(lengths) > 1 else lengths[0]
    offsets = np.zeros(len(all_lengths) + 1, np.int64)
    np.cumsum(all_lengths, out=offsets[1:])
    total = int(offsets[-1])
    if total > _GATHER_BYTES:
        return None
    all_starts = np.concatenate(starts) if len(starts) > 1 else starts[0]
    gathered = data[np.repeat(all_starts - offsets[:-1], all_lengths) + np.arange(total)]
    out = []
    for i in range(len(starts)):
        column = offsets[i * n: (i + 1) * n + 1]
        base = int(column[0])
        out.append((column - base, gathered[base: int(column[-1])]))
    return out


def _variable_array(offsets: np.ndarray, values: np.ndarray, t: pa.DataType,
                    null: np.ndarray | None) -> pa.Array:
    """An Arrow array of type ``t`` (string/binary, large or not) from int64 ``offsets`` (from 0)
    and the values' bytes. A non-large ``t``'s offsets must fit int32: :func:`_gather_variable`
    checks that, and :func:`_gather_variables` gathers at most :data:`_GATHER_BYTES`."""
    large = pa.types.is_large_string(t) or pa.types.is_large_binary(t)
    return pa.Array.from_buffers(t, len(offsets) - 1, [_validity(null),
                                                       pa.py_buffer(offsets if large else offsets.astype(np.int32)),
                                                       pa.py_buffer(values)])


def _gather_variable(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray, t: pa.DataType,
                     null: np.ndarray | None) -> pa.Array:
    """Gather one variable-width column's bytes (``lengths`` at ``starts``) into an Arrow array."""
    n = len(lengths)
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    total = int(offsets[-1])
    large = pa.types.is_large_string(t) or pa.types.is_large_binary(t)
    if not large and total >= 1 << 31:
        raise InvalidInput(f"{total} bytes of {t} in one batch; use the large_ type or fewer rows")
    if total == 0:
        gathered = np.zeros(0, np.uint8)
    elif (starts[1:] == starts[:-1] + lengths[:-1]).all():
        gathered = data[starts[0]: starts[0] + total]  # already contiguous (one row, ...)
    else:
        gathered = np.empty(total, np.uint8)
        # an int64 index per byte gathered: a block of rows at a time bounds it
        for first, stop in _blocks(offsets):
            base = offsets[first]
            gathered[base:offsets[stop]] = data[np.repeat(starts[first:stop] - (offsets[first:stop] - base),
                                                          lengths[first:stop]) + np.arange(offsets[stop] - base)]
    return _variable_array(offsets, gathered, t, null)
