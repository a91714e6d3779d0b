"""Append-only segment files of Arrow record batches: record format, CRC checks, offset index.

A bucket's log is a directory of segments. A segment is named by the offset of its first row,
zero-padded to 20 digits: ``00000000000000000000.log`` with its offset index
``00000000000000000000.index`` next to it.

Record format (little-endian), one record per appended batch::

    fixed header, 58 bytes (struct ``<4sBBHqIqqHIQII``)
      magic          4s   b"FSLB"
      version        u8   1
      flags          u8   bit 0: writer id present, bit 1: sequence present
      padding        u16  zero bytes between the statistics and the payload, so that every payload
                          starts 64-byte aligned in the file (zero-copy reads from a memory map)
      base_offset    i64  offset of the record's first row
      num_rows       u32
      timestamp_ms   i64  commit time, ms since the epoch
      sequence       i64  the writer's batch sequence (0 when absent)
      writer_len     u16  length of the UTF-8 writer id
      stats_len      u32  length of the statistics JSON
      payload_len    u64  length of the payload
      payload_crc    u32  zlib.crc32 of the payload
      header_crc     u32  zlib.crc32 of the 54 bytes before it + writer id + statistics
    writer id      writer_len bytes, UTF-8
    statistics     stats_len bytes, JSON ``{column: [min, max, null_count, row_count]}`` with values
                   encoded by :mod:`flightstore.expressions`' literal encoding
    padding        padding zero bytes
    payload        payload_len bytes: an Arrow IPC *file* holding exactly one record batch, its
                   buffers compressed per the tablet's compression (NONE / LZ4_FRAME / ZSTD)

The payload is an IPC file (not a stream) because its footer lets the reader fetch only the buffers
of the requested columns: :meth:`Segment.read_batch` opens it through a counting positional reader,
so a k-of-n column read of a compressed log touches about k/n of the bytes (and ``bytes_read`` proves
it). Uncompressed payloads are decoded in place from a memory map against the tablet's schema: only
the requested columns' buffers are kept (and paged in when used), and ``bytes_read`` counts those.

Index format: fixed-width 16-byte entries ``<qQ`` (base_offset, file position), one per record.
The index is advisory: on open the segment's headers are walked anyway (they carry the statistics
and writer ids kept in memory), the index is compared with the walk and rewritten when missing or
inconsistent. Reads seek through the in-memory copy, never scanning the segment.

Recovery: the last segment of a log (the only one that can hold a torn write) is opened with
``verify=True``: every record's header and payload CRC is checked and the file is truncated at the end
of the last record that checks. Earlier segments are trusted; a bad header there is
:class:`~flightstore.errors.CorruptData`. Payload CRCs are not re-checked on reads.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from flightstore.errors import CorruptData, InvalidInput
from flightstore.expressions import ColumnStats, _decode_value, _encode_value

__all__ = [
    "MAGIC", "FORMAT_VERSION", "HEADER", "COMPRESSIONS", "RecordHeader", "Segment",
    "encode_payload", "encode_record", "compute_statistics", "statistics_from_json", "segment_name",
]

MAGIC = b"FSLB"
FORMAT_VERSION = 1
HEADER = struct.Struct("<4sBBHqIqqHIQII")
INDEX_ENTRY = struct.Struct("<qQ")
_FLAG_WRITER = 1
_FLAG_SEQUENCE = 2
_MAX_WRITER_ID = 0xFFFF
_MAX_STAT_LENGTH = 256
COMPRESSIONS: dict[str, str | None] = {"NONE": None, "LZ4_FRAME": "lz4", "ZSTD": "zstd"}


def segment_name(base_offset: int) -> str:
    """The file stem of the segment starting at ``base_offset``."""
    return f"{base_offset:020d}"


@dataclass(frozen=True)
class RecordHeader:
    """The decoded header of one record plus where it sits in its segment file."""

    base_offset: int
    num_rows: int
    timestamp_ms: int
    writer_id: str | None
    sequence: int | None
    stats: Mapping[str, ColumnStats]
    position: int          # file position of the fixed header
    payload_position: int  # file position of the payload
    payload_len: int
    payload_crc: int

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.num_rows

    @property
    def end_position(self) -> int:
        return self.payload_position + self.payload_len


def compute_statistics(batch: pa.RecordBatch, columns: Sequence[str]) -> dict[str, list]:
    """JSON-ready ``{column: [min, max, null_count, row_count]}`` for ``columns`` of ``batch``.

    Columns whose type has no min/max (nested types), whose values cannot be JSON-encoded
    (nanosecond timestamps) or whose extremes are long strings/binaries (over
    ``_MAX_STAT_LENGTH``, to keep headers small) get no statistics: readers then assume any value
    might be present.
    """
    stats: dict[str, list] = {}
    for name in columns:
        column = batch.column(name)
        try:
            extremes = pc.min_max(column)
            low, high = extremes["min"].as_py(), extremes["max"].as_py()
            if any(isinstance(v, (str, bytes)) and len(v) > _MAX_STAT_LENGTH for v in (low, high)):
                continue
            stats[name] = [_encode_value(low), _encode_value(high), column.null_count,
                           len(column)]
        except (pa.ArrowException, InvalidInput, ValueError, TypeError, OverflowError):
            continue
    return stats


def statistics_from_json(stats: Mapping[str, list]) -> dict[str, ColumnStats]:
    """Inverse of :func:`compute_statistics`: ``{column: ColumnStats}``."""
    return {name: ColumnStats(_decode_value(v[0]), _decode_value(v[1]), int(v[2]), int(v[3]))
            for name, v in stats.items()}


def _decode_statistics(raw: bytes) -> dict[str, ColumnStats]:
    return statistics_from_json(json.loads(raw)) if raw else {}


def encode_payload(batch: pa.RecordBatch, compression: str = "NONE") -> pa.Buffer:
    """``batch`` as the bytes of a one-batch Arrow IPC file, compressed per ``compression``."""
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=COMPRESSIONS[compression])
    with pa.ipc.new_file(sink, batch.schema, options=options) as writer:
        writer.write_batch(batch)
    return sink.getvalue()


PAYLOAD_ALIGNMENT = 64
DECODED_RECORDS_PER_SEGMENT = 4096


def encode_record(base_offset: int, num_rows: int, timestamp_ms: int, writer_id: str | None,
                  sequence: int | None, stats: Mapping[str, list], payload: pa.Buffer,
                  position: int = 0) -> bytes:
    """The bytes (fixed header + writer id + statistics + padding) that precede ``payload`` in a
    record written at file ``position``."""
    writer = b"" if writer_id is None else writer_id.encode("utf-8")
    if len(writer) > _MAX_WRITER_ID:
        raise InvalidInput(f"writer id longer than {_MAX_WRITER_ID} bytes")
    stats_bytes = json.dumps(stats, separators=(",", ":")).encode("utf-8") if stats else b""
    flags = (_FLAG_WRITER if writer_id is not None else 0) | (
        _FLAG_SEQUENCE if sequence is not None else 0)
    padding = -(position + HEADER.size + len(writer) + len(stats_bytes)) % PAYLOAD_ALIGNMENT
    fixed = HEADER.pack(MAGIC, FORMAT_VERSION, flags, padding, base_offset, num_rows, timestamp_ms,
                        sequence or 0, len(writer), len(stats_bytes), payload.size,
                        zlib.crc32(payload), 0)[: HEADER.size - 4]
    header_crc = zlib.crc32(stats_bytes, zlib.crc32(writer, zlib.crc32(fixed)))
    return fixed + struct.pack("<I", header_crc) + writer + stats_bytes + bytes(padding)


def _parse_header(fd: int, position: int, file_size: int) -> RecordHeader | None:
    """The header at ``position``, or None when it is torn, garbage or fails its CRC."""
    if position + HEADER.size > file_size:
        return None
    fixed = os.pread(fd, HEADER.size, position)
    if len(fixed) < HEADER.size:
        return None
    (magic, version, flags, padding, base, rows, ts, seq, wlen, slen, plen, pcrc,
     hcrc) = HEADER.unpack(fixed)
    if magic != MAGIC or version != FORMAT_VERSION:
        return None
    payload_position = position + HEADER.size + wlen + slen + padding
    if payload_position + plen > file_size:
        return None
    variable = os.pread(fd, wlen + slen, position + HEADER.size) if wlen + slen else b""
    if zlib.crc32(variable, zlib.crc32(fixed[:-4])) != hcrc:
        return None
    try:
        writer = variable[:wlen].decode("utf-8") if flags & _FLAG_WRITER else None
        stats = _decode_statistics(variable[wlen:])
    except (ValueError, KeyError, IndexError, TypeError):
        return None
    return RecordHeader(base, rows, ts, writer, seq if flags & _FLAG_SEQUENCE else None, stats,
                        position, payload_position, plen, pcrc)


class _CountingFile:
    """A read-only, seekable file over one payload that counts the bytes handed to Arrow."""

    def __init__(self, source: pa.NativeFile, position: int, size: int) -> None:
        self._source, self._base, self._size = source, position, size
        self._pos = 0
        self.bytes_read = 0
        self.closed = False

    def seek(self, offset: int, whence: int = 0) -> int:
        self._pos = offset if whence == 0 else (self._pos + offset if whence == 1
                                                else self._size + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def read(self, nbytes: int = -1) -> pa.Buffer:
        nbytes = self._size - self._pos if nbytes is None or nbytes < 0 else min(
            nbytes, self._size - self._pos)
        data = self._source.read_at(nbytes, self._base + self._pos)
        self._pos += nbytes
        self.bytes_read += nbytes
        return data

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def close(self) -> None:
        self.closed = True


class Segment:
    """One segment file: its in-memory record index, an append handle while active, a reader.

    Not thread-safe by itself for appends: :class:`~flightstore.log.tablet.LogTablet` serializes
    them. Reads (``read_batch``) are positional and may run concurrently with an append.
    """

    def __init__(self, directory: Path, base_offset: int) -> None:
        self.directory = directory
        self.base_offset = base_offset
        self.path = directory / f"{segment_name(base_offset)}.log"
        self.index_path = directory / f"{segment_name(base_offset)}.index"
        self.records: list[RecordHeader] = []
        self.bases: list[int] = []  # base_offset of each record, for bisect
        self.size = 0
        self.max_timestamp_ms: int | None = None
        self._reader: pa.NativeFile | None = None
        self._map: pa.Buffer | None = None
        # Decoded uncompressed records (zero-copy views of the map) by payload position: records
        # never change once written, so a repeated scan skips parsing their IPC metadata.
        self._decoded: dict[int, tuple[pa.Schema, pa.RecordBatch]] = {}
        self._log_fd: int | None = None
        self._index_fd: int | None = None

    # -- opening -----------------------------------------------------------------------------

    @classmethod
    def create(cls, directory: Path, base_offset: int, fsync: bool = False) -> "Segment":
        """A new, empty segment file (fails if it exists)."""
        segment = cls(directory, base_offset)
        fd = os.open(segment.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.close(fd)
        segment.index_path.write_bytes(b"")
        if fsync:
            _fsync_directory(directory)
        return segment

    @classmethod
    def load(cls, directory: Path, base_offset: int, verify: bool) -> "Segment":
        """Open an existing segment, walking its headers.

        ``verify`` (the last segment): check every payload CRC and truncate the file after the last
        good record. Otherwise a bad record raises :class:`CorruptData`.
        """
        segment = cls(directory, base_offset)
        fd = os.open(segment.path, os.O_RDWR if verify else os.O_RDONLY)
        try:
            file_size = os.fstat(fd).st_size
            position, expected = 0, base_offset
            while position < file_size:
                header = _parse_header(fd, position, file_size)
                if header is not None and header.base_offset != expected:
                    header = None
                if header is not None and verify and zlib.crc32(
                        os.pread(fd, header.payload_len, header.payload_position)) != header.payload_crc:
                    header = None
                if header is None:
                    if not verify:
                        raise CorruptData(f"{segment.path}: bad record at byte {position}")
                    os.ftruncate(fd, position)  # cut the torn tail
                    break
                segment._remember(header)
                position, expected = header.end_position, header.next_offset
            segment.size = position
        finally:
            os.close(fd)
        segment._reconcile_index()
        return segment

    def _remember(self, header: RecordHeader) -> None:
        self.records.append(header)
        self.bases.append(header.base_offset)
        if self.max_timestamp_ms is None or header.timestamp_ms > self.max_timestamp_ms:
            self.max_timestamp_ms = header.timestamp_ms

    def _index_bytes(self) -> bytes:
        return b"".join(INDEX_ENTRY.pack(r.base_offset, r.position) for r in self.records)

    def _reconcile_index(self) -> None:
        """Rewrite the index file when it is missing or disagrees with the walked headers."""
        expected = self._index_bytes()
        try:
            if self.index_path.read_bytes() == expected:
                return
        except FileNotFoundError:
            pass
        tmp = self.index_path.with_suffix(".index.tmp")
        tmp.write_bytes(expected)
        os.replace(tmp, self.index_path)

    # -- properties --------------------------------------------------------------------------

    @property
    def next_offset(self) -> int:
        return self.records[-1].next_offset if self.records else self.base_offset

    # -- writing -----------------------------------------------------------------------------

    def append(self, header_bytes: bytes, payload: pa.Buffer, fsync: bool) -> int:
        """Write one record at the end of the file; return its position.

        On a failed write the file is truncated back, so a live process never leaves a torn
        record behind (a crash may; recovery cuts it).
        """
        if self._log_fd is None:
            self._log_fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
            self._index_fd = os.open(self.index_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        position = self.size
        try:
            _write_all(self._log_fd, [header_bytes, memoryview(payload)])
            if fsync:
                os.fsync(self._log_fd)
        except BaseException:
            os.ftruncate(self._log_fd, position)
            raise
        self.size = position + len(header_bytes) + payload.size
        return position

    def add(self, header: RecordHeader) -> None:
        """Register an appended record in memory and in the offset index."""
        self._remember(header)
        if self._index_fd is not None:
            _write_all(self._index_fd, [INDEX_ENTRY.pack(header.base_offset, header.position)])

    def seal(self) -> None:
        """Stop appending to this segment (it stays readable)."""
        for fd in (self._log_fd, self._index_fd):
            if fd is not None:
                os.close(fd)
        self._log_fd = self._index_fd = None

    # -- reading -----------------------------------------------------------------------------

    def read_batch(self, record: RecordHeader, included_fields: Sequence[int] | None,
                   schema: pa.Schema | None = None) -> tuple[pa.RecordBatch, int]:
        """Decode ``record``'s payload, only the fields at ``included_fields`` (None: all).

        Returns the batch and the number of bytes read from the file.
        """
        if schema is not None:
            # Uncompressed: the record batch is decoded in place against the known schema, and only
            # the requested columns' buffers are kept (and paged in when used): they are the bytes read.
            batch = self._read_mapped(record, schema)
            if included_fields is None:
                return batch, record.payload_len
            batch = batch.select(list(included_fields))
            return batch, batch.nbytes  # the selected columns' buffers: what gets paged in
        if included_fields is None:
            return self._read_compressed(record), record.payload_len
        if self._reader is None:
            self._reader = pa.OSFile(str(self.path), "r")
        counting = _CountingFile(self._reader, record.payload_position, record.payload_len)
        options = pa.ipc.IpcReadOptions(
            included_fields=list(included_fields) if included_fields is not None else None)
        try:
            reader = pa.ipc.open_file(pa.PythonFile(counting, mode="r"), options=options)
            batch = reader.get_batch(0)
        except (pa.ArrowInvalid, OSError) as exc:
            raise CorruptData(f"{self.path}: cannot decode record at offset "
                              f"{record.base_offset}: {exc}") from None
        return batch, counting.bytes_read

    def _mapped(self, record: RecordHeader) -> pa.Buffer:
        """The record's payload as a slice of a memory map of the segment."""
        end = record.payload_position + record.payload_len
        mapped = self._map
        if mapped is None or mapped.size < end:
            with pa.memory_map(str(self.path), "r") as source:
                mapped = source.read_buffer(source.size())  # keeps the mapping alive
            self._map = mapped
        return mapped.slice(record.payload_position, record.payload_len)

    def _read_mapped(self, record: RecordHeader, schema: pa.Schema) -> pa.RecordBatch:
        """Every column of an uncompressed ``record`` as zero-copy views of the memory map.

        The payload is an IPC file: 8 bytes of magic, then the schema message and the record batch
        message of the stream format. Decoding the batch message against the tablet's schema skips
        parsing the file footer and the schema for every record.
        """
        cached = self._decoded.get(record.payload_position)
        if cached is not None and cached[0] is schema:
            return cached[1]
        try:
            payload = self._mapped(record)
            messages = pa.ipc.MessageReader.open_stream(pa.BufferReader(payload.slice(8)))
            messages.read_next_message()  # the schema, known already
            batch = pa.ipc.read_record_batch(messages.read_next_message(), schema)
        except (pa.ArrowInvalid, OSError, StopIteration) as exc:
            raise CorruptData(f"{self.path}: cannot decode record at offset "
                              f"{record.base_offset}: {exc}") from None
        if len(self._decoded) >= DECODED_RECORDS_PER_SEGMENT:
            try:  # the oldest entry; a concurrent reader may be changing the dict
                self._decoded.pop(next(iter(self._decoded)), None)
            except (RuntimeError, StopIteration):
                pass
        self._decoded[record.payload_position] = (schema, batch)
        return batch

    def _read_compressed(self, record: RecordHeader) -> pa.RecordBatch:
        """Every column of a compressed ``record``, decompressed from the memory map."""
        try:
            return pa.ipc.open_file(pa.BufferReader(self._mapped(record))).get_batch(0)
        except (pa.ArrowInvalid, OSError) as exc:
            raise CorruptData(f"{self.path}: cannot decode record at offset "
                              f"{record.base_offset}: {exc}") from None

    def close(self) -> None:
        """Release every file handle (batches already read keep their mapping alive)."""
        self.seal()
        self._map = None
        self._decoded = {}
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def delete(self) -> None:
        """Remove the segment's files (a reader that already opened it keeps its handle)."""
        self.seal()
        self._reader = None  # closed when the last in-flight read drops it
        for path in (self.path, self.index_path):
            try:
                path.unlink()
            except FileNotFoundError:
                pass


def _write_all(fd: int, parts: list[Any]) -> None:
    views = [memoryview(p).cast("B") for p in parts if len(p)]
    while views:
        written = os.writev(fd, views)
        while views and written >= len(views[0]):
            written -= len(views[0])
            views.pop(0)
        if views and written:
            views[0] = views[0][written:]


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
