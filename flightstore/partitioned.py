"""A partitioned table: a router over one :class:`~flightstore.store.Table` unit per partition.

Each partition is a complete table unit in its own directory ``<table dir>/p-<id>`` (named by the
partition's generated id, never by its values): its own ``bucket.num`` buckets, each with its own
log and, for primary-key tables, its own KV. So everything a bucket does (recovery, retention,
statistics skipping, fsync, snapshots) holds in every partition. :class:`PartitionedTable` keeps the
:class:`Table` interface: it validates a write once for the whole table, routes rows by partition
then bucket, and unions reads over the partitions a filter cannot rule out.

Buckets are numbered table-wide: bucket ``b`` of partition ``p`` is ``p * bucket.num + b``
(:func:`~flightstore.partitioning.bucket_id`). Changelog offsets, subscriptions, Flight endpoints
and Spark input partitions use these numbers, and partition ids are never reused, so a stream never
confuses a new partition with a dropped one; partitions created while a stream runs appear as new
bucket numbers starting at offset 0.

Writes. A write whose rows fall in partitions that do not exist creates them first, in one catalog
change (``client.writer.dynamic-create-partition.enabled``, within ``max.partition.num`` and
``max.bucket.num``; beyond them the write is refused and nothing is written). A write spanning
several buckets (of one or several partitions) is recorded as one intent in the table directory,
so a crash between two partitions is completed on the next open; writer sequences are the table's,
checked once here.

Partition directories follow the catalog: a partition is added or dropped by one atomic catalog
write; its directory is created when the partition opens and removed after the drop is committed.
A directory the catalog does not list (a crash between the commit and the removal) is deleted when
the table opens: a crash never leaves half a partition visible.
"""

from __future__ import annotations

import itertools
import shutil
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flightstore import changetype
from flightstore.bucketing import bucket_ids
from flightstore.errors import FlightstoreError, InvalidInput, PartitionNotFound
from flightstore.expressions import Predicate, and_all
from flightstore.intents import IntentLog
from flightstore.kv.encoding import encode_keys
from flightstore.kv.ownership import ColumnOwnership
from flightstore.kv.ranges import conjuncts_of
from flightstore.log.held import read_held, require_held
from flightstore.partitioning import (
    SEPARATOR,
    Partition,
    bucket_id,
    prune,
    row_partition_names,
    split_bucket_id,
)
from flightstore.replica.replica import SOLO, Leadership
from flightstore.schema import Projections, TableDescriptor, as_table
from flightstore.store import Table, WriteResult
from flightstore.writers import WriterRegistry, system_clock_ms

__all__ = ["PartitionedTable", "PartitionsUpkeep", "partition_directory", "remove_partition_directories"]

CreatePartitions = Callable[[Any, list[tuple[str, ...]]], None]
_CREATE_ATTEMPTS = 3  # creations of a write's partitions that a concurrent drop may undo


def partition_directory(table_dir: Path, partition_id: int) -> Path:
    """Where partition ``partition_id`` of the table in ``table_dir`` keeps its buckets."""
    return Path(table_dir) / f"p-{partition_id}"


def remove_partition_directories(table_dir: Path, keep: Sequence[int]) -> list[Path]:
    """Delete every partition directory of ``table_dir`` whose id is not in ``keep``."""
    removed = []
    wanted = {f"p-{i}" for i in keep}
    for child in sorted(Path(table_dir).glob("p-*")):
        if child.is_dir() and child.name not in wanted and child.name[2:].isdigit():
            shutil.rmtree(child, ignore_errors=True)
            removed.append(child)
    return removed


class PartitionedTable(Table):
    """A handle on a partitioned table (same interface as :class:`Table`)."""

    def __init__(self, descriptor: TableDescriptor, directory: Path, *, fsync: bool = True,
                 clock: Callable[[], int] = system_clock_ms,
                 create_partitions: CreatePartitions | None = None, remote: Any = None,
                 leadership: Leadership = SOLO) -> None:
        # Not Table.__init__: the buckets live in the partition units.
        self._leadership = leadership
        self._remote = remote  # the table in remote storage (flightstore.remote.RemoteTable)
        self.descriptor = descriptor
        self.path = descriptor.path
        self.schema = descriptor.schema
        self.directory = Path(directory)
        self.table_id = self.directory.name  # a cluster's store sets the cluster's id (Store.table)
        self.fsync = fsync
        self._lock = threading.RLock()
        self._projections = Projections(self.schema)
        self._written = threading.Condition()
        self._round_robin = itertools.count()
        self.round_robin_buckets: Sequence[int] | None = None  # see Table
        self.ownership = ColumnOwnership()
        self._clock = clock
        self._create_partitions = create_partitions
        self._merger = self._new_merger(descriptor)
        remove_partition_directories(self.directory, [p.id for p in descriptor.partitions])
        self.units: dict[int, Table] = {}
        try:
            for partition in descriptor.partitions:
                self.units[partition.id] = self._open_unit(partition)
        except BaseException:
            self.close()
            raise
        # The table's writers: every partition's (each expired its stale ones when it opened).
        self._writers = WriterRegistry(str(self.path), descriptor.option("table.writer-id.expiration"),
                                       clock)
        self._writers.load(unit._writers.state() for unit in self.units.values())
        self._intents = IntentLog(self.directory / "intent", fsync=fsync)
        self._complete_pending_write()
        self.expire_writers()

    # ---- units --------------------------------------------------------------------------------
    def _open_unit(self, partition: Partition, fresh: bool = False) -> Table:
        """The unit of ``partition`` (``fresh``: just created, nothing of it can be in remote
        storage yet)."""
        remote = None if self._remote is None else self._remote.partition(partition.id, fresh)
        return Table(self.descriptor, partition_directory(self.directory, partition.id), fsync=self.fsync,
                     clock=self._clock, remote=remote, leadership=self._leadership)

    @staticmethod
    def _new_merger(descriptor: TableDescriptor) -> Any:
        if not descriptor.has_primary_key:
            return None
        from flightstore.kv.merge import merger_for
        return merger_for(descriptor)

    @property
    def merger(self) -> Any:
        return self._merger

    def _unit(self, name: str) -> tuple[Partition, Table] | None:
        partition = self.descriptor.partition(name)
        if partition is None:
            return None
        unit = self.units.get(partition.id)
        return None if unit is None else (partition, unit)

    def _pruned(self, filter: Predicate | None,
                partitions: Sequence[str] | None = None) -> list[tuple[Partition, Table]]:
        """The (partition, unit) pairs a read must visit, in partition-name order."""
        d = self.descriptor
        chosen = prune(d.partitions, d.partition_keys, d.schema, filter)
        if partitions is not None:
            wanted = set(partitions)
            chosen = tuple(p for p in chosen if p.name in wanted)
        return [(p, self.units[p.id]) for p in chosen if p.id in self.units]

    def bucket_ids(self, partitions: Sequence[str] | None = None,
                   filter: Predicate | None = None) -> list[int]:
        nb = self.num_buckets
        return [bucket_id(p.id, b, nb) for p, _ in self._pruned(filter, partitions) for b in range(nb)]

    def _locate(self, global_bucket: int) -> tuple[Table, int]:
        partition_id, bucket = split_bucket_id(global_bucket, self.num_buckets)
        unit = self.units.get(partition_id)
        if unit is None:
            raise PartitionNotFound(f"table {self.path} has no bucket {global_bucket} (its partition "
                                    "was dropped, or never existed)")
        return unit, bucket

    def partition_stats(self) -> list[tuple[Partition, int]]:
        """Every partition with its row count, in name order."""
        with self._lock:
            return [(p, unit.row_count()) for p, unit in self._pruned(None)]

    def refresh(self, descriptor: TableDescriptor) -> None:
        """Follow a committed catalog change: new schema version or options (every unit evolves),
        partitions added (opened) or dropped (closed, directory removed)."""
        with self._lock:
            keep = {p.id for p in descriptor.partitions}
            for partition_id in [i for i in self.units if i not in keep]:
                self.units.pop(partition_id).close()
            remove_partition_directories(self.directory, sorted(keep))
            if descriptor != self.descriptor:
                for unit in self.units.values():
                    unit.evolve(descriptor)
            self.descriptor, self.path, self.schema = descriptor, descriptor.path, descriptor.schema
            self._projections = Projections(self.schema)
            self._merger = self._new_merger(descriptor)
            for partition in descriptor.partitions:
                if partition.id not in self.units:
                    self.units[partition.id] = self._open_unit(partition, fresh=True)
        self._notify()  # subscriptions pick up new partitions

    evolve = refresh

    def close(self) -> None:
        for unit in getattr(self, "units", {}).values():
            unit.close()

    # ---- writes -------------------------------------------------------------------------------
    def _ensure_partitions(self, names: list[str]) -> None:
        """Create the partitions among ``names`` that do not exist (one catalog change), or refuse
        the write naming them. Runs without the table lock: creation is DDL."""
        missing = [n for n in names if self.descriptor.partition(n) is None]
        if not missing:
            return
        if self._create_partitions is None:
            raise PartitionNotFound(f"table {self.path} has no partition {missing[0]!r}; create it "
                                    "with ALTER TABLE ... ADD PARTITION")
        self._create_partitions(self.path, [tuple(n.split(SEPARATOR)) for n in missing])

    def _apply_buckets(self, table: pa.Table, kinds: np.ndarray | None, target: tuple | None,
                       writer_id: str | None, sequence: int | None, overwrite: bool = False,
                       recovering: bool = False) -> WriteResult:
        keys = self.descriptor.partition_keys
        names = row_partition_names(table, keys, f"write to {self.path}")
        encoded = names.dictionary_encode()
        groups = encoded.indices.to_numpy(zero_copy_only=False)
        wanted = encoded.dictionary.to_pylist()
        for _ in range(_CREATE_ATTEMPTS):
            if not recovering:
                self._ensure_partitions(wanted)
            with self._lock:
                units = self._units_of(wanted, groups, recovering)
                if units is not None:
                    # Each log's truncations before the append: a cut racing the write is seen.
                    cuts = {id(log): log.truncations for _, unit, _ in units for log in unit.logs}
                    result = self._apply_units(table, kinds, target, writer_id, sequence, overwrite,
                                               recovering, units)
                    # Every unit written awaits its commit, even one deposed since the append (see
                    # Table._apply_buckets); a write replayed on open only on its leaders.
                    written = [(self._replica_of(b), self._log_of(b).end_offset, cuts.get(id(self._log_of(b))))
                               for b in result.touched]
                    written = [w for w in written if not recovering or w[0].leadership.is_leader]
            if units is not None:
                for replica, _, _ in written:  # followers fetch while this server syncs
                    replica.appended()
                for replica, end, _ in written:  # outside the lock: concurrent writers share fsyncs
                    replica.log.sync(end)
                for replica, end, cut in written:  # acks = all: every in-sync replica has it
                    replica.await_commit(end, cut)
                self._notify()  # outside the table lock: subscribers hold _written, then take it
                return result
            # A partition was dropped (auto-partition retention, DDL) between its creation and the
            # table lock: create it again and retry, outside the lock.
        raise PartitionNotFound(f"a partition of {self.path} was dropped {_CREATE_ATTEMPTS} times while "
                                "the write ran; nothing was written")

    def _units_of(self, wanted: list[str], groups: np.ndarray, recovering: bool) -> list | None:
        """``(partition, unit, row mask)`` of each wanted partition; None when one is missing
        (dropped concurrently). Recovering, a missing partition's rows are skipped: they went with
        it."""
        units = []
        for index, name in enumerate(wanted):
            found = self._unit(name)
            if found is None:
                if recovering:
                    continue
                return None
            units.append((found[0], found[1], groups == index))
        return units

    def _apply_units(self, table: pa.Table, kinds: np.ndarray | None, target: tuple | None,
                     writer_id: str | None, sequence: int | None, overwrite: bool, recovering: bool,
                     units: list) -> WriteResult:
        """The write, under the table lock, to the partitions' units: every bucket of every
        partition prepared before any commits, one intent across them (see
        :mod:`flightstore.table.pending`); writer sequences are the table's, checked here."""
        self._settle_pending()
        result = WriteResult()
        now = self._clock()
        if not recovering:
            self._check_sequence(writer_id, sequence)
            last = self._writers.sequence(writer_id) if writer_id is not None else None
            if sequence is not None and last is not None and sequence <= last:
                result.duplicate = True  # the whole write landed: partitions apply all or none
                return result
        several = self._spans_buckets(table, units)
        if several:
            writer_id, sequence = self._intent_writer(writer_id, sequence)
        parts = []
        for partition, unit, mask in units:
            for part in unit._prepare_buckets(table.filter(pa.array(mask)),
                                              None if kinds is None else kinds[mask], target,
                                              writer_id, sequence, overwrite, now):
                part.partition = partition.id
                parts.append(part)
        result.touched = [self._table_bucket(p.partition, p.bucket) for p in parts]
        if several:
            self._commit_all_or_nothing(parts, kinds is not None, writer_id, sequence, now, result)
        else:
            for part in parts:
                result.duplicate |= part.duplicate
                if not part.duplicate:
                    result[self._table_bucket(part.partition, part.bucket)] = \
                        self._unit_of(part.partition)._commit_bucket(part, writer_id, sequence, now)
        self._note_sequence(writer_id, sequence, now)
        for _, unit, _ in units:  # each partition's registry too (its undo and expiry use it)
            unit._note_sequence(writer_id, sequence, now)
        return result

    # ---- where a bucket lives (hooks of flightstore.table.pending) ----------------------------
    def _unit_of(self, partition: int | None) -> Table | None:
        return self.units.get(partition)

    def _table_bucket(self, partition: int | None, bucket: int) -> int:
        return bucket_id(partition, bucket, self.num_buckets)

    def _split_table_bucket(self, bucket: int) -> tuple[int | None, int]:
        return split_bucket_id(bucket, self.num_buckets)

    def _log_of(self, bucket: int) -> Any:
        unit, local = self._locate(bucket)
        return unit.logs[local]

    def _replica_of(self, bucket: int) -> Any:
        unit, local = self._locate(bucket)
        return unit.replicas[local]

    def _spans_buckets(self, table: pa.Table, units: list) -> bool:
        if len(units) > 1:
            return True
        key = self.descriptor.bucket_key
        if not key or self.num_buckets == 1 or table.num_rows < 2:
            return False
        return len(np.unique(bucket_ids(table, key, self.num_buckets))) > 1

    def undo(self, writer_id: str, after_sequence: int, buckets: Sequence[int] | None = None) -> int:
        """Undo the writer's batches after ``after_sequence`` in every partition (``buckets``:
        only those numbers in each): everything is checked, across partitions, before anything is
        restored (see :mod:`flightstore.kv.undo`)."""
        from flightstore.kv.undo import undo_writer
        self._require_pk("undo")
        with self._lock:
            self._settle_pending()
            units = list(self.units.values())
            if writer_id not in self._writers or not units:
                return 0
            kvs = [kv for unit in units for b, kv in enumerate(unit.kvs) if buckets is None or b in buckets]
            restored = undo_writer(kvs, writer_id, after_sequence)
            for unit in units:
                unit._writers.reset(writer_id, int(after_sequence))
            self._writers.reset(writer_id, int(after_sequence))
        self._notify()
        return restored

    def _expire(self, writer_ids: list[str], now_ms: int) -> None:
        """Forget the writers here and in every partition (:meth:`Table.expire_writers` calls it)."""
        with self._lock:
            for unit in self.units.values():
                unit._expire(writer_ids, now_ms)
            for writer in writer_ids:
                self.ownership.release(writer)
            self._writers.forget(writer_ids, now_ms)

    # ---- reads --------------------------------------------------------------------------------
    def _by_partition(self, keys: pa.Table) -> list[tuple[Table, np.ndarray]]:
        """Rows of ``keys`` (holding the partition columns) grouped by existing partition."""
        names = row_partition_names(keys, self.descriptor.partition_keys, f"lookup in {self.path}")
        encoded = names.dictionary_encode()
        groups = encoded.indices.to_numpy(zero_copy_only=False)
        found = []
        for index, name in enumerate(encoded.dictionary.to_pylist()):
            located = self._unit(name)
            if located is not None:
                found.append((located[1], np.flatnonzero(groups == index)))
        return found

    def lookup(self, keys: Any, columns: Sequence[str] | None = None) -> pa.Table:
        """Rows with the given primary keys, in key order: each key goes to its one partition."""
        self._require_pk("lookup")
        columns = self._check_columns(columns)
        keys = self._pk_table(keys, self.descriptor.primary_key)
        out_schema = self._projections.of(columns)
        groups = self._by_partition(keys)
        if len(groups) == 1 and len(groups[0][1]) == keys.num_rows:  # one partition (point lookups)
            return groups[0][0].lookup(keys, columns)
        pk = list(self.descriptor.primary_key)
        wanted = list(columns) + [c for c in pk if c not in columns]
        parts, positions = [], []
        for unit, rows in groups:
            subset = keys.take(pa.array(rows))
            found = unit.lookup(subset, wanted)
            if found.num_rows:
                parts.append(found)
                where = pc.index_in(pa.array(encode_keys(found, pk), pa.binary()),
                                    value_set=pa.array(encode_keys(subset, pk), pa.binary()))
                positions.append(rows[where.to_numpy(zero_copy_only=False)])
        if not parts:
            return out_schema.empty_table()
        order = np.argsort(np.concatenate(positions), kind="stable")
        return pa.concat_tables(parts).take(pa.array(order)).select(list(columns)).cast(out_schema)

    def prefix_lookup(self, prefix: Any, columns: Sequence[str] | None = None,
                      limit: int | None = None) -> pa.Table:
        """Rows whose leading primary-key columns equal ``prefix`` rows; the prefix must hold the
        partition keys (the lookup goes to their partitions only)."""
        self._require_pk("prefix lookup")
        columns = self._check_columns(columns)
        table = as_table(prefix)
        missing = [k for k in self.descriptor.partition_keys if k not in table.column_names]
        if missing:
            raise InvalidInput(f"a prefix lookup on partitioned table {self.path} needs the partition "
                               f"key column(s) {missing}")
        out_schema = self._projections.of(columns)
        parts = []
        for unit, rows in self._by_partition(table):
            remaining = None if limit is None else limit - sum(p.num_rows for p in parts)
            if remaining is not None and remaining <= 0:
                break
            parts.append(unit.prefix_lookup(table.take(pa.array(rows)), columns, remaining))
        return pa.concat_tables(parts).cast(out_schema) if parts else out_schema.empty_table()

    def scan(self, columns: Sequence[str] | None = None, filter: Predicate | None = None,
             limit: int | None = None, buckets: Sequence[int] | None = None,
             key_range: Any = None, *, exact: bool = True) -> Iterator[pa.RecordBatch]:
        """Current rows of the partitions ``filter`` cannot rule out (or of ``buckets``); each
        partition reads its primary-key range and pinned bucket as :meth:`Table.scan` does."""
        columns = self._check_columns(columns)
        if filter is not None:
            filter = filter.bind(self.schema)
        pruned = self._pruned(filter)
        if buckets is None:
            targets = [(unit, None) for _, unit in pruned]
        else:  # a bucket of a partition the filter rules out holds no matching row
            kept = {id(unit) for _, unit in pruned}
            targets = [(unit, [bucket]) for unit, bucket in map(self._locate, buckets) if id(unit) in kept]
        within = self._within_partition(filter)
        remaining = limit
        for unit, local in targets:
            if remaining is not None and remaining <= 0:
                return
            for batch in unit.scan(columns, within, remaining, local, key_range, exact=exact):
                if remaining is not None:
                    remaining -= batch.num_rows
                yield batch

    def _within_partition(self, filter: Predicate | None) -> Predicate | None:
        """``filter`` without its top-level conjuncts over partition columns only: in a partition
        the pruning kept, every row satisfies them (rows carry the partition's values), so each
        partition reads as if unfiltered by them (its snapshot image, not a key range on them)."""
        keys = set(self.descriptor.partition_keys)
        kept = [c for c in conjuncts_of(filter) if not c.columns() <= keys]
        return and_all(kept)

    def row_count(self, partitions: Sequence[str] | None = None) -> int:
        """Maintained counts of the (named) partitions: no scan."""
        return sum(unit.row_count() for _, unit in self._pruned(None, partitions))

    def row_count_of(self, numbers: Sequence[int], partitions: Sequence[str] | None = None) -> int:
        return sum(unit.row_count_of(numbers) for _, unit in self._pruned(None, partitions))

    def enforce_retention(self, now_ms: int | None = None) -> int:
        return sum(unit.enforce_retention(now_ms) for unit in list(self.units.values()))

    # ---- KV snapshots (each partition's buckets keep their own) -------------------------------
    @property
    def upkeep(self) -> PartitionsUpkeep:
        """Retention and KV snapshots of every partition (see :mod:`flightstore.upkeep`)."""
        return PartitionsUpkeep(self)

    def snapshot(self, *, force: bool = False, stop: Any = None,
                 buckets: Sequence[int] | None = None) -> dict[int, Any]:
        """A KV snapshot of every bucket (``buckets``: those numbers) of every partition now, by
        table-wide bucket number."""
        self._require_pk("a KV snapshot")
        return self.upkeep.snapshot(force=force, stop=stop, buckets=buckets)

    def disk_usage(self, buckets: Sequence[int] | None = None) -> dict[str, int]:
        return self.upkeep.disk_usage(buckets)

    def rows_at(self, bucket: int, at: int, columns: Sequence[str] | None = None,
                limit: int | None = None) -> Iterator[pa.RecordBatch]:
        """:meth:`Table.rows_at` of one bucket (table-wide number) of one partition."""
        self._require_pk("a snapshot read")
        unit, local = self._locate(bucket)
        return unit.rows_at(local, at, columns, limit)

    # ---- changelog ----------------------------------------------------------------------------
    def _logs(self) -> dict[int, Any]:
        """Every bucket's log by table-wide bucket number."""
        nb = self.num_buckets
        with self._lock:
            return {bucket_id(pid, b, nb): log for pid, unit in self.units.items()
                    for b, log in enumerate(unit.logs)}

    def tablets(self) -> dict[int, tuple[Any, Any]]:
        nb = self.num_buckets
        with self._lock:
            return {bucket_id(pid, b, nb): tablets for pid, unit in self.units.items()
                    for b, tablets in unit.tablets().items()}

    def end_offsets(self) -> dict[int, int]:
        return {b: log.high_watermark for b, log in self._logs().items()}

    def start_offsets(self) -> dict[int, int]:
        return {b: log.start_offset for b, log in self._logs().items()}

    def offsets_for_timestamp(self, timestamp_ms: int) -> dict[int, int]:
        return {b: log.offset_for_timestamp(timestamp_ms) for b, log in self._logs().items()}

    def resolve_start(self, start: Any) -> dict[int, int]:
        """As :meth:`Table.resolve_start`, by table-wide bucket number. Explicit offsets of buckets
        whose partition was dropped since (a stream planned before a retention drop) are ignored:
        their rows are gone."""
        if not isinstance(start, Mapping) or "timestamp" in start:
            return Table.resolve_start(self, start)
        logs = self._logs()
        offsets = {b: log.start_offset for b, log in logs.items()}
        for bucket, offset in start.items():
            bucket = int(bucket)
            if bucket not in logs:
                partition_id = split_bucket_id(bucket, self.num_buckets)[0]
                if partition_id < self.descriptor.next_partition_id:
                    continue  # its partition was dropped
                raise InvalidInput(f"table {self.path} has no bucket {bucket}")
            require_held(logs[bucket], int(offset), self._where(bucket))
            offsets[bucket] = int(offset)
        return offsets

    def _where(self, bucket: int) -> str:
        partition_id, local = split_bucket_id(bucket, self.num_buckets)
        names = [p.name for p in self.descriptor.partitions if p.id == partition_id]
        return f"table {self.path} partition {names[0] if names else partition_id} bucket {local}"

    def read_changelog(self, bucket: int, from_offset: int | None = None, *,
                       columns: Sequence[str] | None = None, to_offset: int | None = None,
                       max_rows: int | None = None) -> Iterator[pa.RecordBatch]:
        """``t$changelog`` rows of one bucket (table-wide number); see :meth:`Table.read_changelog`."""
        unit, local = self._locate(bucket)
        yield from unit.read_changelog(local, from_offset, columns=columns, to_offset=to_offset,
                                       max_rows=max_rows)

    def subscribe(self, start: Any = "earliest", *, columns: Sequence[str] | None = None,
                  stop: Any = None, heartbeat_s: float | None = 1.0,
                  until: Mapping | None = None, buckets: Sequence[int] | None = None) -> Iterator[pa.RecordBatch]:
        """Changelog batches of every partition, including partitions created while the stream
        runs (read from their first offset); otherwise as :meth:`Table.subscribe`."""
        import time
        offsets = self.resolve_start(start)
        numbers = None if buckets is None else {int(b) for b in buckets}
        if numbers is not None:
            offsets = {b: o for b, o in offsets.items() if b % self.num_buckets in numbers}
        ends = None if until is None else {int(b): int(o) for b, o in until.items()}
        out_schema = changetype.changelog_schema(self.schema)
        columns = list(columns or out_schema.names)
        stored = self._stored_columns(columns)
        heartbeat = pa.RecordBatch.from_pylist([], schema=pa.schema([out_schema.field(c) for c in columns]))
        idle_since = time.monotonic()
        while stop is None or not stop.is_set():
            with self._written:
                before = self.end_offsets()
            logs = self._logs()
            if numbers is not None:
                logs = {b: log for b, log in logs.items() if b % self.num_buckets in numbers}
            progressed = False
            for bucket in sorted(logs):
                log = logs[bucket]
                position = offsets.setdefault(bucket, log.start_offset)  # a new partition: all of it
                limit = None if ends is None else ends.get(bucket, position)
                if limit is not None and position >= limit:
                    continue
                try:
                    for record in read_held(log, position, self._where(bucket), columns=stored,
                                            to_offset=limit):
                        offsets[bucket] = record.next_offset if limit is None else min(record.next_offset, limit)
                        progressed = True
                        yield self.changelog_batch(record, columns)
                except FlightstoreError:
                    if bucket in self._logs():
                        raise
                    # its partition was dropped (its log closed) while this pass read it: the
                    # partition's rows are gone, and the other partitions' go on
            if ends is not None and all(offsets.get(b, 0) >= o or b not in logs for b, o in ends.items()):
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


class PartitionsUpkeep:
    """:class:`~flightstore.upkeep.TableUpkeep` over every partition of a partitioned table (the
    server's housekeeping takes each partition bucket's KV snapshots when due)."""

    def __init__(self, table: PartitionedTable) -> None:
        with table._lock:
            self._units = dict(table.units)
        self._num_buckets = table.num_buckets

    def take_due_snapshots(self, now_ms: int | None = None, stop: Any = None) -> int:
        return sum(unit.upkeep.take_due_snapshots(now_ms, stop) for unit in self._units.values())

    def next_due_ms(self) -> int | None:
        dues = [due for unit in self._units.values() if (due := unit.upkeep.next_due_ms()) is not None]
        return min(dues) if dues else None

    def snapshot(self, *, force: bool = False, stop: Any = None,
                 buckets: Sequence[int] | None = None) -> dict[int, Any]:
        return {bucket_id(pid, b, self._num_buckets): info for pid, unit in self._units.items()
                for b, info in unit.upkeep.snapshot(force=force, stop=stop, buckets=buckets).items()}

    def disk_usage(self, buckets: Sequence[int] | None = None) -> dict[str, int]:
        usage: dict[str, int] = {}
        for unit in self._units.values():
            for key, value in unit.upkeep.disk_usage(buckets).items():
                usage[key] = usage.get(key, 0) + value
        return usage or {"kv": 0, "snapshots": 0, "log": 0, "total": 0}

