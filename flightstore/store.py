"""The embedded storage API: a data directory of databases and tables, no server needed.

``Store`` owns the catalog and opens tables lazily; a ``Table`` splits writes by bucket and routes
them to the bucket's log (log tables) or KV tablet (primary-key tables). Every write is validated in
full before any bucket is touched, so bad input changes nothing. Writes may carry a writer id and a
batch sequence: a retried batch is applied once, a gap in the sequence is refused.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import pyarrow as pa

from flightstore.alter import AddPartition, Change, DropPartition, PartitionLimits, apply_changes
from flightstore.autopartition import auto_partition
from flightstore.autopartition import plan as plan_auto_partitions
from flightstore.catalog import DEFAULT_DATABASE, Catalog
from flightstore.config import SERVER_OPTIONS, server_option
from flightstore.errors import (
    Cancelled,
    DataDirectoryInUse,
    FlightstoreError,
    InvalidInput,
    PartitionNotFound,
    Unsupported,
)
from flightstore.intents import IntentLog
from flightstore.kv.ownership import ColumnOwnership
from flightstore.kv.snapshot import SnapshotInfo
from flightstore.kv.tablet import KvTablet, changelog_schema
from flightstore.log import LogTablet
from flightstore.log.segment import expiry_due
from flightstore.remote import RemoteStorage, RemoteTable, restore_missing_bucket
from flightstore.replica.replica import SOLO, Leadership, Replica
from flightstore.schema import Projections, TableDescriptor, TablePath
from flightstore.table.api import TableApi
from flightstore.table.changelog import TableChangelog
from flightstore.table.reads import TableReads
from flightstore.table.validation import TableValidation
from flightstore.table.writes import TABLE_WRITER as TABLE_WRITER  # re-exported: imported from here
from flightstore.table.writes import TableWrites, WriteResult
from flightstore.upkeep import TableUpkeep
from flightstore.writers import WriterRegistry, system_clock_ms

__all__ = ["Store", "Table", "WriteResult", "new_table_descriptor"]

_logger = logging.getLogger("flightstore.store")


OPEN_THREADS = 16  # buckets (of every primary-key table being opened) whose KVs open at once
_open_pool: ThreadPoolExecutor | None = None
_open_pool_lock = threading.Lock()


def _bucket_opener() -> ThreadPoolExecutor:
    """The process's threads that open buckets, started once: starting 16 threads for every
    open cost more than the overlap won on a busy machine (each start waits for the GIL)."""
    global _open_pool
    with _open_pool_lock:
        if _open_pool is None:
            _open_pool = ThreadPoolExecutor(OPEN_THREADS, thread_name_prefix="flightstore-open")
        return _open_pool


def _open_all(open_bucket: Callable[[int], tuple[LogTablet, KvTablet | None]], buckets: int, *,
              parallel: bool) -> list[tuple[LogTablet, KvTablet | None]]:
    """``open_bucket(b)`` for every bucket, in bucket order. A RocksDB open waits on about seven
    fsyncs (its MANIFEST, CURRENT, OPTIONS file, WAL and directory) without holding the GIL:
    opening a primary-key table's KVs one after the other made its first use (a query, a lookup,
    the console's table page) wait for 16 x 7 fsyncs; on threads the waits overlap. When a
    bucket fails, the buckets that did open are closed and the first failed bucket's error is
    raised, so a table that cannot open holds no file. ``open_bucket`` must not open a table
    (the threads are shared: a nested open could wait for itself)."""
    if not parallel or buckets < 2:
        results: list[tuple[LogTablet, KvTablet | None]] = []
        try:
            for bucket in range(buckets):
                results.append(open_bucket(bucket))
        except BaseException:
            _close_opened(results)
            raise
        return results
    pool = _bucket_opener()
    futures = [pool.submit(open_bucket, bucket) for bucket in range(buckets)]
    wait(futures)
    failed = next((f.exception() for f in futures if f.exception() is not None), None)
    if failed is not None:
        _close_opened([f.result() for f in futures if f.exception() is None])
        raise failed
    return [f.result() for f in futures]


def _close_opened(opened: Sequence[tuple[LogTablet, KvTablet | None]]) -> None:
    for log, kv in opened:
        if kv is not None:
            kv.close()
        log.close()


class Table(TableValidation, TableWrites, TableReads, TableChangelog, TableApi):
    """A handle on one table of this server: writes, lookups, scans and changelog reads."""

    def __init__(self, descriptor: TableDescriptor, directory: Path, *, fsync: bool = True,
                 clock: Callable[[], int] = system_clock_ms, remote: RemoteTable | None = None,
                 leadership: Leadership = SOLO) -> None:
        """Open the table's buckets; ``clock`` (milliseconds) times writes for writer expiry.
        ``remote``: the table in remote storage (``remote.data.dir``): each bucket's log reads its
        uploaded segments from there, and a missing bucket directory is rebuilt from there.
        ``leadership``: every bucket's replica role until a replica manager sets it (a single
        server's buckets are solo leaders; a cluster member's wait for the cluster's decision)."""
        self.descriptor = descriptor
        self.path = descriptor.path
        self.schema = descriptor.schema
        self.directory = directory
        self.table_id = directory.name  # a cluster's store sets the cluster's id (Store.table)
        self._lock = threading.RLock()
        self._projections = Projections(self.schema)
        self._point_plan: tuple | None = None  # TableReads._point_key's, of self.descriptor
        self._lookup_rows_memo: tuple | None = None  # TableReads._lookup_rows's, of self.schema
        self._written = threading.Condition()
        self._round_robin = itertools.count()
        # The buckets a batch without bucket key may go to (None: all); in a cluster, those this
        # server leads (flightstore.cluster.table).
        self.round_robin_buckets: Sequence[int] | None = None
        log_schemas = _log_schemas(descriptor)
        ttl = descriptor.option("table.log.ttl")
        rebuilt: dict[int, Any] = {}  # buckets rebuilt from remote storage (their directory was gone)
        tiers: dict[int, Any] = {}  # each bucket's remote tier (None without remote storage)
        for bucket in range(descriptor.num_buckets):  # (remote storage is asked from this thread only)
            label = f"table {self.path} bucket {bucket}"
            tiers[bucket] = tier = None if remote is None else remote.bucket(bucket, label,
                                                                             directory / f"bucket-{bucket}")
            if tier is not None and not remote.fresh:
                rebuilt[bucket] = restore_missing_bucket(tier, descriptor, directory / f"bucket-{bucket}",
                                                         fsync=fsync)

        def open_bucket(bucket: int) -> tuple[LogTablet, KvTablet | None]:
            log = LogTablet(
                directory / f"bucket-{bucket}" / "log", log_schemas[descriptor.version],
                compression=descriptor.option("table.log.arrow.compression.type"),
                segment_bytes=descriptor.option("table.log.segment.bytes"),
                statistics_columns=descriptor.statistics_columns, ttl_ms=ttl, fsync=fsync,
                schema_version=descriptor.version, past_schemas=log_schemas,
                label=f"table {self.path} bucket {bucket}")
            try:
                if tiers[bucket] is not None:
                    log.attach_remote(tiers[bucket])
                if not descriptor.has_primary_key:
                    return log, None
                return log, KvTablet(directory / f"bucket-{bucket}" / "kv", descriptor, log, fsync=fsync,
                                     bucket=bucket)
            except BaseException:
                log.close()
                raise

        opened = _open_all(open_bucket, descriptor.num_buckets, parallel=descriptor.has_primary_key)
        self.logs: list[LogTablet] = [log for log, _ in opened]
        self.kvs: list[KvTablet] = [kv for _, kv in opened if kv is not None]
        # One replica per bucket: its log and KV, its role and high watermark (flightstore.replica).
        self.replicas = [Replica(log, self.kvs[b] if self.kvs else None, b, fsync=fsync, leadership=leadership)
                         for b, log in enumerate(self.logs)]
        for bucket, restored in rebuilt.items():
            self.replicas[bucket].rebuilt = restored
        self.upkeep = TableUpkeep(directory, self.logs, self.kvs, descriptor.option("kv.snapshot.interval"))
        # Per-bucket offsets below which the lake holds the log's records (set by the lake's
        # tierer from its last committed snapshot); see enforce_retention.
        self.retention_floor: dict[int, int] | None = None
        # Offsets union reads in progress still read the log from (hold_log_from): retention keeps
        # them, so a read planned on the lake's previous snapshot never finds its log tail deleted.
        self._log_holds: list[dict[int, int]] = []
        self._retention_lock = threading.Lock()
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


    def enforce_retention(self, now_ms: int | None = None) -> int:
        """Delete log segments older than ``table.log.ttl``; returns rows dropped.

        A primary-key table keeps its log above its oldest retained KV snapshot (see
        :mod:`flightstore.upkeep`). On a datalake-enabled table only records below
        :attr:`retention_floor` (tiered) may go; while no tierer has told the floor, nothing is
        deleted.
        """
        with self._retention_lock:  # no union read starts holding offsets while segments go
            lake_floor = None
            if self.descriptor.option("table.datalake.enabled"):
                lake_floor = dict(self.retention_floor or self.start_offsets())
                for held in self._log_holds:
                    for bucket, offset in held.items():
                        if bucket in lake_floor:
                            lake_floor[bucket] = min(lake_floor[bucket], offset)
            return self.upkeep.enforce_retention(now_ms, lake_floor)

    def hold_log_from(self, offsets: Mapping[int, int]) -> Callable[[], None] | None:
        """Keep retention from deleting this table's log at or above ``offsets`` (per bucket: a
        union read's split) until the returned release is called; None when a bucket's log already
        starts above its offset (the read must be planned again)."""
        held = {int(b): int(o) for b, o in offsets.items()}
        with self._retention_lock:
            if any(b < len(self.logs) and o < self.logs[b].start_offset for b, o in held.items()):
                return None
            self._log_holds.append(held)

        def release() -> None:
            with self._retention_lock:
                self._log_holds[:] = [h for h in self._log_holds if h is not held]
        return release

    def snapshot(self, *, force: bool = False, stop: Any = None,
                 buckets: Sequence[int] | None = None) -> dict[int, SnapshotInfo | None]:
        """Take a KV snapshot of every bucket (or of ``buckets``: the ones a cluster leader
        leads) now; see :meth:`TableUpkeep.snapshot`."""
        self._require_pk("a KV snapshot")
        return self.upkeep.snapshot(force=force, stop=stop, buckets=buckets)

    def disk_usage(self, buckets: Sequence[int] | None = None) -> dict[str, int]:
        """Bytes on disk of every bucket (or of ``buckets``): ``kv``, ``snapshots``, ``log`` and
        ``total`` (see :mod:`flightstore.upkeep`)."""
        return self.upkeep.disk_usage(buckets)


    def release(self, writer_id: str) -> None:
        self.ownership.release(writer_id)

    def partition_stats(self) -> list[tuple[Any, int]]:
        return []

    def partial_aggregates(self, buckets: Sequence[int], local: Any, remote: Mapping[str, Any]) -> list[pa.Table]:
        return [local(self, list(buckets))] if buckets else []

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
        try:  # remote.data.dir: uploaded segments and snapshots (flightstore.remote)
            self.remote: RemoteStorage | None = RemoteStorage.from_options(self.options, self.data_dir)
        except BaseException:
            self._unlock()
            raise
        self._tables: dict[TablePath, Table] = {}
        # Closed tables: when retention may next find something of theirs to delete (_may_expire).
        self._closed_expiry: dict[TablePath, tuple[tuple[int, int], int | None]] = {}
        self._created: set[TablePath] = set()  # created by this Store and not opened yet
        self._gates: dict[TablePath, threading.Lock] = {}  # one per table: its open or drop
        self._lock = threading.RLock()  # the two dicts above; never held while a table opens
        self._closed = False
        # The replica role of a bucket of a table opened here, until a replica manager sets it.
        self.initial_leadership: Leadership = SOLO

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
                dropped = self.catalog.drop_database(name, if_exists, cascade)
        if self.remote is not None:  # their remote data goes with them
            self.remote.drop_tables(name, [directory.name for directory in dropped])

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
        if created:  # new: remote storage cannot hold any of it (its id is new)
            with self._lock:
                self._created.add(descriptor.path)
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
        kept = {p.id for p in new.partitions}
        dropped = [p.id for p in old.partitions if p.id not in kept]
        if dropped and self.remote is not None:  # their remote data goes with them
            self.remote.drop_partitions(new, self.catalog.table_dir(new.path).name, dropped)
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
            dropped = self.catalog.drop_table(path, if_exists)
        if self.remote is not None and dropped is not None:  # its remote data goes with it
            self.remote.drop_tables(path.database, [dropped.name])

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
            with self._lock:
                fresh = path in self._created
                self._created.discard(path)
            remote = None if self.remote is None else self.remote.table(
                descriptor, self._remote_table_id(path, directory), fresh=fresh)
            if descriptor.is_partitioned:
                from flightstore.partitioned import PartitionedTable
                table = PartitionedTable(descriptor, directory, fsync=self.fsync, clock=self.clock,
                                         create_partitions=self._create_partitions, remote=remote,
                                         leadership=self.initial_leadership)
            else:
                table = Table(descriptor, directory, fsync=self.fsync, clock=self.clock, remote=remote,
                              leadership=self.initial_leadership)
            table.table_id = self._remote_table_id(path, directory)  # a cluster: the cluster's id
            with self._lock:
                closed = self._closed
                if not closed:
                    self._tables[path] = table
                    self._closed_expiry.pop(path, None)  # its files change from now on
            if closed:  # the store closed while this table opened
                table.close()
                self._check_open()
            return table

    def _remote_table_id(self, path: TablePath, directory: Path) -> str:
        """The id of a table's data in remote storage and in the lake (``Table.table_id``): its
        directory's (a cluster: the cluster's table id, the same on every replica)."""
        return directory.name

    def local_table(self, path: TablePath | str) -> Table:
        """This data directory's own table (its storage: logs, KVs, replicas); on a single server
        the same as :meth:`table`."""
        return Store.table(self, path)

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
        checked_at = int(time.time() * 1000) if now_ms is None else int(now_ms)  # the logs' retention clock
        for path in self.catalog.all_tables():
            try:
                with self._lock:
                    opened = path in self._tables
                if not opened and not self._may_expire(path, checked_at):
                    continue  # a closed table with nothing past its TTL is not opened for nothing
                table = self.local_table(path)
                dropped += table.enforce_retention(now_ms)
                table.expire_writers(now_ms)
            except FlightstoreError:
                continue
        return dropped

    def _may_expire(self, path: TablePath, now_ms: int) -> bool:
        """Whether retention may delete anything of a table that is not open, from its files (see
        :func:`~flightstore.log.segment.expiry_due`); with remote storage always (its uploaded
        segments are older than the local ones). Its writers' expiry waits until it is opened:
        only an open table holds them.

        A closed table's files do not change until it is opened, so the time its files name is
        kept (per catalog version and TTL: any DDL reads them again) and the next sweeps compare
        the clock with it instead of listing 16 directories per table each time."""
        if self.remote is not None:
            return True
        ttl_ms = self.catalog.get_table(path).option("table.log.ttl")
        if ttl_ms is None:
            return False
        key = (self.catalog.version, int(ttl_ms))
        with self._lock:
            known = self._closed_expiry.get(path)
        if known is None or known[0] != key:
            directory = self.catalog.table_dir(path)
            logs = [*directory.glob("bucket-*/log"), *directory.glob("*/bucket-*/log")]  # partitions: one level down
            dues = [due for due in (expiry_due(log, int(ttl_ms)) for log in logs) if due is not None]
            known = (key, min(dues, default=None))
            with self._lock:
                if path not in self._tables:  # opened meanwhile: its files are the open table's now
                    self._closed_expiry[path] = known
        return known[1] is not None and known[1] < now_ms

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
