"""One log record: its on-disk header, its payload (a one-batch Arrow IPC file) and their checksums.

Record format (little-endian), one record per appended batch::

    fixed header, 60 bytes (struct ``<4sBBHqIqqHIHQII``)
      magic          4s   b"FSLB"
      version        u8   2 (version 1 records, 58 bytes without ``checksums``, are still read)
      flags          u8   bit 0: writer id present, bit 1: sequence present,
                          bit 2: *lost range* (see below)
      padding        u16  zero bytes between the checksums and the payload, so that every payload
                          starts 64-byte aligned in the file (zero-copy reads from a memory map)
      base_offset    i64  offset of the record's first row
      num_rows       u32
      timestamp_ms   i64  commit time, ms since the epoch
      sequence       i64  the writer's batch sequence (0 when absent)
      writer_len     u16  length of the UTF-8 writer id
      stats_len      u32  length of the statistics JSON
      checksums      u16  number of column checksums (one per column of the payload)
      payload_len    u64  length of the payload
      payload_crc    u32  zlib.crc32 of the payload
      header_crc     u32  zlib.crc32 of the 56 bytes before it + writer id + statistics + checksums
    writer id      writer_len bytes, UTF-8
    statistics     stats_len bytes, JSON ``{column: [min, max, null_count, row_count]}`` with values
                   encoded by :mod:`flightstore.expressions`' literal encoding
    checksums      4 bytes per column: zlib.crc32 over the column's length and null count and every
                   buffer of it, as decoded from the payload (children and dictionary included)
    padding        padding zero bytes
    payload        payload_len bytes: an Arrow IPC *file* holding exactly one record batch, its
                   buffers compressed per the tablet's compression (NONE / LZ4_FRAME / ZSTD)

Why two kinds of checksum: ``payload_crc`` lets recovery and ``flightstore verify`` check a whole
record; the column checksums let a read of k of n columns check exactly the bytes it uses, so a
flipped byte is caught (:class:`~flightstore.errors.DataLoss`) without reading the other columns.

A **lost-range record** (flag bit 2) declares that offsets ``[base_offset, base_offset + num_rows)``
are gone: it is written by ``flightstore repair`` where corrupt bytes were removed, or where the log
lost records a primary-key table's KV had already applied. It has no payload, no checksums, and its
"statistics" bytes hold a UTF-8 JSON object ``{"lost": reason}``. Offsets stay contiguous, so every
record after it keeps its offsets; reads skip the range.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from flightstore.errors import InvalidInput
from flightstore.expressions import ColumnStats, _decode_value, _encode_value

__all__ = [
    "COMPRESSIONS",
    "FORMAT_VERSION",
    "HEADER",
    "MAGIC",
    "PAYLOAD_ALIGNMENT",
    "RawRecord",
    "RecordHeader",
    "column_checksums",
    "compute_statistics",
    "decode_payload",
    "encode_lost_range",
    "encode_payload",
    "encode_record",
    "fd_reader",
    "payload_checksums",
    "read_header",
    "statistics_from_json",
]

MAGIC = b"FSLB"
FORMAT_VERSION = 2
HEADER = struct.Struct("<4sBBHqIqqHIHQII")
HEADER_V1 = struct.Struct("<4sBBHqIqqHIQII")
_CHECKSUM = struct.Struct("<I")
_SHAPE = struct.Struct("<qq")  # length and null count, read from the IPC metadata
FLAG_WRITER = 1
FLAG_SEQUENCE = 2
FLAG_LOST = 4
_MAX_WRITER_ID = 0xFFFF
_MAX_STAT_LENGTH = 256
PAYLOAD_ALIGNMENT = 64
COMPRESSIONS: dict[str, str | None] = {"NONE": None, "LZ4_FRAME": "lz4", "ZSTD": "zstd"}


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
    checksums: tuple[int, ...] = ()  # per column; empty for version 1 records and lost ranges
    lost: str | None = None          # the reason, for a lost-range record
    stats_raw: bytes = field(default=b"", repr=False, compare=False)

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.num_rows

    @property
    def end_position(self) -> int:
        return self.payload_position + self.payload_len


@dataclass(frozen=True)
class RawRecord:
    """One stored record as it travels between replicas: its header fields and its payload bytes,
    verbatim (a follower stores the same record at the same offsets; only its position in the
    follower's file, and so its padding, may differ). ``lost`` is the reason of a lost-range
    record (no payload); ``schema_version`` the table schema version it was written under."""

    base_offset: int
    num_rows: int
    timestamp_ms: int
    writer_id: str | None
    sequence: int | None
    stats_raw: bytes
    checksums: tuple[int, ...]
    payload_crc: int
    payload: bytes | pa.Buffer
    schema_version: int
    lost: str | None = None

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.num_rows


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


def encode_payload(batch: pa.RecordBatch, compression: str = "NONE") -> pa.Buffer:
    """``batch`` as the bytes of a one-batch Arrow IPC file, compressed per ``compression``."""
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=COMPRESSIONS[compression])
    with pa.ipc.new_file(sink, batch.schema, options=options) as writer:
        writer.write_batch(batch)
    return sink.getvalue()


def _array_checksum(array: pa.Array, crc: int = 0) -> int:
    crc = zlib.crc32(_SHAPE.pack(len(array), array.null_count), crc)
    for buffer in array.buffers():
        if buffer is not None and buffer.size:
            crc = zlib.crc32(buffer, crc)
    if pa.types.is_dictionary(array.type):
        crc = _array_checksum(array.dictionary, crc)
    return crc


def column_checksums(batch: pa.RecordBatch) -> list[int]:
    """The checksum of each column of a batch *decoded from a payload* (see the module doc).

    Computed over the decoded buffers: for an uncompressed payload these are the file's own bytes,
    for a compressed one the decompressed values, so both read paths check what they return.
    """
    return [_array_checksum(column) for column in batch.columns]


def decode_payload(payload: pa.Buffer, schema: pa.Schema) -> pa.RecordBatch:
    """The batch of a payload, decoded against the log's ``schema``: the IPC file is 8 bytes of
    magic, then the schema message and the record batch message of the stream format; reading the
    batch message directly skips the file footer and the schema (zero-copy when uncompressed)."""
    reader = pa.BufferReader(payload.slice(8))
    pa.ipc.read_message(reader)  # the schema, known already
    return pa.ipc.read_record_batch(pa.ipc.read_message(reader), schema)


def payload_checksums(payload: pa.Buffer, schema: pa.Schema) -> list[int]:
    """:func:`column_checksums` of the batch stored in ``payload`` (decoded the way reads do)."""
    return column_checksums(decode_payload(payload, schema))


def _header_bytes(base_offset: int, num_rows: int, timestamp_ms: int, flags: int, sequence: int,
                  writer: bytes, stats: bytes, checksums: Sequence[int], payload_len: int,
                  payload_crc: int, position: int) -> bytes:
    sums = b"".join(_CHECKSUM.pack(c) for c in checksums)
    padding = -(position + HEADER.size + len(writer) + len(stats) + len(sums)) % PAYLOAD_ALIGNMENT
    fixed = HEADER.pack(MAGIC, FORMAT_VERSION, flags, padding, base_offset, num_rows, timestamp_ms,
                        sequence, len(writer), len(stats), len(checksums), payload_len, payload_crc,
                        0)[: HEADER.size - 4]
    header_crc = zlib.crc32(sums, zlib.crc32(stats, zlib.crc32(writer, zlib.crc32(fixed))))
    return fixed + struct.pack("<I", header_crc) + writer + stats + sums + bytes(padding)


def encode_record(base_offset: int, num_rows: int, timestamp_ms: int, writer_id: str | None,
                  sequence: int | None, stats: Mapping[str, list] | bytes,
                  payload: pa.Buffer | bytes, checksums: Sequence[int], position: int = 0,
                  payload_crc: int | None = None) -> bytes:
    """The bytes (fixed header + writer id + statistics + checksums + padding) that precede
    ``payload`` in a record written at file ``position``. ``stats`` may be already-encoded JSON."""
    writer = b"" if writer_id is None else writer_id.encode("utf-8")
    if len(writer) > _MAX_WRITER_ID:
        raise InvalidInput(f"writer id longer than {_MAX_WRITER_ID} bytes")
    if isinstance(stats, bytes):
        stats_bytes = stats
    else:
        stats_bytes = json.dumps(stats, separators=(",", ":")).encode("utf-8") if stats else b""
    flags = (FLAG_WRITER if writer_id is not None else 0) | (
        FLAG_SEQUENCE if sequence is not None else 0)
    crc = zlib.crc32(payload) if payload_crc is None else payload_crc
    return _header_bytes(base_offset, num_rows, timestamp_ms, flags, sequence or 0, writer,
                         stats_bytes, checksums, memoryview(payload).nbytes, crc, position)


def encode_lost_range(base_offset: int, num_rows: int, timestamp_ms: int, reason: str,
                      position: int = 0) -> bytes:
    """A complete lost-range record (it has no payload) declaring ``num_rows`` offsets gone."""
    note = json.dumps({"lost": reason}, separators=(",", ":")).encode("utf-8")
    return _header_bytes(base_offset, num_rows, timestamp_ms, FLAG_LOST, 0, b"", note, (), 0,
                         zlib.crc32(b""), position)


def read_header(pread: Callable[[int, int], bytes], position: int,
                file_size: int) -> RecordHeader | None:
    """The header at ``position`` (``pread(size, position)`` reads the file), or None when it is
    torn, garbage or fails its CRC. The payload is not checked here."""
    if position + HEADER_V1.size > file_size:
        return None
    fixed = pread(HEADER.size, position)
    if len(fixed) < HEADER_V1.size or fixed[:4] != MAGIC:
        return None
    checksums_count = 0
    if fixed[4] == FORMAT_VERSION and len(fixed) == HEADER.size:
        (_, _, flags, padding, base, rows, ts, seq, wlen, slen, checksums_count, plen, pcrc,
         hcrc) = HEADER.unpack(fixed)
    elif fixed[4] == 1:
        fixed = fixed[:HEADER_V1.size]
        (_, _, flags, padding, base, rows, ts, seq, wlen, slen, plen, pcrc,
         hcrc) = HEADER_V1.unpack(fixed)
    else:
        return None
    variable_len = wlen + slen + 4 * checksums_count
    payload_position = position + len(fixed) + variable_len + padding
    if payload_position + plen > file_size:
        return None
    variable = pread(variable_len, position + len(fixed)) if variable_len else b""
    if len(variable) != variable_len or zlib.crc32(variable, zlib.crc32(fixed[:-4])) != hcrc:
        return None
    stats_raw = variable[wlen:wlen + slen]
    try:
        writer = variable[:wlen].decode("utf-8") if flags & FLAG_WRITER else None
        lost = None
        stats: Mapping[str, ColumnStats] = {}
        if flags & FLAG_LOST:
            lost = str(json.loads(stats_raw).get("lost", "")) if stats_raw else ""
        elif stats_raw:
            stats = statistics_from_json(json.loads(stats_raw))
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return None
    sums = tuple(_CHECKSUM.unpack_from(variable, wlen + slen + 4 * i)[0]
                 for i in range(checksums_count))
    return RecordHeader(base, rows, ts, writer, seq if flags & FLAG_SEQUENCE else None, stats,
                        position, payload_position, plen, pcrc, sums, lost, stats_raw)


def fd_reader(fd: int) -> Callable[[int, int], bytes]:
    """A ``pread(size, position)`` over an open file descriptor."""
    return lambda size, position: os.pread(fd, size, position)
