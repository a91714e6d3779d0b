"""The columnar image of a KV snapshot: one bucket's rows at one log offset, as an Arrow IPC file.

Iterating RocksDB from Python costs about 0.3 s per million values before any decoding, far more
than reading the same rows from a columnar file; so every KV snapshot also writes its rows once, in
key order, as an Arrow IPC *file* (``image.arrow``), and full scans read that (memory-mapped,
column-pruned, batches skipped by statistics) instead of RocksDB.

Layout: the table's columns in schema order, then the encoded primary key (the RocksDB key, a
``large_binary`` column named :data:`KEY_COLUMN`, always addressed by position), in record batches
of :data:`IMAGE_BATCH_ROWS` rows sorted by that key. Per-batch row counts and min/max/null-count
statistics (the log's format, :func:`flightstore.log.record.compute_statistics`) and a CRC32 of the
whole file are kept in the snapshot's manifest, not in the file, so a reader plans its batch skips
without touching the data. The CRC is checked once per process, the first time an image is opened.

Writing takes row values in key order (a RocksDB checkpoint's iterator) and holds one batch in
memory at a time.
"""

from __future__ import annotations

import itertools
import os
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from flightstore import memory
from flightstore.errors import Cancelled, CorruptData
from flightstore.expressions import ColumnStats, Predicate
from flightstore.kv.encoding import RowCodec, encode_key_array
from flightstore.log.record import compute_statistics, statistics_from_json

__all__ = ["IMAGE_BATCH_ROWS", "KEY_COLUMN", "Image", "ImageInfo", "image_schema", "write_image"]

IMAGE_BATCH_ROWS = 65_536
KEY_COLUMN = "__key"
_CRC_CHUNK = 8 * 1024 * 1024


def image_schema(schema: pa.Schema) -> pa.Schema:
    """The image's schema: the table's columns, then the encoded key."""
    return schema.remove_metadata().append(pa.field(KEY_COLUMN, pa.large_binary(), nullable=False))


@dataclass(frozen=True)
class ImageInfo:
    """What the manifest records about an image: size, CRC and per-batch rows and statistics."""

    bytes: int
    crc32: int
    batch_rows: tuple[int, ...]
    batch_stats: tuple[dict, ...]  # JSON statistics per batch, as the log stores them

    @property
    def rows(self) -> int:
        return sum(self.batch_rows)

    def to_json(self) -> dict:
        return {"bytes": self.bytes, "crc32": self.crc32,
                "batches": [{"rows": r, "stats": s} for r, s in zip(self.batch_rows, self.batch_stats)]}

    @classmethod
    def from_json(cls, data: dict) -> ImageInfo:
        batches = data["batches"]
        return cls(int(data["bytes"]), int(data["crc32"]), tuple(int(b["rows"]) for b in batches),
                   tuple(dict(b["stats"]) for b in batches))


def write_image(path: Path, values: Iterable[bytes], codec: RowCodec, primary_key: Sequence[str],
                statistics_columns: Sequence[str], *, stop: Callable[[], bool] | None = None,
                fsync: bool = True) -> ImageInfo:
    """Write the rows of ``values`` (RocksDB row values in key order) as an image.

    One batch of :data:`IMAGE_BATCH_ROWS` rows (fewer when they are wide: at most
    :func:`flightstore.memory.batch_bytes`) is decoded and written at a time; its key column is
    re-encoded from the decoded ``primary_key`` columns (a RocksDB key is exactly that encoding),
    so RocksDB is iterated for values only. ``stop`` is polled between batches; when it answers
    True the write ends with :class:`Cancelled` (the caller deletes the partial file). The file is
    fsynced before this returns (``fsync``).
    """
    schema = image_schema(codec.schema)
    columns = [c for c in statistics_columns if c in codec.schema.names]
    rows: list[int] = []
    stats: list[dict] = []
    iterator = iter(values)
    size = memory.batch_rows(codec.schema, IMAGE_BATCH_ROWS)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
        while True:
            if stop is not None and stop():
                raise Cancelled(f"writing the KV image {path} was stopped")
            chunk = list(itertools.islice(iterator, size))
            if not chunk:
                break
            # wide rows make short batches: one batch is decoded in memory at a time
            size = memory.rows_within(memory.value_bytes(chunk) / len(chunk), IMAGE_BATCH_ROWS)
            table = codec.decode(chunk)
            arrays = [column.combine_chunks() for column in table.columns]
            arrays.append(encode_key_array(table, primary_key))
            batch = pa.RecordBatch.from_arrays(arrays, schema=schema)
            writer.write_batch(batch)
            rows.append(batch.num_rows)
            stats.append(compute_statistics(batch, columns))
    size = os.path.getsize(path)
    if fsync:
        _fsync(path)
    return ImageInfo(size, _crc32(path, size), tuple(rows), tuple(stats))


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _crc32(path: Path, size: int) -> int:
    if size == 0:
        return 0
    with pa.memory_map(str(path), "r") as source:
        data = source.read_buffer(size)
    crc = 0
    view = memoryview(data)
    for start in range(0, size, _CRC_CHUNK):
        crc = zlib.crc32(view[start:start + _CRC_CHUNK], crc)
    return crc


def _readable_as(stored: pa.Schema, wanted: pa.Schema) -> bool:
    """Whether an image file of schema ``stored`` reads as ``wanted``: the same table columns in
    order, or those of an older schema version (a prefix of them, types equal or widened since)."""
    if stored.equals(wanted):
        return True
    if len(stored) > len(wanted) or stored.names[-1] != KEY_COLUMN:
        return False
    from flightstore.alter import widens_losslessly
    return all(s.name == w.name and widens_losslessly(s.type, w.type)
               for s, w in zip(list(stored)[:-1], list(wanted)[:-1]))


class Image:
    """A memory-mapped image: record batches by position, with their statistics for skipping.

    Opening maps the file, checks its size, CRC and batch layout against ``info`` and raises
    :class:`CorruptData` when they disagree; the mapping lives as long as the object (and any
    batch handed out from it).
    """

    def __init__(self, path: Path, info: ImageInfo, schema: pa.Schema) -> None:
        self.path = path
        self.info = info
        self.schema = image_schema(schema)
        self._stats: list[dict[str, ColumnStats]] = [statistics_from_json(s) for s in info.batch_stats]
        try:
            size = os.path.getsize(path)
            if size != info.bytes:
                raise CorruptData(f"KV image {path} holds {size} bytes, its manifest says {info.bytes}")
            if _crc32(path, size) != info.crc32:
                raise CorruptData(f"KV image {path} fails its CRC check")
            self._reader = pa.ipc.open_file(pa.memory_map(str(path), "r"))
        except (OSError, pa.ArrowInvalid) as exc:
            raise CorruptData(f"KV image {path} cannot be read: {exc}") from None
        stored = self._reader.schema
        if not _readable_as(stored, self.schema) or self._reader.num_record_batches != len(info.batch_rows):
            raise CorruptData(f"KV image {path} does not match its manifest (schema or batches)")
        # An image written before ALTER TABLE holds the columns of its schema version: columns
        # added since read as NULL, widened ones are cast (positions: stored, -1 when added later).
        self._positions = [stored.get_field_index(f.name) for f in self.schema][:-1] + [len(stored) - 1]
        self._current = stored.equals(self.schema)

    @property
    def num_batches(self) -> int:
        return len(self.info.batch_rows)

    @property
    def key_index(self) -> int:
        """The position of the encoded-key column."""
        return len(self.schema) - 1

    def batches(self, fields: Sequence[int], filter: Predicate | None = None
                ) -> Iterator[pa.RecordBatch]:
        """Every batch (only the fields at positions ``fields``) whose statistics say ``filter``
        might match; rows are not filtered here."""
        for index in range(self.num_batches):
            if filter is not None and not filter.might_match(self._stats[index]):
                continue
            try:
                batch = self._reader.get_batch(index)
            except (OSError, pa.ArrowInvalid) as exc:
                raise CorruptData(f"KV image {self.path}: batch {index} cannot be read: {exc}") from None
            if self._current:
                yield batch.select(list(fields))
            else:
                yield self._conformed(batch, fields)

    def _conformed(self, batch: pa.RecordBatch, fields: Sequence[int]) -> pa.RecordBatch:
        arrays = []
        for field in fields:
            position, target = self._positions[field], self.schema.field(field)
            if position < 0:
                arrays.append(pa.nulls(batch.num_rows, target.type))
            else:
                column = batch.column(position)
                arrays.append(column if column.type == target.type else column.cast(target.type))
        return pa.RecordBatch.from_arrays(arrays, schema=pa.schema([self.schema.field(f) for f in fields]))
