"""Segment files of a bucket's log: append, seal, open without reading records, read them checked.

A bucket's log is a directory of segments. A segment is named by the offset of its first row,
zero-padded to 20 digits: ``00000000000000000000.log``, with two sidecars next to it, the offset and
time index ``.index`` and the ``.summary`` that opening uses (formats in :mod:`flightstore.log.index`;
the record format, with its checksums and lost-range records, in :mod:`flightstore.log.record`).

Opening costs the same whatever the number of records:

* a sealed segment whose summary checks (CRC, base offset, file size) is not read at all: its record
  count, next offset, max timestamp, writers and known holes come from the summary; its index and
  headers are loaded by the first read that needs them (:meth:`Segment.view`,
  :meth:`Segment.header`), and dropped again when more than :data:`LOADED_WEIGHT_LIMIT` records of
  sealed segments are loaded (least recently used first);
* the active (last) segment is verified from its checkpoint (the summary written by the last clean
  close; from byte 0 without one): every header and payload CRC after it is checked. A bad record
  followed by a valid one is corruption: the bad bytes stay in place, the offsets they held become a
  *hole*, and every later record keeps its offsets. Bad bytes that no valid record follows are a torn
  tail: they are copied to ``quarantine/`` and cut. When the checkpoint says the segment reached
  offset N but fewer offsets are found, ``[found, N)`` is a hole too: offsets are never reused;
* a segment without a usable summary is walked (headers only) once and gets one.

Reads check what they decode (:mod:`flightstore.log.payload`), so a flipped byte is
:class:`~flightstore.errors.DataLoss`, never a wrong value; an unreadable header is DataLoss too.
Crossing a hole is DataLoss (the tablet checks that offsets are contiguous); lost ranges declared by
``flightstore repair`` are skipped.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
import zlib
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from flightstore.errors import CorruptData, DataLoss
from flightstore.log.index import (
    INDEX_ENTRY,
    SegmentIndex,
    SegmentSummary,
    fsync_directory,
    read_summary,
    write_summary,
)
from flightstore.log.payload import PayloadReader
from flightstore.log.record import RecordHeader, read_header
from flightstore.log.walk import Walk, walk_records

__all__ = [
    "LOADED",
    "LOADED_WEIGHT_LIMIT",
    "QUARANTINE",
    "Segment",
    "expiry_due",
    "may_expire",
    "quarantine",
    "segment_name",
]

log = logging.getLogger("flightstore.log")

# Records of sealed segments whose index and headers are kept in memory, all logs together.
LOADED_WEIGHT_LIMIT = 262_144
QUARANTINE = "quarantine"


def segment_name(base_offset: int) -> str:
    """The file stem of the segment starting at ``base_offset``."""
    return f"{base_offset:020d}"


def may_expire(directory: Path, ttl_ms: int, now_ms: int) -> bool:
    """Whether the log in ``directory`` may hold a segment ``table.log.ttl`` would delete, read from
    its files without opening it: it has a closed segment (the active one never goes) and its
    oldest segment's summary says its newest record is older than ``ttl_ms``, or cannot say (no
    summary, torn, empty): then opening the log decides."""
    due = expiry_due(directory, ttl_ms)
    return due is not None and due < now_ms


def expiry_due(directory: Path, ttl_ms: int) -> int | None:
    """The retention clock's time after which the closed log in ``directory`` may hold a segment
    ``ttl_ms`` would delete (see :func:`may_expire`): -1 when its files cannot say (now), None when
    nothing of it can go while it stays closed (no closed segment)."""
    try:
        stems = sorted(name[:-4] for name in os.listdir(directory) if name.endswith(".log"))
    except FileNotFoundError:
        return None
    if len(stems) < 2:
        return None
    summary, _ = read_summary(directory / f"{stems[0]}.summary")
    if summary is None or summary.max_timestamp_ms is None:
        return -1
    return summary.max_timestamp_ms + ttl_ms


def quarantine(directory: Path, file_name: str, position: int, data: bytes) -> Path:
    """Keep ``data``, removed from ``file_name`` at ``position``, in ``directory/quarantine/``.

    Bad bytes are evidence (and sometimes recoverable by hand): they are moved aside, never deleted.
    """
    folder = directory / QUARANTINE
    folder.mkdir(exist_ok=True)
    path = folder / f"{file_name}.{position}-{position + len(data)}.bad"
    path.write_bytes(data)
    return path


class _LoadedSegments:
    """Sealed segments holding their index and headers in memory, least recently used first."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._entries: OrderedDict[int, tuple[Segment, int]] = OrderedDict()
        self._total = 0

    def touch(self, segment: Segment, weight: int) -> None:
        evicted = []
        with self._lock:
            old = self._entries.pop(id(segment), None)
            self._total += weight - (old[1] if old else 0)
            self._entries[id(segment)] = (segment, weight)
            while self._total > self.limit and len(self._entries) > 1:
                _, (victim, victim_weight) = self._entries.popitem(last=False)
                self._total -= victim_weight
                evicted.append(victim)
        for victim in evicted:
            victim._unload()

    def forget(self, segment: Segment) -> None:
        with self._lock:
            old = self._entries.pop(id(segment), None)
            if old:
                self._total -= old[1]

    @property
    def weight(self) -> int:
        with self._lock:
            return self._total


LOADED = _LoadedSegments(LOADED_WEIGHT_LIMIT)


class Segment:
    """One segment file with its in-memory state: offsets, index, headers, an append handle.

    Not thread-safe by itself for appends: :class:`~flightstore.log.tablet.LogTablet` serializes
    them. Reads are positional and may run concurrently with an append.
    """

    _released = False  # see release(): files gone, everything a reader needs held open

    def __init__(self, directory: Path, base_offset: int, label: str = "") -> None:
        self.directory = directory
        self.base_offset = base_offset
        self.label = label or str(directory)
        stem = segment_name(base_offset)
        self.path = directory / f"{stem}.log"
        self.index_path = directory / f"{stem}.index"
        self.summary_path = directory / f"{stem}.summary"
        self.size = 0
        self.next_offset = base_offset
        self.records_count = 0
        self.max_timestamp_ms: int | None = None
        self.lost_rows = 0
        self.writers: dict[str, int] = {}
        self.holes: list[tuple[int, int]] = []  # lost offsets not declared yet
        self.sealed = False
        self.io = {"headers_parsed": 0, "bytes_read": 0}
        self._summarized: SegmentSummary | None = None  # the summary on disk, if it is current
        self._index_crc = 0
        self._index: SegmentIndex | None = SegmentIndex()  # None: on disk, not loaded yet
        self._on_disk = (0, 0, 0)  # (records, bytes, index CRC) of the part loadable from disk
        self._pending = SegmentIndex()  # entries after the on-disk part while _index is None
        self._headers: dict[int, RecordHeader] = {}
        self._load_lock = threading.RLock()
        self._read_fd: int | None = None
        self._payloads = PayloadReader(self.path, self.label)
        self._log_fd: int | None = None
        self._index_fd: int | None = None

    # -- opening -----------------------------------------------------------------------------

    @classmethod
    def create(cls, directory: Path, base_offset: int, label: str = "",
               fsync: bool = False) -> Segment:
        """A new, empty segment file (fails if it exists)."""
        segment = cls(directory, base_offset, label)
        fd = os.open(segment.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.close(fd)
        segment.index_path.write_bytes(b"")
        if fsync:
            fsync_directory(directory)
        return segment

    @classmethod
    def open_sealed(cls, directory: Path, base_offset: int, label: str = "",
                    fsync: bool = False) -> Segment:
        """Open a segment that is not the last one: from its summary, or by walking its headers."""
        segment = cls(directory, base_offset, label)
        segment.sealed = True
        summary, nbytes = read_summary(segment.summary_path)
        segment.io["bytes_read"] += nbytes
        size = os.stat(segment.path).st_size
        if summary is not None and summary.base_offset == base_offset and summary.size == size:
            segment._restore(summary)
            return segment
        fd = os.open(segment.path, os.O_RDONLY)
        try:
            walk = walk_records(lambda n, p: os.pread(fd, n, p), size, 0, base_offset, False)
        finally:
            os.close(fd)
        segment._take(walk)
        segment.size = size  # a bad tail stays: the next segment's base tells which offsets it held
        if walk.torn_position is not None:
            log.error("%s: %s has %d unreadable bytes at byte %d; the offsets they held are lost",
                      segment.label, segment.path.name, size - walk.torn_position, walk.torn_position)
        segment._write_index(0)
        segment._on_disk = (segment.records_count, segment.size, segment._index_crc)
        write_summary(segment.summary_path, segment.summary(True), fsync)
        LOADED.touch(segment, segment.records_count)
        return segment

    @classmethod
    def open_active(cls, directory: Path, base_offset: int, label: str = "",
                    fsync: bool = False) -> Segment:
        """Open the last segment, verifying every record after its checkpoint (see module doc)."""
        segment = cls(directory, base_offset, label)
        summary, nbytes = read_summary(segment.summary_path)
        segment.io["bytes_read"] += nbytes
        fd = os.open(segment.path, os.O_RDWR)
        trusted, known_end = 0, None
        try:
            file_size = os.fstat(fd).st_size
            start, expected = 0, base_offset
            if summary is not None and summary.base_offset == base_offset:
                known_end = summary.next_offset
                if summary.size <= file_size and _file_size(segment.index_path) >= \
                        summary.records * INDEX_ENTRY.size:
                    segment._restore(summary)
                    trusted, start, expected = summary.records, summary.size, summary.next_offset
            walk = walk_records(lambda n, p: os.pread(fd, n, p), file_size, start, expected, True)
            segment._take(walk)
            segment.size = walk.end_position
            if walk.torn_position is not None:
                kept = quarantine(directory, segment.path.name, walk.torn_position,
                                  os.pread(fd, file_size - walk.torn_position, walk.torn_position))
                os.ftruncate(fd, walk.torn_position)
                if fsync:
                    os.fsync(fd)
                log.warning("%s: cut a torn tail of %d bytes at byte %d of %s (kept in %s)",
                            segment.label, file_size - walk.torn_position, walk.torn_position,
                            segment.path.name, kept)
        finally:
            os.close(fd)
        if known_end is not None and segment.next_offset < known_end:
            log.error("%s: %s ends at offset %d but held offsets up to %d at its last clean close; "
                      "offsets %d..%d are lost", segment.label, segment.path.name,
                      segment.next_offset, known_end, segment.next_offset, known_end - 1)
            segment.skip_to(known_end)
        segment._write_index(trusted)
        return segment

    def _restore(self, summary: SegmentSummary) -> None:
        """Take the state a summary describes; the index stays on disk until first needed."""
        self._summarized = summary
        self.size, self.next_offset = summary.size, summary.next_offset
        self.records_count, self.max_timestamp_ms = summary.records, summary.max_timestamp_ms
        self.lost_rows, self.writers = summary.lost_rows, dict(summary.writers)
        self.holes = list(summary.holes)
        self._index_crc = summary.index_crc
        self._on_disk = (summary.records, summary.size, summary.index_crc)
        self._index, self._pending = None, SegmentIndex()

    def _take(self, walk: Walk) -> None:
        self.io["bytes_read"] += walk.bytes_read
        self.io["headers_parsed"] += len(walk.records)
        for damage in walk.damage:
            self.holes.append((damage.start_offset, damage.end_offset))
            log.error("%s: %s: offsets %d..%d are lost (%s); the records after them are kept",
                      self.label, self.path.name, damage.start_offset, damage.end_offset - 1,
                      damage.reason)
        with self._load_lock:
            for header in walk.records:
                self._note(header)

    def _note(self, header: RecordHeader) -> bytes:
        """Account for one record (walked or appended); returns its index entry."""
        self._summarized = None
        ts = header.timestamp_ms if self.max_timestamp_ms is None else max(self.max_timestamp_ms,
                                                                            header.timestamp_ms)
        self.max_timestamp_ms = ts
        self._headers[self.records_count] = header
        self.records_count += 1
        entry = INDEX_ENTRY.pack(header.base_offset, header.position, ts)
        self._index_crc = zlib.crc32(entry, self._index_crc)
        (self._index if self._index is not None else self._pending).append(
            header.base_offset, header.position, ts)
        if header.lost is not None:
            self.lost_rows += header.num_rows
        elif header.writer_id is not None and header.sequence is not None:
            self.writers[header.writer_id] = header.sequence
        self.next_offset = max(self.next_offset, header.next_offset)
        self.size = max(self.size, header.end_position)
        return entry

    def _write_index(self, trusted: int) -> None:
        """Make the index file hold the ``trusted`` entries already there plus every entry noted
        in memory after them."""
        tail = (self._pending if self._index is None else self._index).to_bytes(
            0 if self._index is None else trusted)
        if not tail and _file_size(self.index_path) == trusted * INDEX_ENTRY.size:
            return  # a clean close: the index is what it should be (no write at open)
        fd = os.open(self.index_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.ftruncate(fd, trusted * INDEX_ENTRY.size)
            os.pwrite(fd, tail, trusted * INDEX_ENTRY.size)
        finally:
            os.close(fd)

    def summary(self, sealed: bool) -> SegmentSummary:
        return SegmentSummary(self.base_offset, self.next_offset, self.records_count, self.size,
                              self.max_timestamp_ms, self.lost_rows, self._index_crc, sealed,
                              dict(self.writers), list(self.holes))

    # -- index and headers, loaded lazily ----------------------------------------------------

    def view(self) -> SegmentIndex:
        """The segment's index (loaded on first use). Live for the active segment: entries are
        appended as records are; a reader bounds itself by the end offset it snapshotted."""
        with self._load_lock:
            index = self._index
            if index is None:
                try:
                    index = self._load_index()
                except FileNotFoundError:
                    raise self._gone() from None
                index.extend(self._pending)
                self._index, self._pending = index, SegmentIndex()
        if self.sealed and not self._released:  # weighed as if every header were loaded
            LOADED.touch(self, len(index))
        return index

    def _load_index(self) -> SegmentIndex:
        records, size, crc = self._on_disk
        try:
            with open(self.index_path, "rb") as handle:
                data = handle.read(records * INDEX_ENTRY.size)
        except FileNotFoundError:
            data = b""
        self.io["bytes_read"] += len(data)
        if len(data) == records * INDEX_ENTRY.size and zlib.crc32(data) == crc:
            return SegmentIndex.from_bytes(data)
        log.warning("%s: the index of %s is missing or stale; rebuilding it from the records",
                    self.label, self.path.name)
        walk = walk_records(self._pread, size, 0, self.base_offset, False)
        self.io["bytes_read"] += walk.bytes_read
        self.io["headers_parsed"] += len(walk.records)
        index, headers, ts = SegmentIndex(), {}, None
        for number, header in enumerate(walk.records):
            ts = header.timestamp_ms if ts is None else max(ts, header.timestamp_ms)
            index.append(header.base_offset, header.position, ts)
            headers[number] = header
        for damage in walk.damage:
            if (damage.start_offset, damage.end_offset) not in self.holes:
                self.holes.append((damage.start_offset, damage.end_offset))
        # Records noted after the on-disk part keep their headers, renumbered after the walked ones.
        for i in range(len(self._pending)):
            header = self._headers.get(records + i)
            if header is not None:
                headers[len(index) + i] = header
        self._headers = headers
        self.records_count = len(index) + len(self._pending)
        prefix = index.to_bytes()
        self._on_disk = (len(index), size, zlib.crc32(prefix))
        self._index_crc = zlib.crc32(self._pending.to_bytes(), self._on_disk[2])
        self._replace_index_file(prefix + self._pending.to_bytes())
        return index

    def _replace_index_file(self, data: bytes) -> None:
        tmp = self.index_path.with_name(self.index_path.name + ".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, self.index_path)
        if self._index_fd is not None:  # appends must go to the new file
            os.close(self._index_fd)
            self._index_fd = os.open(self.index_path, os.O_WRONLY | os.O_APPEND)

    def header(self, number: int, index: SegmentIndex) -> RecordHeader:
        """The header of record ``number`` (parsed on first use); DataLoss when it is unreadable."""
        header = self._headers.get(number)
        if header is not None:
            return header
        position = index.positions[number]
        try:
            header = read_header(self._pread, position, self.size)
        except FileNotFoundError:
            raise self._gone() from None
        self.io["headers_parsed"] += 1
        if header is None or header.base_offset != index.bases[number]:
            end = index.bases[number + 1] if number + 1 < len(index) else self.next_offset
            raise DataLoss(f"{self.label}: log offsets {index.bases[number]}..{end - 1} are lost: "
                           f"the record header at byte {position} of {self.path.name} fails its "
                           "checks; run `flightstore repair` to declare the loss")
        self._headers[number] = header
        return header

    def _gone(self) -> CorruptData:
        return CorruptData(f"{self.label}: segment {self.path.name} was deleted while being read "
                           "(retention)")

    def _pread(self, size: int, position: int) -> bytes:
        if self._read_fd is None:
            self._read_fd = os.open(self.path, os.O_RDONLY)
        data = os.pread(self._read_fd, size, position)
        self.io["bytes_read"] += len(data)
        return data

    def _unload(self) -> None:
        """Drop the index and headers of a sealed segment (re-read when needed)."""
        with self._load_lock:
            if self.sealed and not self._released:
                self._index, self._pending, self._headers = None, SegmentIndex(), {}

    @property
    def loaded(self) -> bool:
        return self._index is not None

    # -- writing -----------------------------------------------------------------------------

    def append(self, header_bytes: bytes, payload: pa.Buffer | bytes = b"") -> int:
        """Write one record at the end of the file (not fsynced: see the tablet's group commit);
        return its position. On a failed write the file is truncated back, so a live process never
        leaves a torn record behind (a crash may; recovery cuts it)."""
        if self._log_fd is None:
            self._log_fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
            self._index_fd = os.open(self.index_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        position = self.size
        try:
            _write_all(self._log_fd, [header_bytes, memoryview(payload)])
        except BaseException:
            os.ftruncate(self._log_fd, position)
            raise
        self.size = position + len(header_bytes) + len(memoryview(payload))
        return position

    def add(self, header: RecordHeader) -> None:
        """Register an appended record in memory and in the index file."""
        with self._load_lock:
            entry = self._note(header)
            if self._index_fd is not None:
                _write_all(self._index_fd, [entry])

    def skip_to(self, offset: int) -> None:
        """Offsets from :attr:`next_offset` up to ``offset`` are lost (a hole; the next record
        appended starts at ``offset``)."""
        if offset > self.next_offset:
            self._summarized = None
            self.holes.append((self.next_offset, offset))
            self.next_offset = offset

    def sync_fd(self) -> int | None:
        """A duplicate of the append descriptor for an fsync outside the tablet lock (or None)."""
        return os.dup(self._log_fd) if self._log_fd is not None else None

    def seal(self, fsync: bool) -> None:
        """Stop appending: make the file durable (``fsync``) and write its final summary."""
        self._finish(sealed=True, fsync=fsync)
        LOADED.touch(self, self.records_count)

    def checkpoint(self, fsync: bool) -> None:
        """Close the active segment cleanly: its summary lets the next open skip verifying it."""
        self._finish(sealed=False, fsync=fsync)

    def _finish(self, sealed: bool, fsync: bool) -> None:
        with self._load_lock:
            for fd in (self._log_fd, self._index_fd):
                if fd is not None:
                    if fsync:
                        os.fsync(fd)
                    os.close(fd)
            self._log_fd = self._index_fd = None
            self.sealed = self.sealed or sealed
            if self._index is None:
                self._pending = SegmentIndex()  # every entry is in the index file now
            self._on_disk = (self.records_count, self.size, self._index_crc)
            summary = self.summary(sealed)
            if summary != self._summarized:  # unchanged since opened from it: nothing to write
                write_summary(self.summary_path, summary, fsync)
                self._summarized = summary

    # -- reading -----------------------------------------------------------------------------

    def read_batch(self, record: RecordHeader, included_fields: Sequence[int] | None,
                   schema: pa.Schema, compressed: bool = False) -> tuple[pa.RecordBatch, int]:
        """Decode and check ``record``'s payload (see :class:`PayloadReader`)."""
        return self._payloads.read_batch(record, included_fields, schema, compressed)

    def read_payload(self, record: RecordHeader) -> pa.Buffer:
        """``record``'s payload bytes as stored (a zero-copy view of the file's map), unchecked:
        replication sends them with their CRC and the receiver checks it."""
        return self._payloads.raw(record)

    # -- closing -----------------------------------------------------------------------------

    def close(self) -> None:
        """Release every file handle (batches already read keep their mapping alive)."""
        if self._released:  # its descriptor closes with the object (release())
            return
        with self._load_lock:
            for fd in (self._log_fd, self._index_fd, self._read_fd):
                if fd is not None:
                    os.close(fd)
            self._log_fd = self._index_fd = self._read_fd = None
        self._payloads.close()
        LOADED.forget(self)

    def release(self) -> None:
        """Remove the files of a sealed segment that readers may still hold (the log dropped it
        because another copy holds its records: remote storage). What a read needs (the index,
        a descriptor for headers, the payload map) is opened first and kept until the last
        reader drops the object, so a read that took the segment before finishes whole."""
        with self._load_lock:
            self.view()
            if self._read_fd is None:
                self._read_fd = os.open(self.path, os.O_RDONLY)
            self._payloads.open_now()
            self._released = True
            weakref.finalize(self, os.close, self._read_fd)
        LOADED.forget(self)
        for path in (self.path, self.index_path, self.summary_path):
            path.unlink(missing_ok=True)

    def delete(self) -> None:
        """Remove the segment's files (a reader that already opened it keeps its handle)."""
        self.close()
        for path in (self.path, self.index_path, self.summary_path):
            try:
                path.unlink()
            except FileNotFoundError:
                pass


def _file_size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


def _write_all(fd: int, parts: list[Any]) -> None:
    views = [memoryview(p).cast("B") for p in parts if len(memoryview(p))]
    while views:
        written = os.writev(fd, views)
        while views and written >= len(views[0]):
            written -= len(views[0])
            views.pop(0)
        if views and written:
            views[0] = views[0][written:]
