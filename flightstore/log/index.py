"""A segment's sidecar files: the offset/time index and the summary that lets a log open without
reading its records.

``<base>.index`` holds one 24-byte entry per record, ``<qqq`` = (base_offset, file position, max
timestamp so far in the segment). The offsets find a record by offset with a binary search; the
running maximum timestamp (Kafka's time index) finds the first record at or after a timestamp with a
binary search too. Entries are appended with each record; the index is advisory: it is checked
against the summary's CRC before use and rebuilt from the records' headers when it disagrees.

``<base>.summary`` is written when a segment is sealed (``sealed: true``) and, for the active
segment, at a clean close (a *checkpoint*: the first ``size`` bytes hold ``records`` complete,
durable records). It is ``b"FSSM"``, a u32 zlib.crc32 of the JSON that follows, and the JSON::

    {"base_offset", "next_offset", "records", "size", "max_timestamp_ms", "lost_rows",
     "writers": {writer id: last sequence in this segment}, "holes": [[start, end], ...],
     "index_crc", "sealed"}

``holes`` are offset ranges known to be lost and not yet declared by ``flightstore repair``;
``lost_rows`` counts the offsets of declared lost-range records. A summary that does not parse or
fails its CRC is ignored (the segment is then walked, as before summaries existed).
"""

from __future__ import annotations

import bisect
import json
import os
import struct
import zlib
from array import array
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "INDEX_ENTRY",
    "SegmentIndex",
    "SegmentSummary",
    "fsync_directory",
    "read_summary",
    "write_summary",
]

INDEX_ENTRY = struct.Struct("<qqq")
_SUMMARY_MAGIC = b"FSSM"
_SUMMARY_HEAD = struct.Struct("<4sI")


class SegmentIndex:
    """The in-memory index of one segment: three int64 arrays, one entry per record."""

    __slots__ = ("bases", "max_ts", "positions")

    def __init__(self) -> None:
        self.bases = array("q")
        self.positions = array("q")
        self.max_ts = array("q")

    def __len__(self) -> int:
        return len(self.bases)

    def append(self, base_offset: int, position: int, max_timestamp_ms: int) -> None:
        self.bases.append(base_offset)
        self.positions.append(position)
        self.max_ts.append(max_timestamp_ms)

    def extend(self, other: SegmentIndex) -> None:
        self.bases.extend(other.bases)
        self.positions.extend(other.positions)
        self.max_ts.extend(other.max_ts)

    def record_for_offset(self, offset: int) -> int:
        """The number of the record holding ``offset`` (or the last one before it), 0 if none."""
        return max(bisect.bisect_right(self.bases, offset) - 1, 0)

    def record_for_timestamp(self, timestamp_ms: int) -> int:
        """The number of the first record whose timestamp is >= ``timestamp_ms`` (len if none):
        the running maximum is monotonic, so a binary search finds it."""
        return bisect.bisect_left(self.max_ts, timestamp_ms)

    def to_bytes(self, start: int = 0) -> bytes:
        return b"".join(INDEX_ENTRY.pack(self.bases[i], self.positions[i], self.max_ts[i])
                        for i in range(start, len(self)))

    @classmethod
    def from_bytes(cls, data: bytes) -> SegmentIndex:
        index = cls()
        flat = array("q")
        flat.frombytes(data[: len(data) - len(data) % INDEX_ENTRY.size])
        if struct.pack("=q", 1) != struct.pack("<q", 1):  # pragma: no cover - big-endian hosts
            flat.byteswap()
        index.bases, index.positions, index.max_ts = flat[0::3], flat[1::3], flat[2::3]
        return index


@dataclass
class SegmentSummary:
    """What opening a segment needs, so that it does not read the segment's records."""

    base_offset: int
    next_offset: int
    records: int
    size: int
    max_timestamp_ms: int | None
    lost_rows: int
    index_crc: int
    sealed: bool
    writers: dict[str, int] = field(default_factory=dict)
    holes: list[tuple[int, int]] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"base_offset": self.base_offset, "next_offset": self.next_offset,
                "records": self.records, "size": self.size,
                "max_timestamp_ms": self.max_timestamp_ms, "lost_rows": self.lost_rows,
                "index_crc": self.index_crc, "sealed": self.sealed, "writers": self.writers,
                "holes": [list(h) for h in self.holes]}


def read_summary(path: Path) -> tuple[SegmentSummary | None, int]:
    """The summary at ``path`` (None when missing, torn or corrupt) and the bytes read."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None, 0
    if len(data) < _SUMMARY_HEAD.size:
        return None, len(data)
    magic, crc = _SUMMARY_HEAD.unpack_from(data)
    body = data[_SUMMARY_HEAD.size:]
    if magic != _SUMMARY_MAGIC or zlib.crc32(body) != crc:
        return None, len(data)
    try:
        raw = json.loads(body)
        summary = SegmentSummary(
            int(raw["base_offset"]), int(raw["next_offset"]), int(raw["records"]), int(raw["size"]),
            None if raw["max_timestamp_ms"] is None else int(raw["max_timestamp_ms"]),
            int(raw["lost_rows"]), int(raw["index_crc"]), bool(raw["sealed"]),
            {str(k): int(v) for k, v in raw["writers"].items()},
            [(int(a), int(b)) for a, b in raw["holes"]])
    except (ValueError, KeyError, TypeError, AttributeError):
        return None, len(data)
    return summary, len(data)


def write_summary(path: Path, summary: SegmentSummary, fsync: bool) -> None:
    """Replace the summary atomically (write a temporary file, rename it over)."""
    body = json.dumps(summary.to_json(), separators=(",", ":"), sort_keys=True).encode()
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, _SUMMARY_HEAD.pack(_SUMMARY_MAGIC, zlib.crc32(body)) + body)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    if fsync:
        fsync_directory(path.parent)


def fsync_directory(directory: Path) -> None:
    """Make a directory's entries (created, renamed files) durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
