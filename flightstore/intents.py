"""Write intents: all-or-nothing writes that span several buckets.

Each bucket applies a write atomically, but a write split over buckets could be cut by a crash
between two of them. So before a multi-bucket write touches any bucket, the whole batch is recorded
here with its writer id and batch sequence; once every bucket applied it, the intent is cleared.
On open, a recorded intent is rolled forward by applying it again: buckets that already hold that
(writer, sequence) skip it, the others apply it, so the write ends up everywhere or, if its intent
never reached the disk, nowhere.

File format: one record at most (writes of a table are serialized), ``<4sIQ`` (magic, CRC32 of the
rest, length), a JSON header line, then the batch as an Arrow IPC stream. A torn or corrupt record is
an intent that never completed its write, and no bucket was touched for it: it is discarded.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from pathlib import Path
from typing import Any

import pyarrow as pa

__all__ = ["IntentLog"]

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
