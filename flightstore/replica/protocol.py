"""The replication stream's messages: what a follower asks and what its leader answers.

One Flight ``DoExchange`` per (follower server, leader server), opened by the follower with the
command ``{"op": "replica.fetch", "follower": <id>}`` and kept open. Each request is a
metadata-only message (JSON); each answer is one message: a record batch of :data:`RECORDS` (zero
rows when there is nothing new) with JSON metadata.

Requests::

    {"fetch": [{"table_id", "partition", "bucket", "offset", "epoch"}, ...], "wait_ms": 500}
    {"epoch_end": [{"table_id", "partition", "bucket", "epoch"}, ...]}

``fetch`` names every replica the follower follows at this leader with its log end (which is also
its acknowledgement of everything below) and the leader epoch it believes current; the leader
answers the records after each offset (waiting up to ``wait_ms`` when there are none) with its high
watermark per replica, or an error for a replica it does not lead at that epoch. ``epoch_end``
asks, per replica, where the leader's log of the follower's newest epoch ends (truncation,
:mod:`flightstore.replica.epochs`); the answer is metadata only.

Answer metadata::

    {"replicas": [{"key": [table_id, partition, bucket], "hw": int, "leo": int} | {"key", "error"}]}
    {"epoch_end": [{"key", "epoch": int | null, "end": int} | {"key", "error"}]}

Record columns carry the stored record verbatim (:class:`~flightstore.log.record.RawRecord`) plus
the replica key and the leader epoch that wrote it. A partition of ``-1`` means an unpartitioned
table.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from flightstore.log.record import RawRecord
from flightstore.server import tickets

__all__ = ["FETCH_OP", "RECORDS", "SNAPSHOT_FILES", "SNAPSHOT_OP", "ReplicaKey", "command", "decode_records",
           "dump", "encode_records", "load"]

FETCH_OP = "replica.fetch"
SNAPSHOT_OP = "replica.snapshot"  # DoGet: a leader's newest KV snapshot, for a follower behind its log
SNAPSHOT_FILES = pa.schema([("path", pa.string()), ("data", pa.large_binary())])
ReplicaKey = tuple[str, int, int]  # (table_id, partition id or -1, bucket)

RECORDS = pa.schema([
    ("table_id", pa.string()), ("partition", pa.int64()), ("bucket", pa.int32()),
    ("epoch", pa.int64()), ("base_offset", pa.int64()), ("num_rows", pa.int64()),
    ("timestamp_ms", pa.int64()), ("writer_id", pa.string()), ("sequence", pa.int64()),
    ("stats", pa.large_binary()), ("checksums", pa.large_binary()), ("payload_crc", pa.uint32()),
    ("schema_version", pa.int32()), ("lost", pa.string()), ("payload", pa.large_binary()),
])


def command(payload: dict[str, Any]) -> bytes:
    """The DoExchange command that opens a replication stream (a peer call)."""
    return tickets.encode_custom({**payload, "peer": True})


def dump(value: dict[str, Any]) -> pa.Buffer:
    return pa.py_buffer(json.dumps(value, separators=(",", ":")).encode())


def load(buffer: pa.Buffer | None) -> dict[str, Any]:
    if buffer is None:
        return {}
    return json.loads(buffer.to_pybytes())


def _binary(values: Sequence[bytes | pa.Buffer]) -> pa.Array:
    """A large_binary array of ``values`` with one copy of their bytes (no Python bytes objects
    for payloads that are views of a memory-mapped segment)."""
    sizes = np.fromiter((memoryview(v).nbytes for v in values), dtype=np.int64, count=len(values))
    offsets = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    data = b"".join(memoryview(v).cast("B") for v in values)
    return pa.Array.from_buffers(pa.large_binary(), len(values),
                                 [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def encode_records(items: Iterable[tuple[ReplicaKey, int, RawRecord]]) -> pa.RecordBatch:
    """One batch of records, each with its replica key and the leader epoch that wrote it."""
    rows = list(items)
    records = [r for _, _, r in rows]
    return pa.RecordBatch.from_arrays([
        pa.array([k[0] for k, _, _ in rows], pa.string()),
        pa.array([k[1] for k, _, _ in rows], pa.int64()),
        pa.array([k[2] for k, _, _ in rows], pa.int32()),
        pa.array([e for _, e, _ in rows], pa.int64()),
        pa.array([r.base_offset for r in records], pa.int64()),
        pa.array([r.num_rows for r in records], pa.int64()),
        pa.array([r.timestamp_ms for r in records], pa.int64()),
        pa.array([r.writer_id for r in records], pa.string()),
        pa.array([r.sequence for r in records], pa.int64()),
        _binary([r.stats_raw for r in records]),
        _binary([struct.pack(f"<{len(r.checksums)}I", *r.checksums) for r in records]),
        pa.array([r.payload_crc for r in records], pa.uint32()),
        pa.array([r.schema_version for r in records], pa.int32()),
        pa.array([r.lost for r in records], pa.string()),
        _binary([r.payload for r in records]),
    ], schema=RECORDS)


def decode_records(batch: pa.RecordBatch) -> dict[ReplicaKey, list[tuple[int, RawRecord]]]:
    """The records of an answer by replica, in offset order, each with its leader epoch. Payloads
    stay zero-copy slices of the received message."""
    out: dict[ReplicaKey, list[tuple[int, RawRecord]]] = {}
    if batch.num_rows == 0:
        return out
    columns = {name: batch.column(name) for name in RECORDS.names}
    plain = {name: columns[name].to_pylist() for name in RECORDS.names
             if name not in ("payload", "stats", "checksums")}
    payloads, stats, sums = columns["payload"], columns["stats"], columns["checksums"]
    data = payloads.buffers()[2]
    offsets = np.frombuffer(payloads.buffers()[1], dtype=np.int64)[payloads.offset:payloads.offset + len(payloads) + 1]
    for i in range(batch.num_rows):
        key = (plain["table_id"][i], plain["partition"][i], plain["bucket"][i])
        raw_sums = stats_bytes = b""
        if sums[i].is_valid:
            raw_sums = sums[i].as_py()
        if stats[i].is_valid:
            stats_bytes = stats[i].as_py()
        start, end = int(offsets[i]), int(offsets[i + 1])
        payload = data.slice(start, end - start) if data is not None else b""
        record = RawRecord(plain["base_offset"][i], plain["num_rows"][i], plain["timestamp_ms"][i],
                           plain["writer_id"][i], plain["sequence"][i], stats_bytes,
                           struct.unpack(f"<{len(raw_sums) // 4}I", raw_sums),
                           plain["payload_crc"][i], payload, plain["schema_version"][i], plain["lost"][i])
        out.setdefault(key, []).append((plain["epoch"][i], record))
    return out
