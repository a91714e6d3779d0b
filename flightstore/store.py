"""The embedded storage API: a data directory of databases and tables, no server needed.

``Store`` owns the catalog and opens tables lazily; a ``Table`` splits writes by bucket and routes
them to the bucket's log (log tables) or KV tablet (primary-key tables). Every write is validated in
full before any bucket is touched, so bad input changes nothing. Writes may carry a writer id and a
batch sequence: a retried batch is applied once, a gap in the sequence is refused.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import itertools
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flightstore import changetype
from flightstore.alter import AddPartition, Change, DropPartition, PartitionLimits, apply_changes
from flightstore.autopartition import auto_partition
from flightstore.autopartition import plan as plan_auto_partitions
from flightstore.batches import limited_sources
from flightstore.bucketing import bucket_ids
from flightstore.catalog import DEFAULT_DATABASE, Catalog
from flightstore.config import SERVER_OPTIONS, server_option
from flightstore.errors import (
    Cancelled,
    DataDirectoryInUse,
    DataLoss,
    FlightstoreError,
    InvalidInput,
    PartitionNotFound,
    SchemaMismatch,
    Unsupported,
)
from flightstore.expressions import Predicate
from flightstore.intents import IntentLog
from flightstore.kv import ranges
from flightstore.kv.encoding import encode_keys
from flightstore.kv.ownership import ColumnOwnership
from flightstore.kv.ranges import KeyRange
from flightstore.kv.snapshot import SnapshotInfo
from flightstore.kv.tablet import KvTablet, changelog_schema
from flightstore.log import LogBatch, LogTablet
from flightstore.log.held import read_held, require_held
from flightstore.schema import Projections, TableDescriptor, TablePath, as_table, storage_type
from flightstore.upkeep import TableUpkeep
from flightstore.writers import WriterRegistry, system_clock_ms

__all__ = ["Store", "Table", "WriteResult", "new_table_descriptor"]

TABLE_WRITER = "__table__"  # writer id of multi-bucket writes whose caller gave none
_logger = logging.getLogger("flightstore.store")


def _decoded(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """``column`` without run-end or dictionary encoding, values in their storage type: pyarrow's
    cast decodes neither runs nor dictionaries of view types (``array_take`` has no view kernel)."""
    kind = column.type
    if pa.types.is_run_end_encoded(kind):
        return _decoded(pa.chunked_array([pc.run_end_decode(c) for c in column.chunks], kind.value_type))
    if pa.types.is_dictionary(kind):
        values = storage_type(kind.value_type)
        chunks = [pa.DictionaryArray.from_arrays(c.indices, pc.cast(c.dictionary, values)).dictionary_decode()
                  for c in column.chunks]
        return pa.chunked_array(chunks, values)
    return column


def _widens(source: pa.DataType, target: pa.DataType) -> bool:
    """Whether writing ``source`` values into a ``target`` column is lossless by kind.

    Integers widen into wider integers, floats and decimals; floats into floats; strings, binaries,
    dates, times, timestamps and decimals into their own kind. Values are still range-checked by
    the (safe) cast. Nulls fit anything.
    """
    t = pa.types
    if t.is_null(source) or source == target:
        return True
    if t.is_dictionary(source) or t.is_run_end_encoded(source):
        return _widens(source.value_type, target)
    if t.is_nested(source):  # lists, structs, maps: the same shape in another layout
        return storage_type(source) == storage_type(target)
    kinds = (
        (t.is_integer, lambda x: t.is_integer(x) or t.is_floating(x) or t.is_decimal(x)),
        (t.is_floating, t.is_floating),
        (t.is_decimal, lambda x: t.is_decimal(x) or t.is_floating(x)),
        (lambda x: t.is_string(x) or t.is_large_string(x) or t.is_string_view(x),
         lambda x: t.is_string(x) or t.is_large_string(x)),
        (lambda x: t.is_binary(x) or t.is_large_binary(x) or t.is_fixed_size_binary(x)
         or t.is_binary_view(x),
         lambda x: t.is_binary(x) or t.is_large_binary(x)),
        (t.is_boolean, t.is_boolean),
        (t.is_date, t.is_date),
        (t.is_time, t.is_time),
        (t.is_timestamp, t.is_timestamp),
        (t.is_duration, t.is_duration),
    )
    return any(is_source(source) and fits(target) for is_source, fits in kinds)


class WriteResult(dict):
    """Per-bucket outcome of a write: ``{bucket: base_offset or None}``, plus ``duplicate`` flag
    and the buckets the write went to (``touched``: they are synced before it is acknowledged)."""

    duplicate: bool = False
    touched: Sequence[int] = ()




class Table:
    """A handle on one table: writes, lookups, scans and changelog reads."""

    def __init__(self, descriptor: TableDescriptor, directory: Path, *, fsync: bool = True,
                 clock: Callable[[], int] = system_clock_ms) -> None:
        """Open the table's buckets; ``clock`` (milliseconds) times writes for writer expiry."""
        self.descriptor = descriptor
        self.path = descriptor.path
        self.schema = descriptor.schema
        self.directory = directory
        self._lock = threading.RLock()
        self._projections = Projections(self.schema)
        self._written = threading.Condition()
        self._round_robin = itertools.count()
        # The buckets a batch without bucket key may go to (None: all); in a cluster, those this
        # server leads (flightstore.cluster.routing).
        self.round_robin_buckets: Sequence[int] | None = None
        log_schemas = _log_schemas(descriptor)
        self.logs: list[LogTablet] = []
        self.kvs: list[KvTablet] = []
        ttl = descriptor.option("table.log.ttl")
        for bucket in range(descriptor.num_buckets):
            log = LogTablet(
                directory / f"bucket-{bucket}" / "log", log_schemas[descriptor.version],
                compression=descriptor.option("table.log.arrow.compression.type"),
                segment_bytes=descriptor.option("table.log.segment.bytes"),
                statistics_columns=descriptor.statistics_columns, ttl_ms=ttl, fsync=fsync,
                schema_version=descriptor.version, past_schemas=log_schemas,
                label=f"table {self.path} bucket {bucket}")
            self.logs.append(log)
            if descriptor.has_primary_key:
                self.kvs.append(KvTablet(directory / f"bucket-{bucket}" / "kv", descriptor, log,
                                         fsync=fsync, bucket=bucket))
        self.upkeep = TableUpkeep(directory, self.logs, self.kvs, descriptor.option("kv.snapshot.interval"))
        # Per-bucket offsets below which the lake holds the log's records (set by the lake's
        # tierer from its last committed snapshot); see enforce_retention.
        self.retention_floor: dict[int, int] | None = None
        self.ownership = ColumnOwnership()
        self._clock = clock
        self._writers = WriterRegistry(str(self.path), descriptor.option("table.writer-id.expiration"),
                                       clock)
        self._writers.load(state.writer_activity() for state in (self.kvs or self.logs))
        self._intents = IntentLog(directory / "intent", fsync=fsync)
        self._complete_pending_write()  # with every writer's state: its buckets skip what they have
        self._forget_stale_log_writers()
        self.expire_writers()

    @property
    def num_buckets(self) -> int:
        return self.descriptor.num_buckets

    def tablets(self) -> dict[int, tuple[LogTablet, KvTablet | None]]:
        """Every bucket's log and KV (None for a log table) by bucket number (table-wide for a
        partitioned table): for monitoring and maintenance."""
        return {b: (log, self.kvs[b] if self.kvs else None) for b, log in enumerate(self.logs)}

    def bucket_ids(self, partitions: Sequence[str] | None = None) -> list[int]:
        """The table's buckets, as changelog offsets, endpoints and ``scan(buckets=...)`` number
        them (a partitioned table numbers the buckets of every partition)."""
        return list(range(self.num_buckets))

    def evolve(self, descriptor: TableDescriptor) -> None:
        """Follow ALTER TABLE (same table, new schema version or options) without reopening:
        logs and KVs write the new version from now on, reads conform older data, and readers
        already running keep the columns they started with."""
        with self._lock:
            if descriptor.version != self.descriptor.version:
                log_schema = _log_schemas(descriptor)[descriptor.version]
                for log in self.logs:
                    log.evolve(log_schema, descriptor.version, descriptor.statistics_columns)
            for kv in self.kvs:
                kv.evolve(descriptor)
            for log in self.logs:
                log.ttl_ms = descriptor.option("table.log.ttl")
            self.descriptor, self.path, self.schema = descriptor, descriptor.path, descriptor.schema
            self._projections = Projections(self.schema)

    refresh = evolve

    @property
    def has_primary_key(self) -> bool:
        return self.descriptor.has_primary_key

    @property
    def merger(self) -> Any:
        """The merge engine writes are checked against (primary-key tables)."""
        return self.kvs[0].merger

    def close(self) -> None:
        for kv in self.kvs:
            kv.close()
        for log in self.logs:
            log.close()

    # ---- validation ---------------------------------------------------------------------------
    def conform(self, data: Any, columns: Sequence[str] | None = None) -> tuple[pa.Table, tuple | None]:
        """Cast ``data`` to the table schema (missing columns null); return it and the target columns.

        Raises SchemaMismatch for unknown columns, uncastable values, or missing non-null columns.
        """
        table = self._known_columns(as_table(data))
        names = self.schema.names
        target: tuple | None = None
        if columns is not None:
            target = tuple(columns)
            bad = [c for c in target if c not in names]
            if bad:
                raise SchemaMismatch(f"table {self.path} has no column(s) {', '.join(map(repr, bad))} "
                                     "named in the partial update")
            missing = [c for c in target if c not in table.column_names]
            if missing:
                raise SchemaMismatch(f"partial update of {self.path} names {missing} but the data "
                                     "lacks them")
            missing_pk = [c for c in self.descriptor.primary_key if c not in target]
            if missing_pk:
                raise SchemaMismatch(f"partial update of {self.path} must include the primary key "
                                     f"column(s) {missing_pk}")
            if set(target) == set(names):
                target = None
        arrays = []
        for field in self.schema:
            if field.name in table.column_names and (target is None or field.name in target):
                column = table.column(field.name)
                if column.type != field.type:
                    if not _widens(column.type, field.type):
                        raise SchemaMismatch(f"column {field.name!r} of {self.path} is {field.type}; "
                                             f"data of type {column.type} does not fit it")
                    try:
                        column = pc.cast(_decoded(column), field.type)
                    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
                        raise SchemaMismatch(f"column {field.name!r} of {self.path}: cannot convert "
                                             f"{column.type} to {field.type}: {exc}") from None
                if not field.nullable and column.null_count:
                    what = "primary key column" if field.name in self.descriptor.primary_key else "column"
                    raise InvalidInput(f"{what} {field.name!r} of {self.path} must not be null")
                arrays.append(column)
            else:
                if (not field.nullable and target is None) or field.name in self.descriptor.primary_key:
                    raise SchemaMismatch(f"data written to {self.path} lacks the non-null column "
                                         f"{field.name!r}")
                arrays.append(pa.nulls(table.num_rows, field.type))
        return pa.Table.from_arrays(arrays, schema=self.schema), target

    def _known_columns(self, table: pa.Table) -> pa.Table:
        names = self.schema.names
        unknown = [c for c in table.column_names if c not in names]
        if unknown:
            raise SchemaMismatch(f"table {self.path} has no column(s) {', '.join(map(repr, unknown))}; "
                                 f"columns are {', '.join(names)}")
        if len(set(table.column_names)) != table.num_columns:
            raise SchemaMismatch(f"duplicate columns in data written to {self.path}")
        return table

    def _check_sequence(self, writer_id: str | None, sequence: int | None) -> None:
        """Refuse a gap in the writer's sequence, or a batch of a writer that expired (its state
        is dropped here first if it expired since the last check)."""
        if writer_id is None or sequence is None:
            return
        if self._writers.is_expired(writer_id):
            self._expire([writer_id], self._clock())
        self._writers.check(writer_id, sequence)

    def _note_sequence(self, writer_id: str | None, sequence: int | None, now_ms: int) -> None:
        if writer_id is not None and sequence is not None:
            self._writers.note(writer_id, sequence, now_ms)

    def undo(self, writer_id: str, after_sequence: int) -> int:
        """Undo every batch ``writer_id`` wrote after ``after_sequence`` (exactly-once restarts of
        jobs), leaving other writers' work; returns rows restored. A writer without state here
        (it never wrote, or expired) has nothing to undo. See :mod:`flightstore.kv.undo`."""
        from flightstore.kv.undo import check_undoable, undo_writer
        if not self.has_primary_key:
            raise Unsupported(f"undo needs a primary-key table; {self.path} is a log table")
        check_undoable(self.kvs, writer_id)
        with self._lock:
            if writer_id not in self._writers:
                return 0
            restored = undo_writer(self.kvs, writer_id, after_sequence)
            self._writers.reset(writer_id, int(after_sequence))
        self._notify()
        return restored

    def writer_sequence(self, writer_id: str) -> int | None:
        """The last batch sequence applied for ``writer_id`` (None if it never wrote or expired)."""
        return self._writers.sequence(writer_id)

    def expire_writers(self, now_ms: int | None = None) -> list[str]:
        """Forget writers that wrote nothing for ``table.writer-id.expiration``: in memory, in each
        bucket's log writer state and KV meta (sequence, undo fence) and their column claims.
        Returns their ids."""
        now = self._clock() if now_ms is None else now_ms
        with self._lock:
            expired = self._writers.expired(now)
            if expired:
                self._expire(expired, now)
        return expired

    def _forget_stale_log_writers(self) -> None:
        """On open: a log rebuilds its writer state from every record header, expired writers
        included (a primary-key table's registry comes from the KV, which dropped them)."""
        now, expiration = self._clock(), self.descriptor.option("table.writer-id.expiration")
        for log in self.logs:
            log.forget_writers([writer for writer, (_, last_ms) in log.writer_activity().items()
                                if now - last_ms > expiration])

    def _expire(self, writer_ids: list[str], now_ms: int) -> None:
        with self._lock:
            for kv in self.kvs:
                kv.drop_writers(writer_ids)
            for log in self.logs:
                log.forget_writers(writer_ids)
            for writer in writer_ids:
                self.ownership.release(writer)
            self._writers.forget(writer_ids, now_ms)

    def buckets_of(self, data: pa.Table) -> np.ndarray:
        key = self.descriptor.bucket_key
        if key:
            return bucket_ids(data, key, self.num_buckets)
        choices = self.round_robin_buckets
        if choices:
            return np.full(data.num_rows, choices[next(self._round_robin) % len(choices)], dtype=np.int32)
        return np.full(data.num_rows, next(self._round_robin) % self.num_buckets, dtype=np.int32)

    # ---- writes -------------------------------------------------------------------------------
    def append(self, data: Any, *, writer_id: str | None = None, sequence: int | None = None) -> WriteResult:
        """Append rows to a log table (all columns; missing nullable columns are null)."""
        if self.has_primary_key:
            raise Unsupported(f"{self.path} is a primary-key table: use upsert/delete")
        table, _ = self.conform(data)
        return self._apply_buckets(table, None, None, writer_id, sequence)

    def upsert(self, data: Any, columns: Sequence[str] | None = None, *, writer_id: str | None = None,
               sequence: int | None = None) -> WriteResult:
        """Insert or update rows of a primary-key table; ``columns`` makes it a partial update."""
        table, target = self._conform_pk(data, columns)
        kinds = np.full(table.num_rows, changetype.UPDATE_AFTER, dtype=np.int8)
        return self.write(table, kinds, target, writer_id=writer_id, sequence=sequence, conformed=True)

    def delete(self, keys: Any, columns: Sequence[str] | None = None, *, writer_id: str | None = None,
               sequence: int | None = None) -> WriteResult:
        """Delete rows by primary key; with ``columns`` only those columns are nulled (partial delete)."""
        table, target = self._conform_pk(keys, columns, keys_only=columns is None)
        kinds = np.full(table.num_rows, changetype.DELETE, dtype=np.int8)
        return self.write(table, kinds, target, writer_id=writer_id, sequence=sequence, conformed=True)

    def _conform_pk(self, data: Any, columns: Sequence[str] | None,
                    keys_only: bool = False) -> tuple[pa.Table, tuple | None]:
        if not self.has_primary_key:
            raise Unsupported(f"{self.path} is a log table (append-only): use append")
        table = self._known_columns(as_table(data))
        if keys_only:
            missing = [c for c in self.descriptor.primary_key if c not in table.column_names]
            if missing:
                raise SchemaMismatch(f"delete from {self.path} needs the primary key column(s) {missing}")
            table = table.select(list(self.descriptor.primary_key))
            conformed, _ = self.conform(table, self.descriptor.primary_key)
            return conformed, None
        if columns is None and set(table.column_names) != set(self.schema.names):
            missing = [c for c in self.schema.names if c not in table.column_names]
            if any(set(table.column_names) == set(old.names) for old in self.descriptor.past_schemas):
                missing = []  # a whole row of an older schema version (a writer that did not refresh)
            if missing and not any(c in self.descriptor.primary_key for c in missing):
                raise SchemaMismatch(
                    f"data written to {self.path} lacks column(s) {missing}; pass columns=[...] for a "
                    "partial update")
        return self.conform(table, columns)

    def write(self, data: Any, kinds: np.ndarray | pa.Array | None = None,
              columns: Sequence[str] | None = None, *, writer_id: str | None = None,
              sequence: int | None = None, overwrite: bool = False, conformed: bool = False) -> WriteResult:
        """Write changelog rows (int8 change type per row) into a primary-key table.

        Validates everything first (schema, null keys, the merge engine's and delete behavior's
        rules), then applies bucket by bucket.
        """
        if not self.has_primary_key:
            return self.append(data, writer_id=writer_id, sequence=sequence)
        if conformed:
            table, target = data, (tuple(columns) if columns is not None else None)
        else:
            table, target = self.conform(data, columns)
        if kinds is None:
            kinds = np.full(table.num_rows, changetype.UPDATE_AFTER, dtype=np.int8)
        kinds = np.asarray(kinds.to_numpy(zero_copy_only=False) if isinstance(kinds, (pa.Array, pa.ChunkedArray))
                           else kinds, dtype=np.int8)
        if len(kinds) != table.num_rows:
            raise InvalidInput("one change type per row is required")
        if ((kinds < 0) | (kinds > changetype.APPEND_ONLY)).any():
            raise InvalidInput("unknown change type code in the write")
        if not overwrite:
            table, kinds = self._apply_delete_behavior(table, kinds)
            self.merger.check_write(kinds, target, table)
        if writer_id is not None and target is not None:
            # Writers of partial updates own their columns while they live (see kv/ownership.py).
            self.ownership.claim(writer_id, [c for c in target if c not in self.descriptor.primary_key])
        return self._apply_buckets(table, kinds, target, writer_id, sequence, overwrite)

    def apply_routed(self, table: pa.Table, kinds: np.ndarray | None, target: tuple | None,
                     writer_id: str | None, sequence: int | None, overwrite: bool = False) -> WriteResult:
        """Apply a write a partitioned table validated, sequenced and recorded as its own intent
        (see :mod:`flightstore.partitioned`): the buckets skip what they applied already, and
        this partition keeps no intent or sequence check of its own."""
        return self._apply_buckets(table, kinds, target, writer_id, sequence, overwrite, recovering=True)

    def _apply_buckets(self, table: pa.Table, kinds: np.ndarray | None, target: tuple | None,
                       writer_id: str | None, sequence: int | None, overwrite: bool = False,
                       recovering: bool = False) -> WriteResult:
        """Apply a validated write to its buckets (KV tablets, or logs when ``kinds`` is None).

        A write spanning several buckets is first recorded as an intent (see ``intents.py``), with
        a writer id and sequence (the table's own when the caller gave none), so that a crash
        between two buckets is completed on the next open instead of leaving it half applied.
        Returns once the write is durable (logs that fsync): the fsync happens after the table lock
        is released, so concurrent writers of the table share it (group commit).
        """
        with self._lock:
            result = self._apply_locked(table, kinds, target, writer_id, sequence, overwrite, recovering)
            written = {int(b): self.logs[b].end_offset for b in result.touched}
        for bucket, end in written.items():  # outside the lock: concurrent writers share fsyncs
            self.logs[bucket].sync(end)
        self._notify()
        return result

    def _apply_locked(self, table: pa.Table, kinds: np.ndarray | None, target: tuple | None,
                      writer_id: str | None, sequence: int | None, overwrite: bool,
                      recovering: bool) -> WriteResult:
        """The write itself, under the table lock; its logs are synced by the caller, except a
        multi-bucket write's, which must be on disk before its intent is cleared."""
        if not recovering:  # a rolled-forward write was checked when it was first sent
            self._check_sequence(writer_id, sequence)
        now = self._clock()
        result = WriteResult()
        last = self._writers.sequence(writer_id) if writer_id is not None else None
        if kinds is None and not self.descriptor.bucket_key and sequence is not None \
                and last is not None and sequence <= last:
            # Without a bucket key a whole batch lands in one (round-robin) bucket and a retry
            # may be routed to another one: the table-level sequence decides.
            result.duplicate = True
            result.touched = list(range(self.num_buckets))  # acknowledged once durable
            return result
        buckets = self.buckets_of(table)
        targets = np.unique(buckets)
        result.touched = [int(b) for b in targets]
        intent = len(targets) > 1 and not recovering
        if intent:
            if writer_id is None or sequence is None:
                writer_id = TABLE_WRITER
                last_table = self._writers.sequence(TABLE_WRITER)
                sequence = 0 if last_table is None else last_table + 1
            record = table if kinds is None else table.append_column(
                changetype.CHANGE_TYPE_COLUMN, pa.array(kinds, pa.int8()))
            self._intents.begin({"target": list(target) if target else None, "overwrite": overwrite,
                                 "kv": kinds is not None, "writer_id": writer_id,
                                 "sequence": sequence}, record)
        for bucket in targets:
            mask = buckets == bucket
            part = table.filter(pa.array(mask))
            if kinds is None:
                last = self.logs[bucket].writer_state().get(writer_id) if writer_id else None
                if sequence is not None and last is not None and sequence <= last:
                    result.duplicate = True
                    continue
                result[int(bucket)] = self.logs[bucket].append(part, writer_id=writer_id,
                                                               sequence=sequence, durable=False,
                                                               timestamp_ms=now)
            else:
                outcome = self.kvs[bucket].apply(part, kinds[mask], target, writer_id=writer_id,
                                                 sequence=sequence, overwrite=overwrite,
                                                 durable=False, now_ms=now)
                result.duplicate |= outcome.duplicate
                result[int(bucket)] = outcome.base_offset
        if intent:
            for bucket in targets:  # the intent may go only once every bucket has the write
                self.logs[bucket].sync()
            self._intents.complete()
        self._note_sequence(writer_id, sequence, now)
        return result

    def _complete_pending_write(self) -> None:
        """Roll forward a multi-bucket write a crash interrupted (buckets that have it skip it)."""
        pending = self._intents.pending()
        if pending is not None:
            meta, record = pending
            kinds = None
            if meta["kv"]:
                kinds = record.column(changetype.CHANGE_TYPE_COLUMN).to_numpy(zero_copy_only=False)
                record = record.drop_columns([changetype.CHANGE_TYPE_COLUMN])
            target = tuple(meta["target"]) if meta["target"] else None
            self._apply_buckets(record, kinds, target, meta["writer_id"], meta["sequence"],
                                meta["overwrite"], recovering=True)
        self._intents.complete()

    def _apply_delete_behavior(self, table: pa.Table, kinds: np.ndarray) -> tuple[pa.Table, np.ndarray]:
        retracting = (kinds == changetype.DELETE) | (kinds == changetype.UPDATE_BEFORE)
        if not retracting.any():
            return table, kinds
        behavior = self.delete_behavior
        engine = self.descriptor.merge_engine
        if behavior == "disable":
            raise InvalidInput(f"table {self.path} disables deletes ('table.delete.behavior' = 'disable')")
        if behavior == "ignore" or (engine in ("first_row", "versioned")):
            keep = ~retracting
            return table.filter(pa.array(keep)), kinds[keep]
        if engine != "aggregation":
            keep = kinds != changetype.UPDATE_BEFORE  # a -U is followed by its +U
            return table.filter(pa.array(keep)), kinds[keep]
        return table, kinds

    @property
    def delete_behavior(self) -> str:
        if "table.delete.behavior" in self.descriptor.options:
            return self.descriptor.option("table.delete.behavior")
        return "ignore" if self.descriptor.merge_engine in ("first_row", "versioned") else "allow"

    # ---- reads --------------------------------------------------------------------------------
    def _pk_table(self, keys: Any, columns: Sequence[str]) -> pa.Table:
        table = as_table(keys)
        missing = [c for c in columns if c not in table.column_names]
        if missing:
            raise InvalidInput(f"lookup in {self.path} needs column(s) {missing}")
        arrays, cast = [], False
        for name in columns:
            field = self.schema.field(name)
            column = table.column(name)
            if column.null_count:
                raise InvalidInput(f"lookup key column {name!r} must not be null")
            if column.type == field.type:
                arrays.append(column)
                continue
            try:
                arrays.append(pc.cast(column, field.type))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
                raise SchemaMismatch(f"key column {name!r}: cannot convert {column.type} to "
                                     f"{field.type}: {exc}") from None
            cast = True
        if not cast and table.num_columns == len(columns) and table.column_names == list(columns):
            return table  # already the key columns, typed as stored (a planned lookup's keys)
        return pa.Table.from_arrays(arrays, names=list(columns))

    def projection(self, columns: Sequence[str]) -> pa.Schema:
        """The schema of ``columns`` of this table (memoized: lookups ask for the same few)."""
        return self._projections.of(columns)

    def _check_columns(self, columns: Sequence[str] | None) -> list[str]:
        if columns is None:
            return self.schema.names
        known = self._projections.names
        bad = [c for c in columns if c not in known]
        if bad:
            raise InvalidInput(f"table {self.path} has no column(s) {bad}")
        return list(columns)

    def lookup(self, keys: Any, columns: Sequence[str] | None = None) -> pa.Table:
        """Rows with the given primary keys (multi-get per bucket), in key order of ``keys``."""
        self._require_pk("lookup")
        columns = self._check_columns(columns)
        keys = self._pk_table(keys, self.descriptor.primary_key)
        out_schema = self._projections.of(columns)
        if keys.num_rows == 0:
            return out_schema.empty_table()
        buckets = self.buckets_of(keys)
        if keys.num_rows == 1 or (buckets == buckets[0]).all():  # one bucket: no reordering
            rows = self.kvs[buckets[0]].lookup(keys, columns)[1]
            return rows.replace_schema_metadata() if rows.schema.equals(out_schema) else rows.cast(out_schema)
        parts, positions = [], []
        for bucket in np.unique(buckets):
            mask = buckets == bucket
            found, rows = self.kvs[bucket].lookup(keys.filter(pa.array(mask)), columns)
            parts.append(rows)
            positions.append(np.flatnonzero(mask)[found])
        result = pa.concat_tables(parts)
        order = np.argsort(np.concatenate(positions), kind="stable")
        return result.take(pa.array(order)).cast(out_schema)

    def prefix_lookup(self, prefix: Any, columns: Sequence[str] | None = None,
                      limit: int | None = None) -> pa.Table:
        """Rows whose leading primary-key columns (at least the bucket key) equal ``prefix`` rows."""
        self._require_pk("prefix lookup")
        columns = self._check_columns(columns)
        table = as_table(prefix)
        key = self.descriptor.primary_key
        width = len(table.column_names)
        if tuple(table.column_names) != key[:width] or width < len(self.descriptor.bucket_key):
            raise InvalidInput(f"a prefix lookup on {self.path} needs the leading primary key columns "
                               f"{list(key[:max(width, len(self.descriptor.bucket_key))])} (bucket key "
                               f"{list(self.descriptor.bucket_key)}), got {table.column_names}")
        table = self._pk_table(table, key[:width])
        out_schema = self._projections.of(columns)
        buckets = self.buckets_of(table)
        prefixes = encode_keys(table, key[:width])
        parts = []
        for bucket, prefix_key in zip(buckets, prefixes):
            remaining = None if limit is None else limit - sum(p.num_rows for p in parts)
            if remaining is not None and remaining <= 0:
                break
            parts.append(self.kvs[bucket].prefix_lookup([prefix_key], columns, remaining))
        return pa.concat_tables(parts).cast(out_schema) if parts else out_schema.empty_table()

    def scan(self, columns: Sequence[str] | None = None, filter: Predicate | None = None,
             limit: int | None = None, buckets: Sequence[int] | None = None,
             key_range: KeyRange | None = None, *, exact: bool = True) -> Iterator[pa.RecordBatch]:
        """Current rows, only ``columns``, filtered exactly (batches skipped by statistics).

        On a primary-key table the filter's primary-key range (``key_range``, derived from the
        filter when not given; :mod:`flightstore.kv.ranges`) is one RocksDB seek range per bucket,
        and equalities on the whole bucket key read only their bucket. Without a range a bucket is
        read from its newest KV snapshot image plus the changelog after it, consistent at the log
        end offset when the bucket is reached (RocksDB without an image).

        ``exact=False`` lets rows through unfiltered in batches the statistics could not rule out,
        in no particular order: for callers that apply ``filter`` again themselves (residual SQL).
        A primary-key bucket without a usable image is then read from its changelog when the log
        still holds it from offset 0 (see :meth:`KvTablet.full_scan`)."""
        columns = self._check_columns(columns)
        if filter is not None:
            filter = filter.bind(self.schema)
        if self.has_primary_key and filter is not None:
            if key_range is None:
                key_range = ranges.key_range(filter, self.descriptor)
            pinned = ranges.pinned_bucket(filter, self.descriptor)
            if pinned is not None:
                buckets = [b for b in (range(self.num_buckets) if buckets is None else buckets)
                           if b == pinned]

        def open_bucket(bucket: int, remaining: int | None) -> Iterator[pa.RecordBatch]:
            if self.has_primary_key:
                kv = self.kvs[bucket]
                return kv.full_scan(columns, filter, remaining, exact=exact) if key_range is None else \
                    kv.scan(columns, filter, remaining, key_range)
            return (lb.batch for lb in self.logs[bucket].read(0, columns=columns, filter=filter, exact=exact))

        yield from limited_sources((functools.partial(open_bucket, bucket)
                                    for bucket in (range(self.num_buckets) if buckets is None else buckets)), limit)

    def scan_table(self, columns: Sequence[str] | None = None, filter: Predicate | None = None,
                   limit: int | None = None, *, exact: bool = True) -> pa.Table:
        columns = self._check_columns(columns)
        schema = pa.schema([self.schema.field(c) for c in columns])
        return pa.Table.from_batches(list(self.scan(columns, filter, limit, exact=exact)), schema=schema)

    def row_count(self) -> int:
        """Rows in the table without a scan: maintained KV counts, or log offsets."""
        if self.has_primary_key:
            return sum(kv.row_count for kv in self.kvs)
        for log in self.logs:
            lost = log.damage()
            if lost:
                raise DataLoss(f"{log.label}: log offsets {lost[0][0]}..{lost[0][1] - 1} are lost; "
                               "the count would be wrong. Run `flightstore repair` to declare it")
        return sum(log.end_offset - log.start_offset - log.lost_rows for log in self.logs)

    def rows_at(self, bucket: int, at: int, columns: Sequence[str] | None = None,
                limit: int | None = None) -> Iterator[pa.RecordBatch]:
        """The rows of ``bucket`` exactly at log offset ``at`` (a KV snapshot image plus the
        changelog up to ``at``): what a reader that then follows the changelog from ``at`` needs.
        Raises OffsetOutOfRange when ``at`` is outside the held log."""
        self._require_pk("a snapshot read")
        self._check_bucket(bucket)
        return self.kvs[bucket].rows_at(int(at), self._check_columns(columns), None, limit)

    def read_snapshot(self, bucket: int, at: int, columns: Sequence[str] | None = None
                      ) -> Iterator[pa.RecordBatch]:
        """:meth:`rows_at` as changelog rows (``columns`` of :func:`changetype.snapshot_schema`):
        ``_change_type`` is ``+I``, ``_log_offset`` and ``_commit_timestamp`` are null. A reader
        that then follows the changelog from ``at`` sees every change once."""
        out_schema = changetype.snapshot_schema(self.schema)
        wanted = list(columns) if columns is not None else out_schema.names
        schema = pa.schema([out_schema.field(c) for c in wanted])
        stored = [c for c in wanted if c not in changetype.META_COLUMNS]
        for batch in self.rows_at(bucket, at, stored):
            n = batch.num_rows
            meta = {changetype.CHANGE_TYPE_COLUMN: pa.repeat(pa.scalar("+I", pa.string()), n),
                    changetype.LOG_OFFSET_COLUMN: pa.nulls(n, pa.int64()),
                    changetype.COMMIT_TIMESTAMP_COLUMN: pa.nulls(n, out_schema.field(
                        changetype.COMMIT_TIMESTAMP_COLUMN).type)}
            yield pa.RecordBatch.from_arrays([meta[c] if c in meta else batch.column(c) for c in wanted],
                                             schema=schema)

    def _check_bucket(self, bucket: int) -> None:
        if not 0 <= int(bucket) < self.num_buckets:
            raise InvalidInput(f"table {self.path} has no bucket {bucket}")

    def enforce_retention(self, now_ms: int | None = None) -> int:
        """Delete log segments older than ``table.log.ttl``; returns rows dropped.

        A primary-key table keeps its log above its oldest retained KV snapshot (see
        :mod:`flightstore.upkeep`). On a datalake-enabled table only records below
        :attr:`retention_floor` (tiered) may go; while no tierer has told the floor, nothing is
        deleted.
        """
        lake_floor = None
        if self.descriptor.option("table.datalake.enabled"):
            lake_floor = dict(self.retention_floor or self.start_offsets())
        return self.upkeep.enforce_retention(now_ms, lake_floor)

    def snapshot(self, *, force: bool = False, stop: Any = None) -> dict[int, SnapshotInfo | None]:
        """Take a KV snapshot of every bucket now; see :meth:`TableUpkeep.snapshot`."""
        self._require_pk("a KV snapshot")
        return self.upkeep.snapshot(force=force, stop=stop)

    def disk_usage(self) -> dict[str, int]:
        """Bytes on disk: ``kv``, ``snapshots``, ``log`` and ``total`` (see :mod:`flightstore.upkeep`)."""
        return self.upkeep.disk_usage()

    # ---- changelog ----------------------------------------------------------------------------
    def end_offsets(self) -> dict[int, int]:
        return {bucket: log.end_offset for bucket, log in enumerate(self.logs)}

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
                  until: Mapping | None = None) -> Iterator[pa.RecordBatch]:
        """Changelog batches from ``start`` as they are written, bucket by bucket in offset order.

        Runs until ``stop.is_set()`` (any object with ``is_set``) or, when ``until`` gives per-bucket
        end offsets, until every bucket reached them. Yields an empty batch as a heartbeat after
        ``heartbeat_s`` without data, so a server notices clients that went away. A subscriber
        that falls behind the log start (retention deleted rows it had not read) gets
        OffsetOutOfRange, never a silent gap.
        """
        offsets = self.resolve_start(start)
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
                limit = None if ends is None else ends.get(bucket, offsets[bucket])
                if limit is not None and offsets[bucket] >= limit:
                    continue
                for record in read_held(log, offsets[bucket], self._where(bucket), columns=stored,
                                        to_offset=limit):
                    offsets[bucket] = record.next_offset if limit is None else min(record.next_offset, limit)
                    progressed = True
                    yield self.changelog_batch(record, columns)
            if ends is not None and all(offsets[b] >= o for b, o in ends.items()):
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

    def _require_pk(self, what: str) -> None:
        if not self.has_primary_key:
            raise Unsupported(f"{what} needs a primary-key table; {self.path} is a log table")


def _log_schemas(descriptor: TableDescriptor) -> dict[int, pa.Schema]:
    """The log schema of every schema version of the table (a primary-key table's log adds
    ``_change_type`` to the columns)."""
    if descriptor.has_primary_key:
        return {version: changelog_schema(schema) for version, schema in descriptor.schemas.items()}
    return descriptor.schemas


def new_table_descriptor(path: TablePath | str, schema: pa.Schema | None = None, *,
                         primary_key: Sequence[str] = (), partition_keys: Sequence[str] = (),
                         options: Mapping[str, Any] | None = None,
                         descriptor: TableDescriptor | None = None) -> TableDescriptor:
    """The validated descriptor of a table to create (every check :meth:`Store.create_table`
    makes before touching the catalog), so a cluster can refuse bad DDL before it is committed."""
    if descriptor is None:
        if schema is None:
            raise InvalidInput("create_table needs a schema")
        descriptor = TableDescriptor.create(path, schema, primary_key, partition_keys, options)
    TablePath.checked(descriptor.path.database, descriptor.path.table)  # a prepared one too
    if descriptor.merge_engine in ("first_row", "versioned") and \
            descriptor.options.get("table.delete.behavior") == "allow":
        raise InvalidInput(f"table {descriptor.path}: the {descriptor.merge_engine} merge engine "
                           "cannot allow deletes; use 'ignore' or 'disable'")
    if descriptor.merge_engine == "aggregation":
        from flightstore.kv.merge.aggregation import validate_aggregation
        validate_aggregation(descriptor)
    return descriptor


def _lock_data_dir(data_dir: Path) -> int:
    """An exclusive lock on ``data_dir/LOCK`` for one Store's life, as a file descriptor.

    Two Stores on one directory would interleave appends to the same log segments and catalog;
    the second one fails here instead, naming the holder's pid. The kernel drops the lock when its
    process dies, so a crash leaves nothing to clean up."""
    fd = os.open(data_dir / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
        os.close(fd)
        raise DataDirectoryInUse(f"data directory {data_dir} is already open in another flightstore "
                                 f"Store (pid {holder or 'unknown'}); stop it first, or use another "
                                 "--data-dir") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


class Store:
    """A data directory of databases and tables. Thread-safe; close() when done.

    Tables open lazily, each behind its own gate: opening or recovering one table (which may read
    and replay its logs) never blocks lookups or writes on tables already open, nor the opening of
    other tables. ``fsync`` (default on): a write returns once its changelog is on disk, so it
    survives a power loss; concurrent writers share fsyncs (group commit). ``options``: server
    options (:data:`flightstore.config.SERVER_OPTIONS`) the storage honours: partition limits and
    dynamic partition creation.
    """

    def __init__(self, data_dir: str | os.PathLike, *,
                 fsync: bool = SERVER_OPTIONS["log.fsync"].default,
                 clock: Callable[[], int] = system_clock_ms,
                 options: Mapping[str, Any] | None = None) -> None:
        """Open (and lock) ``data_dir``. ``clock`` gives milliseconds to time writes (writer
        expiry, commit timestamps); tests inject one to move time without sleeping. ``options``:
        server options (:data:`flightstore.config.SERVER_OPTIONS`) the storage honours: partition
        limits and dynamic partition creation."""
        self.options = dict(options or {})
        self.data_dir = Path(data_dir)
        self.clock = clock
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._dir_lock: int | None = _lock_data_dir(self.data_dir)
        try:
            self.catalog = Catalog(self.data_dir)
        except BaseException:
            self._unlock()
            raise
        self.fsync = fsync
        self._tables: dict[TablePath, Table] = {}
        self._gates: dict[TablePath, threading.Lock] = {}  # one per table: its open or drop
        self._lock = threading.RLock()  # the two dicts above; never held while a table opens
        self._closed = False

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _gate(self, path: TablePath) -> threading.Lock:
        with self._lock:
            return self._gates.setdefault(path, threading.Lock())

    def _check_open(self) -> None:
        if self._closed:
            raise FlightstoreError(f"the store of {self.data_dir} is closed")

    # ---- DDL ----------------------------------------------------------------------------------
    def create_database(self, name: str, if_not_exists: bool = False) -> None:
        self.catalog.create_database(name, if_not_exists)

    def drop_database(self, name: str, if_exists: bool = False, cascade: bool = False) -> None:
        paths = sorted((p for p in self.catalog.all_tables() if p.database == name), key=str)
        with contextlib.ExitStack() as gates:
            for path in paths:  # in one order: two drops never wait on each other
                gates.enter_context(self._gate(path))
            with self._lock:
                if cascade:
                    for path in [p for p in self._tables if p.database == name]:
                        self._tables.pop(path).close()
                self.catalog.drop_database(name, if_exists, cascade)

    def create_table(self, path: TablePath | str, schema: pa.Schema | None = None, *,
                     primary_key: Sequence[str] = (), partition_keys: Sequence[str] = (),
                     options: Mapping[str, Any] | None = None, if_not_exists: bool = False,
                     descriptor: TableDescriptor | None = None) -> Table:
        """Create a table (or pass a prepared ``descriptor``) and return its handle."""
        descriptor = new_table_descriptor(path, schema, primary_key=primary_key,
                                          partition_keys=partition_keys, options=options,
                                          descriptor=descriptor)
        self._check_open()
        self.partition_limits.check_create(descriptor)
        created = self.catalog.create_table(descriptor, if_not_exists)
        if created and descriptor.option("table.auto-partition.enabled"):
            self.auto_partition(tables=[descriptor.path])  # its first partitions, at once
        return self.table(descriptor.path)  # outside the store lock: table() takes its gate
    @property
    def partition_limits(self) -> PartitionLimits:
        return PartitionLimits(server_option(self.options, "max.partition.num"),
                               server_option(self.options, "max.bucket.num"),
                               server_option(self.options, "max.table-bucket.num"))

    def alter_table(self, path: TablePath | str, changes: Sequence[Change]) -> TableDescriptor:
        """Apply ALTER TABLE ``changes`` (all or nothing, one atomic catalog write) and make the
        open handle follow; returns the new descriptor. See :mod:`flightstore.alter`."""
        path = self._path(path)
        self._check_open()
        target = apply_changes(self.catalog.get_table(path), changes, self.partition_limits).path
        with self._gates_of(path, target):  # no open of the table (under either name) meanwhile
            old, new = self.catalog.alter_table(
                path, lambda descriptor: apply_changes(descriptor, changes, self.partition_limits))
            if new != old:
                self._follow(old.path, new)
            return new

    def _gates_of(self, *paths: TablePath) -> contextlib.ExitStack:
        """The gates of ``paths``, taken in one order (two DDLs never wait on each other)."""
        stack = contextlib.ExitStack()
        for path in sorted(set(paths), key=str):
            stack.enter_context(self._gate(path))
        return stack

    def _follow(self, old_path: TablePath, new: TableDescriptor) -> None:
        """Make the open handle (if any) of a table follow its committed new descriptor (the
        caller holds the table's gates); a table not open only needs the directories of dropped
        partitions removed."""
        with self._lock:
            table = self._tables.pop(old_path, None)
        if table is not None:
            table.refresh(new)
            with self._lock:
                self._tables[new.path] = table
        elif new.is_partitioned:  # not open: dropped partitions' directories go now
            from flightstore.partitioned import remove_partition_directories
            remove_partition_directories(self.catalog.table_dir(new.path),
                                         [p.id for p in new.partitions])

    def _create_partitions(self, path: TablePath, values: list[tuple[str, ...]]) -> None:
        """Dynamic partition creation for a write (one catalog change for every missing one)."""
        if not server_option(self.options, "client.writer.dynamic-create-partition.enabled"):
            shown = ", ".join(repr("$".join(v)) for v in values)
            raise PartitionNotFound(
                f"table {path} has no partition {shown} and dynamic partition creation is off "
                "('client.writer.dynamic-create-partition.enabled' = false): ALTER TABLE ... ADD "
                "PARTITION first; nothing was written")
        self.alter_table(path, [AddPartition(v, if_not_exists=True) for v in values])

    def auto_partition(self, now_ms: int | None = None,
                       tables: Sequence[TablePath] | None = None) -> dict[str, tuple[int, int]]:
        """Create ahead and drop expired partitions of auto-partitioned tables (see
        :mod:`flightstore.autopartition`); returns ``{table: (created, dropped)}`` of the tables
        that changed. A table that cannot be changed (limits) is skipped; the next check retries."""
        now_ms = int(time.time() * 1000) if now_ms is None else int(now_ms)
        changed: dict[str, tuple[int, int]] = {}
        for path in (self.catalog.all_tables() if tables is None else tables):
            try:
                descriptor = self.catalog.get_table(path)
                settings = auto_partition(descriptor)
                if settings is None:
                    continue
                create, drop = plan_auto_partitions(settings, descriptor.partitions, now_ms)
                if create or drop:
                    self.alter_table(path, [DropPartition(p.values, if_exists=True) for p in drop] +
                                     [AddPartition(v, if_not_exists=True) for v in create])
                    changed[str(path)] = (len(create), len(drop))
            except FlightstoreError:
                continue
        return changed

    def drop_table(self, path: TablePath | str, if_exists: bool = False) -> None:
        path = self._path(path)
        with self._gate(path):  # waits for an open of this table in progress
            with self._lock:
                table = self._tables.pop(path, None)
            if table is not None:
                table.close()
            self.catalog.drop_table(path, if_exists)

    # ---- access -------------------------------------------------------------------------------
    def _path(self, path: TablePath | str) -> TablePath:
        return path if isinstance(path, TablePath) else TablePath.parse(path, DEFAULT_DATABASE)

    def table(self, path: TablePath | str) -> Table:
        """Open (once) and return the table handle; TableNotFound / CorruptData otherwise.

        An open table is returned without taking any lock. A table not open yet is opened under its
        own gate (callers for the same table wait for that one open), outside the store lock.
        """
        path = self._path(path)
        table = self._tables.get(path)
        if table is not None:
            return table
        self._check_open()
        with self._gate(path):
            table = self._tables.get(path)
            if table is not None:
                return table
            descriptor = self.catalog.get_table(path)
            directory = self.catalog.table_dir(path)
            if descriptor.is_partitioned:
                from flightstore.partitioned import PartitionedTable
                table = PartitionedTable(descriptor, directory, fsync=self.fsync, clock=self.clock,
                                         create_partitions=self._create_partitions)
            else:
                table = Table(descriptor, directory, fsync=self.fsync, clock=self.clock)
            with self._lock:
                closed = self._closed
                if not closed:
                    self._tables[path] = table
            if closed:  # the store closed while this table opened
                table.close()
                self._check_open()
            return table

    def list_databases(self) -> list[str]:
        return self.catalog.list_databases()

    def open_tables(self) -> list[Table]:
        """The tables opened so far (for monitoring: no table is opened by asking; and only they
        can have changed since this Store started, which the KV snapshot schedule relies on)."""
        with self._lock:
            return list(self._tables.values())

    def enforce_retention(self, now_ms: int | None = None) -> int:
        """Apply ``table.log.ttl`` to every table and forget writers past
        ``table.writer-id.expiration``; returns the log rows dropped. Unreadable tables are left
        for their owner to notice."""
        dropped = 0
        for path in self.catalog.all_tables():
            try:
                table = self.table(path)
                dropped += table.enforce_retention(now_ms)
                table.expire_writers(now_ms)
            except FlightstoreError:
                continue
        return dropped

    def take_due_snapshots(self, stop: Any = None) -> int:
        """Take the KV snapshots due by ``kv.snapshot.interval`` in every open primary-key table,
        then apply ``table.log.ttl`` to the tables that got one (a snapshot lets their log shrink).
        Returns the number of snapshots taken. ``stop()`` returning True ends the round early."""
        taken = 0
        for table in self.open_tables():
            if stop is not None and stop():
                break
            try:
                count = table.upkeep.take_due_snapshots(stop=stop)
                if count:
                    table.enforce_retention()
                taken += count
            except Cancelled:
                break
            except FlightstoreError as exc:  # a closed or broken table: its owner will notice
                _logger.warning("KV snapshot of %s failed: %s", table.path, exc)
        return taken

    def next_snapshot_due_ms(self) -> int | None:
        """Wall-clock ms when the next KV snapshot of an open table is due (None: none is)."""
        dues = [due for table in self.open_tables() if (due := table.upkeep.next_due_ms()) is not None]
        return min(dues) if dues else None

    def list_tables(self, database: str = DEFAULT_DATABASE) -> list[str]:
        return self.catalog.list_tables(database)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            tables = list(self._tables.values())
            self._tables.clear()
        for table in tables:
            table.close()
        self._unlock()

    def _unlock(self) -> None:
        if self._dir_lock is not None:
            os.close(self._dir_lock)  # closing the descriptor releases the flock
            self._dir_lock = None
