"""A table's changelog: per-bucket offsets, reads of a bucket's changes from an offset, and
subscriptions that follow every bucket as it grows (start positions resolved to offsets).
"""

from __future__ import annotations

import time
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import pyarrow as pa

from flightstore import changetype
from flightstore.errors import DataLoss, InvalidInput
from flightstore.expressions import Predicate
from flightstore.log import LogBatch
from flightstore.log.held import read_held, require_held

__all__ = ["TableChangelog"]


class TableChangelog:
    """The changelog reads and subscriptions of :class:`~flightstore.store.Table` (mixed into it: ``self`` is the
    table, with its descriptor, logs, KV tablets, writers and locks)."""

    # ---- changelog ----------------------------------------------------------------------------
    def end_offsets(self) -> dict[int, int]:
        """Per bucket, the offset after the last committed record (the high watermark)."""
        return {bucket: log.high_watermark for bucket, log in enumerate(self.logs)}

    def start_offsets(self) -> dict[int, int]:
        return {bucket: log.start_offset for bucket, log in enumerate(self.logs)}

    def offsets_for_timestamp(self, timestamp_ms: int) -> dict[int, int]:
        return {b: log.offset_for_timestamp(timestamp_ms) for b, log in enumerate(self.logs)}

    def changelog_batch(self, record: LogBatch, columns: Sequence[str] | None = None) -> pa.RecordBatch:
        """A log record as ``t$changelog`` rows: columns + _change_type, _log_offset, _commit_timestamp."""
        batch = record.batch
        n = batch.num_rows
        if self.has_primary_key:
            kinds = changetype.to_strings(batch.column(changetype.CHANGE_TYPE_COLUMN))
        else:
            kinds = pa.array(np.full(n, "+A", dtype=object), pa.string())
        out_schema = changetype.changelog_schema(self.schema)
        wanted = list(columns) if columns is not None else out_schema.names
        values = {
            changetype.CHANGE_TYPE_COLUMN: kinds,
            changetype.LOG_OFFSET_COLUMN: record.row_offsets,
            changetype.COMMIT_TIMESTAMP_COLUMN: pa.array(np.full(n, record.timestamp_ms, dtype=np.int64),
                                                         pa.int64()).cast(pa.timestamp("ms", tz="UTC")),
        }
        arrays = [values[name] if name in values else batch.column(name) for name in wanted]
        return pa.RecordBatch.from_arrays(arrays, schema=pa.schema([out_schema.field(n) for n in wanted]))

    def _stored_columns(self, columns: Sequence[str] | None) -> list[str] | None:
        """The log columns to read for changelog ``columns`` (meta columns are derived)."""
        if columns is None:
            return None
        stored = [c for c in columns if c not in changetype.META_COLUMNS]
        self._check_columns(stored)
        if self.has_primary_key:
            stored.append(changetype.CHANGE_TYPE_COLUMN)
        return stored

    def read_changelog(self, bucket: int, from_offset: int | None = None, *,
                       columns: Sequence[str] | None = None, to_offset: int | None = None,
                       max_rows: int | None = None) -> Iterator[pa.RecordBatch]:
        """``t$changelog`` rows of one bucket from ``from_offset`` (exclusive of ``to_offset``);
        without ``from_offset``, from the earliest offset still held. An explicit offset that
        retention deleted raises OffsetOutOfRange naming the earliest one held."""
        stored = self._stored_columns(columns)
        log = self.logs[bucket]
        records = log.read(log.start_offset, columns=stored, to_offset=to_offset, max_rows=max_rows) \
            if from_offset is None else read_held(log, int(from_offset), self._where(bucket),
                                                  columns=stored, to_offset=to_offset, max_rows=max_rows)
        for record in records:
            yield self.changelog_batch(record, columns)

    def read_log(self, bucket: int, from_offset: int, columns: Sequence[str], *,
                 filter: Predicate | None = None, limit: int | None = None,
                 exact: bool = True) -> Iterator[pa.RecordBatch]:
        """See :meth:`flightstore.table.api.TableApi.read_log` (``limit`` stops after the record
        that reaches it: the caller cuts the rest)."""
        tablets = self.tablets().get(int(bucket))
        if tablets is None:
            return iter(())  # its partition was dropped (or not created yet)
        log = tablets[0]
        if int(from_offset) < log.start_offset:
            raise DataLoss(f"table {self.path} bucket {bucket}: log records from offset {from_offset} "
                           "were deleted; plan the read again")
        return (record.batch for record in log.read(int(from_offset), columns=list(columns), filter=filter,
                                                    max_rows=limit, exact=exact))

    def _where(self, bucket: int) -> str:
        return f"table {self.path} bucket {bucket}"

    def _notify(self) -> None:
        with self._written:
            self._written.notify_all()

    def resolve_start(self, start: Any) -> dict[int, int]:
        """Per-bucket offsets of a start position: ``earliest``, ``latest``, a timestamp in ms
        (``{"timestamp": ms}`` or an int) or explicit ``{bucket: offset}`` (buckets left out start
        at their earliest offset; an offset retention deleted raises OffsetOutOfRange)."""
        if start in (None, "earliest"):
            return self.start_offsets()
        if start == "latest":
            return self.end_offsets()
        if isinstance(start, int):
            return self.offsets_for_timestamp(start)
        if isinstance(start, Mapping):
            if "timestamp" in start:
                return self.offsets_for_timestamp(int(start["timestamp"]))
            offsets = self.start_offsets()
            for bucket, offset in start.items():
                if int(bucket) not in offsets:
                    raise InvalidInput(f"table {self.path} has no bucket {bucket}")
                require_held(self.logs[int(bucket)], int(offset), self._where(int(bucket)))
                offsets[int(bucket)] = int(offset)
            return offsets
        raise InvalidInput(f"unknown start position {start!r}: use earliest, latest, a timestamp or "
                           "per-bucket offsets")

    def subscribe(self, start: Any = "earliest", *, columns: Sequence[str] | None = None,
                  stop: Any = None, heartbeat_s: float | None = 1.0,
                  until: Mapping | None = None, buckets: Sequence[int] | None = None) -> Iterator[pa.RecordBatch]:
        """Changelog batches from ``start`` as they are written, bucket by bucket in offset order.

        Runs until ``stop.is_set()`` (any object with ``is_set``) or, when ``until`` gives per-bucket
        end offsets, until every bucket reached them. Yields an empty batch as a heartbeat after
        ``heartbeat_s`` without data, so a server notices clients that went away. A subscriber
        that falls behind the log start (retention deleted rows it had not read) gets
        OffsetOutOfRange, never a silent gap. ``buckets``: follow only those (a cluster server
        follows the buckets it leads; ``start`` offsets may name only them).
        """
        wanted = set(range(self.num_buckets)) if buckets is None else {int(b) for b in buckets}
        if isinstance(start, Mapping) and "timestamp" not in start and buckets is not None:
            offsets = {int(b): int(o) for b, o in start.items() if int(b) in wanted}
            for bucket in wanted - set(offsets):
                offsets[bucket] = self.logs[bucket].start_offset
            for bucket, offset in offsets.items():
                require_held(self.logs[bucket], offset, self._where(bucket))
        else:
            offsets = {b: o for b, o in self.resolve_start(start).items() if b in wanted}
        ends = None if until is None else {int(b): int(o) for b, o in until.items()}
        out_schema = changetype.changelog_schema(self.schema)
        columns = list(columns or out_schema.names)  # kept for the stream's life, whatever ALTER does
        stored = self._stored_columns(columns)
        heartbeat = pa.RecordBatch.from_pylist(
            [], schema=pa.schema([out_schema.field(c) for c in columns]))
        idle_since = time.monotonic()
        while stop is None or not stop.is_set():
            with self._written:
                before = self.end_offsets()
            progressed = False
            for bucket, log in enumerate(self.logs):
                if bucket not in offsets:
                    continue
                limit = None if ends is None else ends.get(bucket, offsets[bucket])
                if limit is not None and offsets[bucket] >= limit:
                    continue
                for record in read_held(log, offsets[bucket], self._where(bucket), columns=stored,
                                        to_offset=limit):
                    offsets[bucket] = record.next_offset if limit is None else min(record.next_offset, limit)
                    progressed = True
                    yield self.changelog_batch(record, columns)
            if ends is not None and all(offsets.get(b, o) >= o for b, o in ends.items()):
                return
            if progressed:
                idle_since = time.monotonic()
                continue
            with self._written:
                if self.end_offsets() == before:
                    self._written.wait(0.1)
            if heartbeat_s is not None and time.monotonic() - idle_since >= heartbeat_s:
                idle_since = time.monotonic()
                yield heartbeat
