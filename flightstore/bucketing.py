"""Vectorized bucket assignment: ``bucket = murmur3_32(key) & 0x7FFFFFFF % buckets``.

For a single-column bucket key this is exactly Iceberg's ``bucket[N]`` transform (murmur3 x86 32-bit,
seed 0, over the little-endian long of ints/dates/timestamps and the UTF-8 bytes of strings), so the
lake can be partitioned the same way. Multi-column keys combine the column hashes as
``h = h * 31 + h_i`` (mod 2**32). Everything runs in numpy over whole columns: the only loop is over
4-byte blocks of the longest string, never over rows.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flightstore.errors import InvalidInput

__all__ = ["murmur3_32", "hash_column", "bucket_ids", "integer_bucket"]

_C1, _C2 = np.uint32(0xCC9E2D51), np.uint32(0x1B873593)
_MASK32 = np.uint64(0xFFFFFFFF)


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def _mix_k(k: np.ndarray) -> np.ndarray:
    k = k * _C1
    k = _rotl(k, 15)
    return k * _C2


def _mix_h(h: np.ndarray, k: np.ndarray) -> np.ndarray:
    h = h ^ _mix_k(k)
    h = _rotl(h, 13)
    return h * np.uint32(5) + np.uint32(0xE6546B64)


def _fmix(h: np.ndarray, length: np.ndarray) -> np.ndarray:
    h = h ^ length.astype(np.uint32)
    h ^= h >> np.uint32(16)
    h = h * np.uint32(0x85EBCA6B)
    h ^= h >> np.uint32(13)
    h = h * np.uint32(0xC2B2AE35)
    h ^= h >> np.uint32(16)
    return h


_SCALAR_ROWS = 8  # up to this many keys (point lookups), plain Python beats numpy's call overhead
_M32 = 0xFFFFFFFF


def _mix_h_int(h: int, k: int) -> int:
    k = (k * 0xCC9E2D51) & _M32
    k = ((k << 15) | (k >> 17)) & _M32
    h ^= (k * 0x1B873593) & _M32
    h = ((h << 13) | (h >> 19)) & _M32
    return (h * 5 + 0xE6546B64) & _M32


def _hash_long_int(value: int) -> int:
    """murmur3_32 of one int64 as 8 little-endian bytes (the scalar twin of :func:`_hash_longs`)."""
    unsigned = value & 0xFFFFFFFFFFFFFFFF
    h = _mix_h_int(_mix_h_int(0, unsigned & _M32), unsigned >> 32) ^ 8
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _M32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _M32
    return h ^ (h >> 16)


def _hash_longs(values: np.ndarray) -> np.ndarray:
    """murmur3_32 of each int64 as 8 little-endian bytes."""
    if len(values) <= _SCALAR_ROWS:
        return np.array([_hash_long_int(int(v)) for v in values], dtype=np.uint32)
    # Both 4-byte blocks of every value mixed by one call per step, then folded into ``h`` in
    # place: the same arithmetic as _mix_h and _fmix in half the numpy calls (a lookup of a few
    # dozen keys pays per call, not per key).
    blocks = np.ascontiguousarray(values, dtype="<i8").view("<u4").reshape(-1, 2)
    with np.errstate(over="ignore"):
        k = blocks * _C1
        k = (k << np.uint32(15)) | (k >> np.uint32(17))
        k *= _C2
        h = k[:, 0]  # h = 0 ^ k0
        for second in (False, True):
            if second:
                h ^= k[:, 1]
            h = (h << np.uint32(13)) | (h >> np.uint32(19))
            h *= np.uint32(5)
            h += np.uint32(0xE6546B64)
        h ^= np.uint32(8)  # the length
        h ^= h >> np.uint32(16)
        h *= np.uint32(0x85EBCA6B)
        h ^= h >> np.uint32(13)
        h *= np.uint32(0xC2B2AE35)
        h ^= h >> np.uint32(16)
        return h


def _hash_binary(array: pa.Array) -> np.ndarray:
    """murmur3_32 of each value's bytes (binary or UTF-8 string array without nulls)."""
    array = pc.cast(array, pa.large_binary()) if not pa.types.is_large_binary(array.type) else array
    n = len(array)
    offsets = np.frombuffer(array.buffers()[1], dtype=np.int64)[array.offset: array.offset + n + 1]
    data_buf = array.buffers()[2]
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    starts = offsets[:-1]
    lengths = (offsets[1:] - starts).astype(np.int64)
    h = np.zeros(n, dtype=np.uint32)
    if n == 0:
        return h
    width = int(lengths.max()) if n else 0
    width4 = (width + 3) // 4 * 4 or 4
    with np.errstate(over="ignore"):
        # Process in slabs of rows so a few long values cannot blow up memory.
        slab = max(1, (1 << 24) // width4)
        for lo in range(0, n, slab):
            hi = min(n, lo + slab)
            cols = np.arange(width4, dtype=np.int64)
            positions = starts[lo:hi, None] + cols[None, :]
            inside = cols[None, :] < lengths[lo:hi, None]
            matrix = np.where(inside, data[np.minimum(positions, max(len(data) - 1, 0))]
                              if len(data) else 0, 0).astype(np.uint8)
            blocks = np.ascontiguousarray(matrix).view("<u4")
            nblocks = lengths[lo:hi] // 4
            hh = h[lo:hi]
            for j in range(width4 // 4):
                active = j < nblocks
                if not active.any():
                    break
                hh = np.where(active, _mix_h(hh, blocks[:, j].astype(np.uint32)), hh)
            rem = lengths[lo:hi] % 4
            tail = blocks[np.arange(hi - lo), np.minimum(nblocks, width4 // 4 - 1)].astype(np.uint32)
            hh = np.where(rem > 0, hh ^ _mix_k(tail), hh)
            h[lo:hi] = _fmix(hh, lengths[lo:hi])
    return h


def murmur3_32(data: bytes) -> int:
    """murmur3_32 of one byte string (for tests and single keys)."""
    return int(_hash_binary(pa.array([data], pa.binary()))[0])


def hash_column(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """The Iceberg-compatible murmur3 hash of every value of a key column (no nulls allowed)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if column.null_count:
        raise InvalidInput("bucket key columns must not contain nulls")
    t = column.type
    if pa.types.is_uint64(t):  # its 8 bytes as they are (values past 2**63 have no int64 cast)
        return _hash_longs(column.view(pa.int64()).to_numpy(zero_copy_only=False))
    if t == pa.int64():  # as it is: no cast (a lookup's keys, most often)
        return _hash_longs(column.to_numpy())
    if pa.types.is_integer(t) or pa.types.is_boolean(t):
        return _hash_longs(pc.cast(column, pa.int64()).to_numpy(zero_copy_only=False))
    if pa.types.is_date32(t):
        return _hash_longs(column.view(pa.int32()).to_numpy(zero_copy_only=False).astype(np.int64))
    if pa.types.is_timestamp(t):
        micros = pc.cast(column, pa.timestamp("us", tz=t.tz), safe=False)
        return _hash_longs(micros.view(pa.int64()).to_numpy(zero_copy_only=False))
    if pa.types.is_time(t):
        micros = pc.cast(column, pa.time64("us"), safe=False)
        return _hash_longs(micros.view(pa.int64()).to_numpy(zero_copy_only=False))
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) \
            or pa.types.is_large_binary(t):
        return _hash_binary(column)
    if pa.types.is_floating(t):
        # The key encoding stores -0.0 as 0.0 (one key), so both must land in one bucket.
        column = pc.if_else(pc.equal(column, 0), pa.scalar(0, t), column)
    # Other types (decimal, float): hash the canonical string form.
    return _hash_binary(pc.cast(column, pa.string()))


def bucket_ids(data: pa.Table | pa.RecordBatch, key_columns: Sequence[str], num_buckets: int) -> np.ndarray:
    """The bucket (0..num_buckets-1, int32) of every row of ``data`` by its bucket key columns."""
    if num_buckets == 1 or not key_columns:
        return np.zeros(data.num_rows, dtype=np.int32)
    if data.num_rows <= _SCALAR_ROWS and all(pa.types.is_integer(data.schema.field(name).type)
                                             for name in key_columns):
        return _small_integer_bucket_ids(data, key_columns, num_buckets)
    combined: np.ndarray | None = None
    with np.errstate(over="ignore"):
        for name in key_columns:
            h = hash_column(data.column(name))
            combined = h if combined is None else combined * np.uint32(31) + h
    assert combined is not None
    return ((combined & np.uint32(0x7FFFFFFF)) % np.uint32(num_buckets)).astype(np.int32)


def _small_integer_bucket_ids(data: pa.Table | pa.RecordBatch, key_columns: Sequence[str],
                              num_buckets: int) -> np.ndarray:
    """:func:`bucket_ids` of a few rows of integer keys (point lookups) in plain Python."""
    columns = [data.column(name).to_pylist() for name in key_columns]
    if any(None in values for values in columns):
        raise InvalidInput("bucket key columns must not contain nulls")
    return np.array([integer_bucket(row, num_buckets) for row in zip(*columns)], dtype=np.int32)


def integer_bucket(values: Sequence[int], num_buckets: int) -> int:
    """The bucket of one row whose bucket key columns are integers, given as Python ints in key
    column order (non-null): :func:`bucket_ids` of that row, without building arrays."""
    if num_buckets == 1:
        return 0
    combined = 0
    for index, value in enumerate(values):
        h = _hash_long_int(value)
        combined = h if index == 0 else (combined * 31 + h) & _M32
    return (combined & 0x7FFFFFFF) % num_buckets
