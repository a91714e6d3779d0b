"""Write intents: all-or-nothing writes that span several buckets.

Each bucket applies its part of a write atomically (one log record, one RocksDB WriteBatch), but a
write split over buckets could be cut between two of them. So a multi-bucket write goes in three
steps (:mod:`flightstore.table.writes`, :mod:`flightstore.partitioned`):

1. **prepare** every bucket (:meth:`flightstore.kv.tablet.KvTablet.prepare`): merge against the
   stored rows, derive the changelog, encode. Every failure that depends on values (an aggregate
   that overflows, a merge engine's refusal) happens here, before anything is written: the write
   is then refused whole.
2. **record** the intent here: the prepared per-bucket changelogs (log tables: the per-bucket
   rows), with the writer id and batch sequence the write goes under.
3. **commit** every bucket (log append, then RocksDB), fsync their logs, and clear the intent.

A failure in step 3 can only come from storage (a full disk, an I/O error, a crash). The intent
is then **rolled forward, never back**: it stays recorded, and it is completed before the table's
next write (or query of a writer's sequence, or undo) and at the next open, by committing the
recorded changelog to every bucket that lacks the write (a bucket that holds the writer's sequence
skips it). Until then the table refuses writes with
:class:`~flightstore.errors.WriteIncomplete` (UNAVAILABLE) and keeps serving reads. Why forward:

* the log is the source of truth: a bucket's changelog record, once appended, may already have
  been read by a subscriber (and, with replication, fetched by followers); rolling back would
  mean deleting a record others saw, or appending compensating records that readers would see
  as two changes;
* rolling back needs storage too (a log truncation and a RocksDB write per applied bucket), on
  the very disk that just failed, and a crash during a roll-back needs its own intent;
* replaying a recorded changelog cannot fail on values: it merges nothing (no overflow, no
  refusal); it only appends and puts, which succeed once the disk has room again. Nothing else
  writes the table's buckets in between (every write completes the pending one first), so the
  recorded changelog still describes them.

A client that retries the failed write with the same writer id and sequence is told it is a
duplicate once the intent is complete (exactly once); a write without writer id (SQL) that the
caller sends again is a new write.

An intent that cannot be applied for any other reason (one written by an older version, which
recorded the input rows and merges them on replay: an overflow there is value-dependent) is
**set aside**: renamed to ``intent.failed-<ms>`` next to it, with an error logged that names the
file, the writer and the sequence, and the table opens and serves without it (``flightstore
verify`` reports the file). A replay never makes a table unreadable.

File format: one record at most (writes of a table are serialized), ``<4sIQ`` (magic, CRC32 of the
rest, length), a JSON header line, then the batch as an Arrow IPC stream. A torn or corrupt record is
an intent that never completed its write, and no bucket was touched for it: it is discarded.
"""

from __future__ import annotations

import json
import os
import struct
import time
import zlib
from pathlib import Path
from typing import Any

import pyarrow as pa

__all__ = ["BUCKET_COLUMN", "FORMAT", "IntentLog"]

FORMAT = 2  # header "format": per-bucket changelogs with a _bucket column (none: input rows, older)
BUCKET_COLUMN = "_bucket"  # the table-wide bucket of each recorded row
_MAGIC = b"FSIN"
_HEADER = struct.Struct("<4sIQ")


class IntentLog:
    """The pending multi-bucket write of one table (at most one at a time)."""

    def __init__(self, path: str | os.PathLike, *, fsync: bool = False) -> None:
        self.path = Path(path)
        self.fsync = fsync

    def begin(self, meta: dict[str, Any], batch: pa.Table) -> None:
        """Durably record a write before any bucket applies it."""
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema) as writer:
            writer.write_table(batch)
        body = json.dumps(meta, separators=(",", ":")).encode() + b"\n" + sink.getvalue().to_pybytes()
        record = _HEADER.pack(_MAGIC, zlib.crc32(body), len(body)) + body
        created = not self.path.exists()
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(record)
            while view:
                view = view[os.write(fd, view):]
            if self.fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        if self.fsync and created:  # the file's directory entry must survive a power loss too
            dir_fd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)

    def complete(self) -> None:
        """Every bucket applied the write: forget it."""
        try:
            os.truncate(self.path, 0)
        except FileNotFoundError:
            pass

    def set_aside(self) -> Path:
        """Move the recorded intent out of the way (``intent.failed-<ms>`` in the same folder) so
        the table opens without it; returns the new path."""
        target = self.path.with_name(f"{self.path.name}.failed-{int(time.time() * 1000)}")
        os.replace(self.path, target)
        if self.fsync:
            dir_fd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        return target

    def set_aside_files(self) -> list[Path]:
        """Intents set aside by :meth:`set_aside`, oldest first."""
        return sorted(self.path.parent.glob(f"{self.path.name}.failed-*"))

    def inspect(self) -> str:
        """``"empty"``, ``"pending"`` (a write to roll forward at the next open) or ``"torn"`` (a
        record that fails its CRC: an intent whose write never started, discarded at open)."""
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return "empty"
        if size == 0:
            return "empty"
        return "pending" if self.pending() is not None else "torn"

    def pending(self) -> tuple[dict[str, Any], pa.Table] | None:
        """The recorded write that may not have reached every bucket, if any."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        if len(data) < _HEADER.size:
            return None
        magic, crc, length = _HEADER.unpack_from(data)
        body = data[_HEADER.size:_HEADER.size + length]
        if magic != _MAGIC or not length or len(body) != length or zlib.crc32(body) != crc:
            return None
        header, _, ipc = body.partition(b"\n")
        try:
            return json.loads(header), pa.ipc.open_stream(pa.py_buffer(ipc)).read_all()
        except (ValueError, pa.ArrowException):  # never written whole by begin()
            return None
