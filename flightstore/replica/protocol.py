"""The replication stream's messages: what a follower asks and what its leader answers.

One Flight ``DoExchange`` per (follower server, leader server), opened by the follower with the
command ``{"op": "replica.fetch", "follower": <id>}`` and kept open. Each request is a
metadata-only message (JSON); each answer is one metadata-only message too: an *answer frame*
(:func:`encode_answer`), its JSON metadata followed by the records it brings (none when there is
nothing new), packed in one binary buffer.

Requests::

    {"fetch": [{"table_id", "partition", "bucket", "offset", "epoch"}, ...], "wait_ms": 500}
    {"epoch_end": [{"table_id", "partition", "bucket", "epoch"}, ...]}

``fetch`` names every replica the follower follows at this leader with its log end (which is also
its acknowledgement of everything below) and the leader epoch it believes current; the leader
answers the records after each offset (waiting up to ``wait_ms`` when there are none) with its high
watermark per replica, or an error for a replica it does not lead at that epoch. ``epoch_end``
asks, per replica, where the leader's log of the follower's newest epoch ends (truncation,
:mod:`flightstore.replica.epochs`); the answer has no records.

Answer metadata::

    {"replicas": [{"key": [table_id, partition, bucket], "hw": int, "leo": int} | {"key", "error"}]}
    {"epoch_end": [{"key", "epoch": int | null, "end": int} | {"key", "error"}]}

Answer frame: ``u32`` length of the metadata JSON, the JSON, then the records one after another,
each a fixed little-endian header (:data:`ITEM`: replica key, the leader epoch that wrote it, the
stored record's header fields, the lengths of what follows) then its table id, writer id,
statistics, column checksums, lost-range reason and payload bytes. A record is its stored form
(:class:`~flightstore.log.record.RawRecord`) verbatim: the payload is the leader's Arrow IPC bytes,
which the follower checks against the payload CRC and writes to its segment as they are, with no
Arrow encoding or decoding on either side (an answer costs a few struct calls per record, not an
Arrow array per field). A partition of ``-1`` means an unpartitioned table.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable
from typing import Any

import pyarrow as pa

from flightstore.errors import CorruptData
from flightstore.log.record import RawRecord
from flightstore.server import tickets

__all__ = ["FETCH_OP", "ITEM", "RECORDS", "SNAPSHOT_FILES", "SNAPSHOT_OP", "ReplicaKey", "command",
           "decode_answer", "decode_records", "dump", "encode_answer", "encode_records", "load"]

FETCH_OP = "replica.fetch"
SNAPSHOT_OP = "replica.snapshot"  # DoGet: a leader's newest KV snapshot, for a follower behind its log
SNAPSHOT_FILES = pa.schema([("path", pa.string()), ("data", pa.large_binary())])
ReplicaKey = tuple[str, int, int]  # (table_id, partition id or -1, bucket)

#: The schema a leader opens its side of the stream with (answers carry no record batch).
RECORDS = pa.schema([])

#: One record's fixed header in an answer frame: table id length, partition, bucket, leader
#: epoch, base offset, rows, timestamp, sequence, payload CRC, schema version, flags (1: writer
#: id, 2: sequence, 4: lost range), writer id length, statistics length, checksum count, lost
#: reason length, payload length.
ITEM = struct.Struct("<HqiqqqqqIiBHIIIQ")
_LENGTH = struct.Struct("<I")
_WRITER, _SEQUENCE, _LOST = 1, 2, 4


def command(payload: dict[str, Any]) -> bytes:
    """The DoExchange command that opens a replication stream (a peer call)."""
    return tickets.encode_custom({**payload, "peer": True})


def dump(value: dict[str, Any]) -> pa.Buffer:
    return pa.py_buffer(json.dumps(value, separators=(",", ":")).encode())


def load(buffer: pa.Buffer | None) -> dict[str, Any]:
    if buffer is None:
        return {}
    return json.loads(buffer.to_pybytes())


def encode_records(items: Iterable[tuple[ReplicaKey, int, RawRecord]]) -> bytes:
    """The records part of an answer frame: each record with its replica key and the leader epoch
    that wrote it (see the module docstring). One copy of every payload, no Arrow encoding."""
    parts: list[bytes | memoryview] = []
    for (table_id, partition, bucket), epoch, r in items:
        table = table_id.encode()
        writer = r.writer_id.encode() if r.writer_id is not None else b""
        lost = r.lost.encode() if r.lost is not None else b""
        payload = memoryview(r.payload).cast("B")
        flags = ((_WRITER if r.writer_id is not None else 0) | (_SEQUENCE if r.sequence is not None else 0)
                 | (_LOST if r.lost is not None else 0))
        parts += [ITEM.pack(len(table), partition, bucket, epoch, r.base_offset, r.num_rows, r.timestamp_ms,
                            r.sequence or 0, r.payload_crc, r.schema_version, flags, len(writer),
                            len(r.stats_raw), len(r.checksums), len(lost), payload.nbytes),
                  table, writer, r.stats_raw, struct.pack(f"<{len(r.checksums)}I", *r.checksums), lost, payload]
    return b"".join(parts)


def decode_records(buffer: pa.Buffer | bytes, start: int = 0) -> dict[ReplicaKey, list[tuple[int, RawRecord]]]:
    """The records of an answer frame's records part (from ``start``) by replica, in offset
    order, each with its leader epoch. Payloads are zero-copy slices of ``buffer``.
    :class:`~flightstore.errors.CorruptData` for a frame that does not parse (a record cut short)."""
    out: dict[ReplicaKey, list[tuple[int, RawRecord]]] = {}
    buffer = pa.py_buffer(buffer) if not isinstance(buffer, pa.Buffer) else buffer
    view, size, at = memoryview(buffer), buffer.size, start
    while at < size:
        if at + ITEM.size > size:
            raise CorruptData(f"a replication answer ends inside a record header (byte {at} of {size})")
        (table_len, partition, bucket, epoch, base, rows, ts, sequence, crc, version, flags, writer_len,
         stats_len, sums, lost_len, payload_len) = ITEM.unpack_from(view, at)
        at += ITEM.size
        ends = [at + table_len]
        for length in (writer_len, stats_len, 4 * sums, lost_len, payload_len):
            ends.append(ends[-1] + length)
        if ends[-1] > size:
            raise CorruptData(f"a replication answer ends inside the record at offset {base}")
        table_id = bytes(view[at:ends[0]]).decode()
        record = RawRecord(base, rows, ts, bytes(view[ends[0]:ends[1]]).decode() if flags & _WRITER else None,
                           sequence if flags & _SEQUENCE else None, bytes(view[ends[1]:ends[2]]),
                           struct.unpack_from(f"<{sums}I", view, ends[2]), crc,
                           buffer.slice(ends[4], payload_len), version,
                           bytes(view[ends[3]:ends[4]]).decode() if flags & _LOST else None)
        out.setdefault((table_id, partition, bucket), []).append((epoch, record))
        at = ends[-1]
    return out


def encode_answer(meta: dict[str, Any], records: bytes = b"") -> pa.Buffer:
    """One answer frame: ``meta`` (JSON) and the records part :func:`encode_records` made."""
    body = json.dumps(meta, separators=(",", ":")).encode()
    return pa.py_buffer(b"".join((_LENGTH.pack(len(body)), body, records)))


def decode_answer(buffer: pa.Buffer) -> tuple[dict[str, Any], dict[ReplicaKey, list[tuple[int, RawRecord]]]]:
    """An answer frame's metadata and records (:func:`decode_records`)."""
    if buffer is None or buffer.size < _LENGTH.size:
        raise CorruptData("a replication answer without its metadata")
    view = memoryview(buffer)
    (length,) = _LENGTH.unpack_from(view, 0)
    if _LENGTH.size + length > buffer.size:
        raise CorruptData("a replication answer shorter than its metadata")
    meta = json.loads(bytes(view[_LENGTH.size:_LENGTH.size + length]))
    return meta, decode_records(buffer, _LENGTH.size + length)
