"""Fixed-width Arrow arrays to numpy and back through their buffers, without pandas.

pyarrow imports pandas the first time it converts to or from numpy or Python objects
(``Array.to_numpy``, ``pa.array``, ``pa.scalar``, ``fill_null(0)``): about half a second of CPU in
every fresh Spark Python worker, where the stream writer's fold is the only numpy user. Reading
and building the buffers directly costs nothing of the sort and copies no more than pyarrow would.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

__all__ = ["from_numpy", "to_numpy", "valid_mask"]


def _dtype(kind: pa.DataType) -> np.dtype:
    if pa.types.is_floating(kind) and not pa.types.is_float16(kind):
        letter = "f"
    elif pa.types.is_signed_integer(kind):
        letter = "i"
    elif pa.types.is_unsigned_integer(kind):
        letter = "u"
    else:
        raise TypeError(f"not a fixed-width number type: {kind}")
    return np.dtype(f"<{letter}{kind.bit_width // 8}")


def to_numpy(array: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """The values of an integer or floating-point ``array`` (read-only; what stands under a null is
    unspecified: see :func:`valid_mask`)."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    dtype = _dtype(array.type)
    if len(array) == 0:
        return np.empty(0, dtype)
    return np.frombuffer(array.buffers()[1], dtype, count=len(array), offset=array.offset * dtype.itemsize)


def valid_mask(array: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """True where ``array`` holds a value, False where it holds a null."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if array.null_count == 0:
        return np.ones(len(array), dtype=bool)
    bits = np.unpackbits(np.frombuffer(array.buffers()[0], np.uint8), bitorder="little")
    return bits[array.offset:array.offset + len(array)].astype(bool)


def from_numpy(values: np.ndarray, valid: np.ndarray | None = None) -> pa.Array:
    """An Arrow array of the numbers ``values`` (one-dimensional), null where ``valid`` is False."""
    values = np.ascontiguousarray(values)
    if values.dtype.kind not in "iuf":
        raise TypeError(f"not a fixed-width number dtype: {values.dtype}")
    kind = pa.from_numpy_dtype(values.dtype)
    if valid is None or valid.all():
        return pa.Array.from_buffers(kind, len(values), [None, pa.py_buffer(values)], null_count=0)
    bitmap = pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.Array.from_buffers(kind, len(values), [bitmap, pa.py_buffer(values)],
                                 null_count=int(len(values) - np.count_nonzero(valid)))
