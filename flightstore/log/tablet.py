"""One bucket's log: append record batches, read them back by offset with column and filter pushdown.

A :class:`LogTablet` owns a directory of segments (format in :mod:`flightstore.log.segment`). Every
row gets an offset, increasing from 0 without gaps; one append is one record covering
``[base_offset, base_offset + num_rows)``. Appends are serialized by a lock and durable in the OS
(or on disk with ``fsync=True``) when :meth:`LogTablet.append` returns. Reads take a snapshot of the
end offset and never block appends; they read only the requested columns from disk and skip records
whose statistics prove a filter cannot match.

The tablet stores whatever schema it is given; it does not interpret any column (the KV layer's
``_change_type`` is just another int8 column here).
"""

from __future__ import annotations

import bisect
import itertools
import json
import logging
import os
import threading
import time
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from flightstore.errors import (
    CorruptData,
    DataLoss,
    FlightstoreError,
    InvalidInput,
    NotEnoughReplicas,
    OffsetOutOfRange,
    SchemaMismatch,
    SchemaVersionUnknown,
)
from flightstore.expressions import Predicate
from flightstore.log import durability
from flightstore.log.durability import GroupCommit
from flightstore.log.record import (
    COMPRESSIONS,
    RawRecord,
    RecordHeader,
    compute_statistics,
    encode_lost_range,
    encode_payload,
    encode_record,
    payload_checksums,
    read_header,
    statistics_from_json,
)
from flightstore.log.schemas import SchemaEpochs, needed_indices
from flightstore.log.segment import Segment
from flightstore.schema import conform

__all__ = ["LogBatch", "LogTablet", "RawRecord"]

log = logging.getLogger("flightstore.log")
_SEGMENT_SUFFIX = ".log"


@dataclass(frozen=True)
class LogBatch:
    """Rows of one stored record, as returned by :meth:`LogTablet.read`.

    ``base_offset``/``next_offset`` describe the stored record; ``batch`` holds only the requested
    columns and only the rows inside the read range that pass the filter, and ``row_offsets`` gives
    the offset of each of those rows.
    """

    base_offset: int
    next_offset: int
    timestamp_ms: int
    batch: pa.RecordBatch
    offsets: pa.Array | int  # the offset of each row, or (unfiltered) the offset of the first row
    writer_id: str | None
    sequence: int | None

    @property
    def row_offsets(self) -> pa.Array:
        """The int64 offset of each row of ``batch`` (built only when asked for)."""
        if isinstance(self.offsets, int):
            return pa.array(np.arange(self.offsets, self.offsets + self.batch.num_rows, dtype=np.int64))
        return self.offsets


class LogTablet:
    """The log of one bucket: a directory of append-only segment files."""

    # The bucket's remote storage tier (flightstore.remote.bucket.RemoteBucket), when the server
    # has `remote.data.dir`: it holds the uploaded segments below the local ones (attach_remote).
    remote = None

    def __init__(self, directory: str | os.PathLike, schema: pa.Schema, *,
                 compression: str = "NONE", segment_bytes: int = 256 * 1024 * 1024,
                 statistics_columns: Sequence[str] = (), ttl_ms: int | None = None,
                 fsync: bool = True, label: str | None = None, schema_version: int = 1,
                 past_schemas: Mapping[int, pa.Schema] | None = None) -> None:
        """Open the log in ``directory`` (created if missing), recovering a torn tail.

        ``statistics_columns`` may contain ``"*"`` for every column; columns whose type has no
        min/max simply get no statistics. Raises :class:`InvalidInput` for an unknown compression
        or statistics column. ``fsync``: an append returns once its record is on disk (appends of
        concurrent writers share fsyncs). ``label`` names the log in errors (table and bucket).
        ``schema`` is the log's schema at ``schema_version``; ``past_schemas`` gives the log schemas
        of earlier versions, so records written under them read back conformed to ``schema`` (see
        :mod:`flightstore.log.schemas`).
        """
        if compression not in COMPRESSIONS:
            raise InvalidInput(f"unknown log compression {compression!r}; use one of "
                               f"{', '.join(COMPRESSIONS)}")
        if segment_bytes < 1:
            raise InvalidInput("segment_bytes must be positive")
        if "*" in statistics_columns:
            statistics_columns = schema.names
        unknown = [c for c in statistics_columns if c not in schema.names]
        if unknown:
            raise InvalidInput(f"unknown statistics column(s) {', '.join(unknown)}")
        self.schema = schema.remove_metadata()
        self.directory = Path(directory)
        self.label = label or str(self.directory)
        self.compression = compression
        self.segment_bytes = segment_bytes
        self.ttl_ms = ttl_ms
        self.fsync = fsync
        self._stats_columns = tuple(dict.fromkeys(statistics_columns))
        self._lock = threading.Lock()
        self._appended = threading.Condition(self._lock)
        self._stats_lock = threading.Lock()
        self._io = {"bytes_read": 0, "records_read": 0, "records_skipped": 0}
        self._closed = False
        self.directory.mkdir(parents=True, exist_ok=True)
        self._segments = self._open_segments()
        self._end_offset = self._segments[-1].next_offset
        self._schemas = {version: s.remove_metadata() for version, s in (past_schemas or {}).items()}
        self._version = schema_version
        self._epochs = SchemaEpochs(self.directory, schema_version, self._end_offset,
                                    has_records=self._end_offset > 0, fsync=fsync)
        unknown_versions = self._epochs.versions - set(self._schemas) - {schema_version}
        if unknown_versions:
            raise CorruptData(f"{self.directory}: records of schema version(s) "
                              f"{sorted(unknown_versions)} but no such schema was given")
        self._writers: dict[str, tuple[int, int]] = {}  # writer -> (last sequence, its record's ms)
        for segment in self._segments:
            # A writer's last write time is its last segment's newest record time: never earlier
            # than the truth, so writer expiry is never early (and the open reads no headers).
            newest = segment.max_timestamp_ms or 0
            self._writers.update({w: (seq, newest) for w, seq in segment.writers.items()})
        self._group = GroupCommit(self._end_offset)
        # The high watermark: None while the log is not replicated (every appended record is
        # committed at once); set by the bucket's replica otherwise (see flightstore.replica).
        self._hw: int | None = None
        # A follower replica's log takes records (and their schema versions) from its leader only.
        self.following = False
        self._cuts: list[int] = []  # where each truncate_to cut the log, in order (see cut_below)
        # Whether this replica leads its bucket (uploads to remote storage are the leader's).
        self.leading = True
        self.commit_timeout_s = 30.0  # reads waiting for the high watermark (set by the replica)
        # A new leader answers reads only once its high watermark covers the log it took office
        # with: before that, what it would answer may be shorter than what was acknowledged.
        self.read_floor = 0
        self._open_io = {key: sum(s.io[key] for s in self._segments)
                         for key in ("headers_parsed", "bytes_read")}

    def _open_segments(self) -> list[Segment]:
        """Sealed segments from their summaries, the active one verified (see segment.py)."""
        bases = sorted(int(p.stem) for p in self.directory.glob("*" + _SEGMENT_SUFFIX)
                       if p.stem.isdigit())
        if not bases:
            return [Segment.create(self.directory, 0, self.label, self.fsync)]
        segments = [Segment.open_sealed(self.directory, base, self.label, self.fsync)
                    for base in bases[:-1]]
        segments.append(Segment.open_active(self.directory, bases[-1], self.label, self.fsync))
        for previous, segment in itertools.pairwise(segments):
            if segment.base_offset < previous.next_offset:
                raise DataLoss(f"{self.label}: segment {segment.path.name} starts at offset "
                               f"{segment.base_offset} inside {previous.path.name}, which reaches "
                               f"{previous.next_offset}; run `flightstore verify`")
            if segment.base_offset > previous.next_offset:
                log.error("%s: offsets %d..%d are lost: no segment holds them", self.label,
                          previous.next_offset, segment.base_offset - 1)
        return segments

    # -- offsets -----------------------------------------------------------------------------

    @property
    def start_offset(self) -> int:
        """The first offset still retained (in remote storage when older segments are there)."""
        local = self._segments[0].base_offset
        return local if self.remote is None else self.remote.start_offset(local)

    @property
    def local_start_offset(self) -> int:
        """The first offset held on local disk."""
        return self._segments[0].base_offset

    @property
    def end_offset(self) -> int:
        """The offset the next appended row will get."""
        return self._end_offset

    @property
    def high_watermark(self) -> int:
        """The end of what readers may see: every in-sync replica holds the records below it.
        Unreplicated (a single server, or replication factor 1) it is :attr:`end_offset`."""
        hw = self._hw
        return self._end_offset if hw is None else hw

    @property
    def replicated(self) -> bool:
        return self._hw is not None

    def set_high_watermark(self, offset: int | None) -> None:
        """Set the high watermark (None: unreplicated, it follows the end offset). It never passes
        the end offset; waiting readers and subscribers wake."""
        with self._lock:
            self._hw = None if offset is None else min(int(offset), self._end_offset)
            self._appended.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def schema_version(self) -> int:
        return self._version

    def evolve(self, schema: pa.Schema, version: int,
               statistics_columns: Sequence[str] | None = None) -> None:
        """Append under ``schema`` (schema ``version``) from now on; records written before keep
        their schema and read back conformed (new columns NULL). Durable before it returns."""
        schema = schema.remove_metadata()
        with self._lock:
            self._check_open()
            if version == self._version:
                return
            if self.following:  # the leader's records say where its version begins (append_raw)
                self._schemas[version] = schema
            else:
                self._epochs.begin(version, self._end_offset)
            self._schemas[self._version] = self.schema
            self.schema, self._version = schema, version
            if statistics_columns is not None:
                wanted = schema.names if "*" in statistics_columns else statistics_columns
                self._stats_columns = tuple(dict.fromkeys(c for c in wanted if c in schema.names))

    @property
    def lost_rows(self) -> int:
        """Offsets of retained segments that ``flightstore repair`` declared lost."""
        local = sum(segment.lost_rows for segment in self._segments)
        if self.remote is None:
            return local
        return local + self.remote.lost_rows(self._segments[0].base_offset)

    def damage(self) -> list[tuple[int, int]]:
        """Offset ranges ``[start, end)`` known to be lost and not declared yet (reads crossing
        them raise :class:`DataLoss`). Holes inside sealed segments that were never read since they
        were sealed are found by reads and by ``flightstore verify``."""
        with self._lock:
            segments = self._segments
        ranges: list[tuple[int, int]] = []
        for previous, segment in itertools.pairwise(segments):
            if segment.base_offset > previous.next_offset:
                ranges.append((previous.next_offset, segment.base_offset))
        for segment in segments:
            ranges.extend(segment.holes)
        return sorted(ranges)

    def skip_to(self, offset: int) -> None:
        """Continue at ``offset``: the offsets from :attr:`end_offset` up to it are lost (a hole,
        reported by :meth:`damage`). A primary-key table calls this when its KV applied more of
        the changelog than the log still holds: new changes must not reuse those offsets."""
        with self._lock:
            self._check_open()
            if offset > self._end_offset:
                self._segments[-1].skip_to(offset)
                self._end_offset = offset

    def open_io(self) -> dict:
        """What opening read: ``headers_parsed`` (record headers) and ``bytes_read`` (of segment
        files and sidecars). Independent of the number of records in sealed segments."""
        return dict(self._open_io)

    # -- writing -----------------------------------------------------------------------------

    def _conform(self, data: pa.RecordBatch | pa.Table) -> pa.RecordBatch:
        if isinstance(data, pa.Table):
            batches = data.to_batches()
            data = (pa.concat_batches(batches) if batches
                    else pa.RecordBatch.from_pylist([], schema=data.schema))
        elif not isinstance(data, pa.RecordBatch):
            raise InvalidInput(f"append needs a pyarrow RecordBatch or Table, not "
                               f"{type(data).__name__}")
        got, want = data.schema, self.schema
        if got.names != want.names or any(not g.type.equals(w.type) for g, w in zip(got, want)):
            raise SchemaMismatch(
                f"data schema ({', '.join(f'{f.name} {f.type}' for f in got)}) does not match the "
                f"log schema ({', '.join(f'{f.name} {f.type}' for f in want)})")
        if not got.equals(want, check_metadata=False) or got.metadata:
            data = pa.RecordBatch.from_arrays(data.columns, schema=want)
        for field, column in zip(want, data.columns):
            if not field.nullable and column.null_count:
                raise SchemaMismatch(f"column {field.name!r} is NOT NULL but has "
                                     f"{column.null_count} null value(s)")
        return data

    def append(self, data: pa.RecordBatch | pa.Table, *, writer_id: str | None = None,
               sequence: int | None = None, timestamp_ms: int | None = None,
               durable: bool = True) -> int:
        """Append all rows of ``data`` as one record; return the offset of its first row.

        ``data`` must have the log's column names and types (nullability may differ; NOT NULL
        columns must hold no nulls), else :class:`SchemaMismatch` and nothing is written. Empty
        data writes nothing and returns :attr:`end_offset`. When this returns, the record is in the
        OS and, with ``fsync`` (and ``durable``), on disk; a crash mid-write leaves a tail that
        recovery cuts. ``durable=False`` lets a caller holding its own locks return at once and
        call :meth:`sync` after releasing them, so that concurrent writers share one fsync.
        """
        self._check_open()
        if writer_id is not None and not isinstance(writer_id, str):
            raise InvalidInput(f"writer_id must be a string, not {type(writer_id).__name__}")
        for name, value in (("sequence", sequence), ("timestamp_ms", timestamp_ms)):
            if value is not None and (not isinstance(value, (int, np.integer))
                                      or not -2**63 <= value < 2**63):
                raise InvalidInput(f"{name} must be a 64-bit integer, not {value!r}")
        batch = self._conform(data)
        if batch.num_rows == 0:
            return self._end_offset
        stats = compute_statistics(batch, self._stats_columns)
        stats_raw = json.dumps(stats, separators=(",", ":")).encode("utf-8") if stats else b""
        payload = encode_payload(batch, self.compression)
        checksums = tuple(payload_checksums(payload, batch.schema))
        payload_crc = zlib.crc32(payload)
        with self._lock:
            self._check_open()
            base = self._end_offset
            ts = int(time.time() * 1000) if timestamp_ms is None else int(timestamp_ms)
            active = self._segments[-1]

            def encoded(position: int) -> bytes:
                return encode_record(base, batch.num_rows, ts, writer_id, sequence, stats_raw,
                                     payload, checksums, position, payload_crc)

            header_bytes = encoded(active.size)
            if active.size > 0 and active.size + len(header_bytes) + payload.size > self.segment_bytes:
                active.seal(self.fsync)
                if self.fsync:
                    self._group.advance(base)
                active = Segment.create(self.directory, base, self.label, self.fsync)
                self._segments = self._segments + [active]
                header_bytes = encoded(active.size)
            position = active.append(header_bytes, payload)
            header = RecordHeader(
                base, batch.num_rows, ts, writer_id, sequence, statistics_from_json(stats),
                position, position + len(header_bytes), payload.size, payload_crc, checksums,
                None, stats_raw)
            active.add(header)
            if writer_id is not None and sequence is not None:
                self._writers[writer_id] = (sequence, ts)
            self._end_offset = header.next_offset
            self._appended.notify_all()
        if durable:
            self.sync(header.next_offset)
        return base

    def sync(self, offset: int | None = None) -> None:
        """Return once every record below ``offset`` (default: the end) is on disk; at once
        without ``fsync``. Concurrent callers share fsyncs (:mod:`flightstore.log.durability`)."""
        if self.fsync:
            self._group.wait(self._end_offset if offset is None else offset, self._flush)

    def _flush(self) -> int:
        with self._lock:
            covered = self._end_offset
            fd = None if self._closed else self._segments[-1].sync_fd()
        if fd is not None:
            try:
                durability.fsync_file(fd)
            finally:
                os.close(fd)
        return covered

    @property
    def fsyncs(self) -> int:
        """fsyncs of the group commit so far (fewer than appends when writers are concurrent)."""
        return self._group.syncs

    # -- reading -----------------------------------------------------------------------------

    def read(self, from_offset: int = 0, *, columns: Sequence[str] | None = None,
             filter: Predicate | None = None, to_offset: int | None = None,
             max_bytes: int | None = None, max_rows: int | None = None,
             exact: bool = True, uncommitted: bool = False) -> Iterator[LogBatch]:
        """Records overlapping ``[from_offset, to_offset)``, in offset order.

        Reads stop at the :attr:`high_watermark` (``uncommitted``: at the end offset; only the
        replica's own KV and replication read past it).

        ``from_offset`` below :attr:`start_offset` is clamped to it; ``to_offset`` defaults to the
        end offset at call time (later appends are not seen). Rows outside the range are sliced
        off. Only ``columns`` (default: all, in the requested order) are read from disk. ``filter``
        must be bound to the log schema: records whose statistics rule it out are not read, the
        others are filtered row by row; records left with no rows are not yielded. ``max_rows`` /
        ``max_bytes`` (of the returned batches) stop the read after the record that reaches them.
        ``exact=False`` skips records by statistics only and returns the others whole (for callers
        that filter the rows again). Unknown columns raise :class:`InvalidInput` at call time.
        """
        self._check_open()
        names = list(self.schema.names if columns is None else columns)
        known = set(self.schema.names)
        unknown = [c for c in names if c not in known]
        if filter is not None:
            unknown += [c for c in sorted(filter.columns()) if c not in known]
        if unknown:
            raise InvalidInput(f"unknown column(s) {', '.join(unknown)}; the log has "
                               f"{', '.join(self.schema.names)}")
        if not uncommitted and self.high_watermark < self.read_floor:
            self.await_committed(self.read_floor)
        with self._lock:
            segments = self._segments
            end = self._end_offset if uncommitted else self.high_watermark
        upper = end if to_offset is None else min(int(to_offset), end)
        if self.remote is not None and int(from_offset) < segments[0].base_offset:
            segments = self.remote.segments_below(segments[0].base_offset) + segments
        lower = max(int(from_offset), segments[0].base_offset)
        return self._read(segments, lower, upper, names, filter, max_bytes, max_rows, exact)

    def _read(self, segments: list[Segment], lower: int, upper: int, names: list[str],
              filter: Predicate | None, max_bytes: int | None,
              max_rows: int | None, exact: bool = True) -> Iterator[LogBatch]:
        """Records of ``[lower, upper)``; every offset must be held by a record (lost-range records
        declared by repair count, and are skipped), else :class:`DataLoss`: an answer with rows
        missing is never given."""
        needed = set(names) | (filter.columns() if filter is not None and exact else set())
        schema, current = self.schema, self._version
        versioned = len(self._epochs.versions) > 1
        included = needed_indices(schema, needed)
        include_all = len(included) == len(schema)
        expression = filter.to_arrow() if filter is not None and exact else None
        rows_out = bytes_out = 0
        if upper <= lower:
            return
        expected = lower  # the next offset the read must meet
        first = max(bisect.bisect_right([s.base_offset for s in segments], lower) - 1, 0)
        for segment in segments[first:]:
            if segment.base_offset >= upper:
                break
            if segment.base_offset > expected:
                raise self._lost(expected, min(segment.base_offset, upper))
            index = segment.view()
            count = len(index)
            number = index.record_for_offset(lower)
            while number < count and index.bases[number] < upper:
                record = segment.header(number, index)
                number += 1
                if record.next_offset <= expected:
                    continue
                if record.base_offset > expected:
                    raise self._lost(expected, min(record.base_offset, upper))
                expected = record.next_offset
                if record.lost is not None:
                    continue
                if filter is not None and not filter.might_match(record.stats):
                    self._count(0, skipped=1)
                    continue
                version = self._epochs.version_at(record.base_offset) if versioned else current
                if version == current:  # the schema captured above: an evolve() meanwhile changes nothing here
                    batch = self._decode(segment, record, included, include_all, schema)
                else:
                    batch = self._decode_version(segment, record, version, schema, needed)
                start = max(lower, record.base_offset) - record.base_offset
                stop = min(upper, record.next_offset) - record.base_offset
                if start or stop < record.num_rows:
                    batch = batch.slice(start, stop - start)
                offsets: pa.Array | int = record.base_offset + start
                if expression is not None:
                    offsets = pa.array(np.arange(offsets, record.base_offset + stop, dtype=np.int64))
                    batch, offsets = _filter_rows(batch, offsets, expression)
                    if batch.num_rows == 0:
                        continue
                if batch.schema.names != names:
                    batch = batch.select(names)
                yield LogBatch(record.base_offset, record.next_offset, record.timestamp_ms, batch,
                               offsets, record.writer_id, record.sequence)
                if max_rows is not None:
                    rows_out += batch.num_rows
                    if rows_out >= max_rows:
                        return
                if max_bytes is not None:
                    bytes_out += batch.nbytes
                    if bytes_out >= max_bytes:
                        return
        if expected < upper:
            raise self._lost(expected, upper)

    def _lost(self, start: int, end: int) -> DataLoss:
        return DataLoss(f"{self.label}: log offsets {start}..{end - 1} are lost (corrupt or missing "
                        "records); the answer would be incomplete. Run `flightstore verify` to see "
                        "the damage and `flightstore repair` to declare it")

    def _decode(self, segment: Segment, record: RecordHeader, included: list[int],
                include_all: bool, schema: pa.Schema | None = None) -> pa.RecordBatch:
        if not included:  # no column needed (e.g. a count): nothing to read
            self._count(0, read=1)
            return pa.RecordBatch.from_struct_array(pa.nulls(record.num_rows, pa.struct([])))
        schema = self.schema if schema is None else schema
        batch, nbytes = segment.read_batch(record, None if include_all else included, schema,
                                           compressed=self.compression != "NONE")
        self._count(nbytes, read=1)
        return batch

    def _decode_version(self, segment: Segment, record: RecordHeader, version: int,
                        schema: pa.Schema, needed: set[str]) -> pa.RecordBatch:
        """``record``, written under schema ``version``, as the ``needed`` columns of ``schema``."""
        old = self._schemas[version]
        included = needed_indices(old, needed)
        names = [name for name in schema.names if name in needed]
        if included:
            batch = self._decode(segment, record, included, len(included) == len(old), old)
        else:
            batch = pa.RecordBatch.from_struct_array(pa.nulls(record.num_rows, pa.struct([])))
        return conform(batch, schema, names, record.num_rows)

    def _count(self, nbytes: int, read: int = 0, skipped: int = 0) -> None:
        with self._stats_lock:
            self._io["bytes_read"] += nbytes
            self._io["records_read"] += read
            self._io["records_skipped"] += skipped

    def io_stats(self) -> dict:
        """I/O of :meth:`read` since open: ``bytes_read`` from segment files, ``records_read``
        (decoded) and ``records_skipped`` (ruled out by statistics)."""
        with self._stats_lock:
            return dict(self._io)

    # -- replication: records verbatim, truncation --------------------------------------------

    def read_raw(self, from_offset: int, max_bytes: int, to_offset: int | None = None) -> list[RawRecord]:
        """Whole stored records from ``from_offset`` (a record boundary) on, committed or not, up to
        about ``max_bytes`` of payload (at least one record): what a leader sends its followers.
        :class:`~flightstore.errors.OffsetOutOfRange` below the log's start or past its end."""
        self._check_open()
        with self._lock:
            segments, end = self._segments, self._end_offset
        upper = end if to_offset is None else min(int(to_offset), end)
        if from_offset < segments[0].base_offset or from_offset > end:
            raise OffsetOutOfRange(f"{self.label}: offset {from_offset} is outside the log "
                                   f"[{segments[0].base_offset}, {end})")
        out: list[RawRecord] = []
        size = 0
        first = max(bisect.bisect_right([s.base_offset for s in segments], from_offset) - 1, 0)
        for segment in segments[first:]:
            if segment.base_offset >= upper:
                break
            index = segment.view()
            number = index.record_for_offset(from_offset)
            while number < len(index) and index.bases[number] < upper:
                record = segment.header(number, index)
                number += 1
                if record.next_offset <= from_offset:
                    continue
                if record.base_offset != from_offset and not out:
                    raise InvalidInput(f"{self.label}: offset {from_offset} is not the start of a "
                                       f"record (the record at {record.base_offset} holds it)")
                payload = b"" if record.lost is not None else segment.read_payload(record)
                out.append(RawRecord(record.base_offset, record.num_rows, record.timestamp_ms,
                                     record.writer_id, record.sequence, record.stats_raw,
                                     record.checksums, record.payload_crc, payload,
                                     self._epochs.version_at(record.base_offset), record.lost))
                size += record.payload_len
                if size >= max_bytes:
                    return out
        return out

    def append_raw(self, record: RawRecord, *, durable: bool = False) -> None:
        """Append a record read from another replica's log at exactly its offsets (it must start
        at :attr:`end_offset`), after checking its payload CRC. Its schema version must be one the
        log knows (:class:`SchemaVersionUnknown` otherwise: the catalog has not caught up yet)."""
        self._check_open()
        payload = record.payload
        if record.lost is None and zlib.crc32(payload) != record.payload_crc:
            raise DataLoss(f"{self.label}: a replicated record at offset {record.base_offset} fails "
                           "its payload checksum")
        with self._lock:
            self._check_open()
            base = self._end_offset
            if record.base_offset != base:
                raise InvalidInput(f"{self.label}: a replicated record starts at offset "
                                   f"{record.base_offset} but the log ends at {base}")
            version = record.schema_version
            if version != self._epochs.version_at(base):
                if version != self._version and version not in self._schemas:
                    raise SchemaVersionUnknown(f"{self.label}: schema version {version} is not known "
                                               "here yet")
                self._epochs.place(version, base)
            active = self._segments[-1]

            def encoded(position: int) -> bytes:
                if record.lost is not None:
                    return encode_lost_range(base, record.num_rows, record.timestamp_ms, record.lost,
                                             position)
                return encode_record(base, record.num_rows, record.timestamp_ms, record.writer_id,
                                     record.sequence, record.stats_raw, payload, record.checksums,
                                     position, record.payload_crc)

            header_bytes = encoded(active.size)
            if active.size > 0 and active.size + len(header_bytes) + len(payload) > self.segment_bytes:
                active.seal(self.fsync)
                if self.fsync:
                    self._group.advance(base)
                active = Segment.create(self.directory, base, self.label, self.fsync)
                self._segments = self._segments + [active]
                header_bytes = encoded(active.size)
            position = active.append(header_bytes, payload if record.lost is None else b"")
            header = read_header(lambda n, p: header_bytes[p - position:p - position + n], position,
                                 position + len(header_bytes) + len(payload))
            if header is None:  # our own encoding: never expected
                raise CorruptData(f"{self.label}: a replicated record header does not read back")
            active.add(header)
            if record.writer_id is not None and record.sequence is not None and record.lost is None:
                self._writers[record.writer_id] = (record.sequence, record.timestamp_ms)
            self._end_offset = header.next_offset
            self._appended.notify_all()
        if durable:
            self.sync(header.next_offset)

    def reset(self, offset: int) -> None:
        """Drop every record and continue at ``offset``: a follower far behind a leader whose log
        no longer starts at its end restarts from the leader's start (nothing is a hole: the
        offsets before it are not held anywhere any more)."""
        with self._lock:
            self._check_open()
            for segment in self._segments:
                segment.close()
                segment.delete()
            Segment.create(self.directory, offset, self.label, self.fsync)
            self._segments = self._open_segments()
            self._end_offset = offset
            self._writers = {}
            self._epochs.truncate_from(offset)
            self._cuts.append(-1)  # everything went: a waiter's records are not here any more
            self._group.reset(offset)
            if self._hw is not None:
                self._hw = offset
            self._appended.notify_all()

    def truncate_to(self, offset: int) -> int:
        """Cut every record at or after ``offset`` (a record boundary); returns the new end offset.

        A follower does this where its log diverges from its new leader's (see
        :mod:`flightstore.replica.epochs`); nothing below the high watermark is ever cut there. An
        ``offset`` below the log's start empties the log, which then continues at ``offset``."""
        with self._lock:
            self._check_open()
            if offset >= self._end_offset:
                return self._end_offset
            segments = self._segments
            keep = [s for s in segments if s.base_offset < offset]
            cut = None  # (segment, byte position) where the kept part ends
            if keep:
                last = keep[-1]
                index = last.view()
                number = bisect.bisect_left(index.bases, offset)
                if number and last.header(number - 1, index).next_offset > offset:
                    raise InvalidInput(f"{self.label}: cannot truncate at offset {offset}: it is "
                                       f"inside the record at {index.bases[number - 1]}")
                cut = (last, index.positions[number] if number < len(index) else last.size)
            for segment in segments:
                segment.close()
            for segment in segments[len(keep):]:
                segment.delete()
            if cut is not None:
                last, position = cut
                fd = os.open(last.path, os.O_RDWR)
                try:
                    os.ftruncate(fd, position)
                    if self.fsync:
                        os.fsync(fd)
                finally:
                    os.close(fd)
                for sidecar in (last.summary_path, last.index_path):
                    sidecar.unlink(missing_ok=True)
            else:
                Segment.create(self.directory, offset, self.label, self.fsync)
            self._segments = self._open_segments()
            self._end_offset = self._segments[-1].next_offset
            self._writers = {}
            for segment in self._segments:
                newest = segment.max_timestamp_ms or 0
                self._writers.update({w: (seq, newest) for w, seq in segment.writers.items()})
            self._epochs.truncate_from(self._end_offset)
            self._cuts.append(self._end_offset)
            self._group.reset(self._end_offset)
            if self._hw is not None and self._hw > self._end_offset:
                self._hw = self._end_offset
            self._appended.notify_all()
            return self._end_offset

    @property
    def truncations(self) -> int:
        """How many times :meth:`truncate_to` cut this log: a position for :meth:`cut_below`."""
        with self._lock:
            return len(self._cuts)

    def cut_below(self, offset: int, since: int) -> bool:
        """Whether a truncation after the first ``since`` ones cut the log below ``offset``.

        A leader that is deposed while it waits for a write (or a read) to be committed becomes a
        follower, cuts its uncommitted tail and fetches the new leader's records into the same
        offsets: the high watermark then passes the write's offsets although the write is gone.
        Waiters check this after the high watermark covered them (never acknowledge what was cut)."""
        with self._lock:
            return any(cut < offset for cut in self._cuts[since:])

    # -- time, retention, writers ------------------------------------------------------------

    def offset_for_timestamp(self, timestamp_ms: int) -> int:
        """The first offset of the first record whose timestamp is >= ``timestamp_ms``;
        :attr:`end_offset` if there is none. A binary search over segments' max timestamps, then
        over the segment's time index (running maximum, so monotonic): no header is read."""
        earlier = None if self.remote is None else self.remote.offset_for_timestamp(
            timestamp_ms, self.local_start_offset)
        if earlier is not None:
            return earlier
        with self._lock:
            segments, end = self._segments, self.high_watermark
        for segment in segments:
            if segment.max_timestamp_ms is None or segment.max_timestamp_ms < timestamp_ms:
                continue
            index = segment.view()
            number = index.record_for_timestamp(timestamp_ms)
            if number < len(index):
                return min(index.bases[number], end)
        return end

    def enforce_retention(self, now_ms: int | None = None, floor: int | None = None) -> int:
        """Delete the oldest closed segments whose newest record is older than ``ttl_ms``.

        Only a contiguous run from the start is deleted (no holes), never the active segment, and
        never a segment holding an offset at or above ``floor``: the lake's tiered offset of a
        datalake-enabled table (untiered records stay), a primary-key table's oldest retained KV
        snapshot (the log above it is what the KV is rebuilt from), or the lower of both.
        Returns the new :attr:`start_offset`.
        """
        if self.ttl_ms is None:
            return self.start_offset
        now = int(time.time() * 1000) if now_ms is None else int(now_ms)
        with self._lock:
            keep = 0
            while keep < len(self._segments) - 1:
                segment = self._segments[keep]
                newest = segment.max_timestamp_ms
                if newest is not None and newest >= now - self.ttl_ms:
                    break
                if floor is not None and segment.next_offset > floor:
                    break
                keep += 1
            expired, self._segments = self._segments[:keep], self._segments[keep:]
            for segment in expired:
                segment.delete()
            return self._segments[0].base_offset

    def writer_state(self) -> dict[str, int]:
        """The last sequence appended per writer id (rebuilt from the segments' summaries on open)."""
        with self._lock:
            return {writer: sequence for writer, (sequence, _) in self._writers.items()}

    def writer_activity(self) -> dict[str, tuple[int, int]]:
        """``{writer: (last sequence, ms of its last record)}``; after a reopen the time is that of
        the newest record of the writer's last segment (never earlier than the truth)."""
        with self._lock:
            return dict(self._writers)

    def forget_writers(self, writer_ids: Sequence[str]) -> None:
        """Drop expired writers' state. Their records stay; a reopen rebuilds the state from them
        and the table expires it again (the records' timestamps are as old as before)."""
        with self._lock:
            for writer in writer_ids:
                self._writers.pop(writer, None)

    # -- remote storage (flightstore.remote) -------------------------------------------------

    def attach_remote(self, tier) -> None:
        """Read offsets below the local segments from ``tier`` (a bucket of remote storage, see
        :mod:`flightstore.remote.bucket`) from now on, and take the writer state of the uploaded
        segments that are no longer local (a writer's newest local state wins)."""
        activity = tier.writer_activity(self.local_start_offset)
        with self._lock:
            self.remote = tier
            for writer, state in activity.items():
                self._writers.setdefault(writer, state)

    def sealed_segments(self) -> list[Segment]:
        """The closed local segments, oldest first (immutable: what remote storage uploads)."""
        with self._lock:
            return self._segments[:-1]

    def release_local(self, upto: int) -> int:
        """Delete the oldest closed local segments whose offsets are all below ``upto`` (the
        caller holds them elsewhere: uploaded to remote storage); never the active one. A reader
        already reading one keeps it: its files go when the last reader lets go of it. Returns the
        number of segments released."""
        with self._lock:
            keep = 0
            while keep < len(self._segments) - 1 and self._segments[keep].next_offset <= upto:
                keep += 1
            released, self._segments = self._segments[:keep], self._segments[keep:]
        for segment in released:
            segment.release()
        return len(released)

    # -- waiting and closing -----------------------------------------------------------------

    def wait_for(self, offset: int, timeout: float | None) -> bool:
        """Block until :attr:`end_offset` > ``offset`` (or the tablet closes, or ``timeout``
        seconds pass); True when data at ``offset`` exists."""
        with self._appended:
            self._appended.wait_for(lambda: self.high_watermark > offset or self._closed, timeout)
            return self.high_watermark > offset

    def await_committed(self, end_offset: int, timeout: float | None = None) -> None:
        """Return once the high watermark reaches ``end_offset``; :class:`NotEnoughReplicas`
        after ``timeout`` seconds (default :attr:`commit_timeout_s`)."""
        if end_offset <= 0 or self.high_watermark >= end_offset:
            return
        timeout = self.commit_timeout_s if timeout is None else timeout
        if not self.wait_for(end_offset - 1, timeout):
            raise NotEnoughReplicas(f"{self.label}: the in-sync replicas did not confirm offsets up to "
                                    f"{end_offset} within {timeout:g} s (the leader cannot answer with "
                                    "changes that a failover could lose)")

    def wait_appended(self, offset: int, timeout: float | None) -> bool:
        """Block until :attr:`end_offset` > ``offset`` (committed or not), the tablet closes, or
        ``timeout`` seconds pass (a leader's replication stream waits here for new records)."""
        with self._appended:
            self._appended.wait_for(lambda: self._end_offset > offset or self._closed, timeout)
            return self._end_offset > offset

    def close(self) -> None:
        """Close every file and wake waiters. Idempotent. The active segment gets a checkpoint
        summary (after an fsync), so the next open does not verify what it already holds."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for segment in self._segments[:-1]:
                segment.close()
            try:
                self._segments[-1].checkpoint(self.fsync)
            except OSError as exc:  # the next open verifies the whole active segment instead
                log.warning("%s: no checkpoint written at close: %s", self.label, exc)
            finally:
                self._segments[-1].close()
                self._appended.notify_all()
        if self.fsync:
            self._group.advance(self._end_offset)

    def _check_open(self) -> None:
        if self._closed:
            raise FlightstoreError(f"log tablet {self.directory} is closed")

    def __enter__(self) -> LogTablet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"LogTablet({str(self.directory)!r}, offsets=[{self.start_offset}, "
                f"{self.end_offset}), segments={len(self._segments)})")


def _filter_rows(batch: pa.RecordBatch, offsets: pa.Array,
                 expression) -> tuple[pa.RecordBatch, pa.Array]:
    """Rows of ``batch`` (and their offsets) where ``expression`` is true."""
    column = "__offset"
    while column in batch.schema.names:
        column = "_" + column
    filtered = batch.append_column(column, offsets).filter(expression)
    return filtered.drop_columns([column]), filtered.column(column)
