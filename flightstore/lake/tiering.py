"""One tiering round: a table's log since the last commit -> one Iceberg snapshot.

A round

1. reloads the lake table and reads the tiered offset of every bucket from its last committed
   tiering snapshot (:mod:`flightstore.lake.offsets`); buckets it names that the table no longer
   has belong to dropped partitions: their rows are deleted from the lake in the round's commit
   (:mod:`flightstore.lake.drops`);
2. reads each bucket's log from there up to the end offset it saw at the start (at most
   ``max_rows`` rows in all, so memory stays bounded; a longer backlog takes several rounds);
3. log tables: appends those rows (the table's columns + ``__bucket``, ``__offset``,
   ``__timestamp``, in offset order); primary-key tables: a bucket the lake does not know yet
   enters with its rows at the end offset (KV snapshot image + changelog), a known bucket's
   changelog is folded into upserts and deletes (:mod:`flightstore.lake.changes`): the changed
   keys' old rows are deleted by one position delete file per changed bucket and the upserts
   appended (merge-on-read, :mod:`flightstore.lake.deletes`; a bucket past its delete ratio, or a
   format-version 1 lake table, is rewritten copy-on-write instead);
4. commits ONE snapshot whose summary records the new offset of every bucket (one catalog commit:
   a round that also deletes a dropped partition's rows commits that delete snapshot first, in
   the same atomic swap, recording the other buckets' offsets as they were).

The commit is the only step with an effect anyone sees: it swaps the data files and the offsets in
together, and it asserts that the table still is at the snapshot the round started from. A round
that dies anywhere (before writing, after writing data files, after committing) is therefore
redone from the last committed offsets by the next one: no row twice, none missing. Data files of
a round that died before its commit are orphans no snapshot references.

The same function serves the server's background tierer and the Spark tiering job
(``flightstore_spark.pipelines.tiering``). Buckets are numbered table-wide, so partitioned tables
tier like any other (their lake partitions by the partition columns first).
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from pyiceberg.manifest import DataFileContent
from pyiceberg.table import Table as IcebergTable
from pyiceberg.table import Transaction

from flightstore import changetype
from flightstore.errors import CorruptData, DataLoss
from flightstore.lake.catalog import lake_failures
from flightstore.lake.changes import (
    fold_changes,
    plan_rewrite,
    snapshot_rows,
    sort_for_files,
    stage_overwrite,
)
from flightstore.lake.deletes import merge_on_read, plan_deletes, stage_row_delta, write_position_deletes
from flightstore.lake.drops import dropped_buckets, stage_drops
from flightstore.lake.integrity import FileCheck, record_checks, write_data_files
from flightstore.lake.layout import lake_batch, lake_schema
from flightstore.lake.offsets import OFFSETS_PROPERTY, committed_offsets, encode_offsets, tiering_snapshots
from flightstore.log import LogTablet
from flightstore.schema import TablePath
from flightstore.store import Table

__all__ = ["PHASES", "RoundResult", "StoreSource", "bucket_logs", "hold_untiered", "read_backlog", "tier_log_round",
           "tier_round"]

# Points of a round a hook is called at (tests kill the process there).
PHASES = ("before-write", "after-write", "after-commit")


@dataclass(frozen=True)
class RoundResult:
    """What one round did: ``rows`` tiered (rows appended, plus keys deleted on a primary-key
    table), ``committed`` when it committed a snapshot; the offsets it started from and reached;
    ``snapshot_id``/``committed_at_ms`` of the lake's latest tiering snapshot after the round (None
    before the first); ``backlog_left`` when ``max_rows`` stopped it short. ``files_removed`` and
    ``bytes_written`` say what a primary-key round rewrote (``bytes_written``: data files added).
    ``dropped_buckets``: buckets of dropped partitions whose rows the round deleted from the lake."""

    path: TablePath
    rows: int
    start_offsets: dict[int, int]
    end_offsets: dict[int, int]
    committed: bool = False
    snapshot_id: int | None = None
    committed_at_ms: int | None = None
    seconds: float = 0.0
    backlog_left: bool = False
    deleted: int = 0
    files_removed: int = 0
    bytes_written: int = 0
    delete_files: int = 0
    position_deletes: int = 0
    compacted: tuple[int, ...] = ()
    dropped_buckets: tuple[int, ...] = ()


def bucket_logs(table: Table) -> dict[int, LogTablet]:
    """Every bucket's log by table-wide bucket number (partitioned tables number every partition's
    buckets)."""
    return {bucket: tablets[0] for bucket, tablets in table.tablets().items()}


def hold_untiered(table: Table, offsets: Mapping[int, int]) -> None:
    """Tell ``table`` (each partition of a partitioned table) which records the lake holds, so log
    retention may delete those and no other (:attr:`~flightstore.store.Table.retention_floor`)."""
    units = getattr(table, "units", None)
    if units is None:
        table.retention_floor = {b: offsets.get(b, log.start_offset) for b, log in enumerate(table.logs)}
        return
    from flightstore.partitioning import bucket_id
    for pid, unit in list(units.items()):
        unit.retention_floor = {b: offsets.get(bucket_id(pid, b, table.num_buckets), log.start_offset)
                                for b, log in enumerate(unit.logs)}


def _read_changes(table: Table, logs: Mapping[int, LogTablet], start: Mapping[int, int],
                  end: Mapping[int, int], max_rows: int | None
                  ) -> tuple[pa.Table, np.ndarray | None, dict[int, int]]:
    schema = lake_schema(table.descriptor)
    batches: list[pa.RecordBatch] = []
    kinds: list[np.ndarray] = []
    reached = dict(start)
    budget = max_rows
    for bucket, log in sorted(logs.items()):
        begin, stop = start[bucket], end[bucket]
        if begin < log.start_offset:
            raise DataLoss(f"table {table.path} bucket {bucket}: log records [{begin}, {log.start_offset}) "
                           "were deleted before they were tiered into the lake")
        if begin > log.end_offset:
            raise CorruptData(f"table {table.path} bucket {bucket}: the lake holds offsets up to {begin} "
                              f"but the log ends at {log.end_offset}")
        if begin >= stop or (budget is not None and budget <= 0):
            continue
        for record in log.read(begin, to_offset=stop, max_rows=budget):
            batch = lake_batch(record, bucket, schema)
            batches.append(batch)
            if table.has_primary_key:
                kinds.append(record.batch.column(changetype.CHANGE_TYPE_COLUMN).to_numpy(zero_copy_only=False))
            reached[bucket] = min(record.next_offset, stop)
            if budget is not None:
                budget -= batch.num_rows
    codes = (np.concatenate(kinds) if kinds else np.empty(0, np.int8)) if table.has_primary_key else None
    return pa.Table.from_batches(batches, schema=schema), codes, reached


def read_backlog(table: Table, start: dict[int, int], end: dict[int, int],
                 max_rows: int | None) -> tuple[pa.Table, dict[int, int]]:
    """The lake rows of every bucket's log in ``[start, end)``, at most about ``max_rows``.

    Returns the rows (bucket by bucket, each in offset order) and the offset each bucket was read
    up to. A bucket whose ``start`` lies below the log's start offset lost untiered records:
    :class:`DataLoss`; a ``start`` past the log's end means the lake is ahead of the log:
    :class:`CorruptData`. Neither happens while the retention guard holds.
    """
    rows, _, reached = _read_changes(table, bucket_logs(table), start, end, max_rows)
    return rows, reached


def _last_change_ms(log: LogTablet, at: int) -> int:
    """The append time of the record holding offset ``at - 1`` (now when it is not held)."""
    if log.start_offset < at:
        record = next(iter(log.read(at - 1, columns=[], max_rows=1)), None)
        if record is not None:
            return record.timestamp_ms
    return int(time.time() * 1000)


class StoreSource:
    """What a round reads of a table held by this process's :class:`~flightstore.store.Store`.

    A round needs only: the table's ``path`` and ``descriptor``, per-bucket ``offsets()`` (start,
    end), ``read_changes`` (lake rows of the changelog, with change kinds on a primary-key table)
    and ``rows_at`` (a bucket's rows at an offset, as lake rows). The Spark tiering job reads the
    same through Flight (:class:`flightstore.lake.remote.FlightSource`).
    """

    def __init__(self, table: Table) -> None:
        self.table = table
        self.path = table.path
        self.descriptor = table.descriptor
        self._logs = bucket_logs(table)

    def offsets(self) -> tuple[dict[int, int], dict[int, int]]:
        return ({b: log.start_offset for b, log in self._logs.items()},
                {b: log.high_watermark for b, log in self._logs.items()})

    def read_changes(self, start: Mapping[int, int], end: Mapping[int, int], max_rows: int | None
                     ) -> tuple[pa.Table, np.ndarray | None, dict[int, int]]:
        return _read_changes(self.table, self._logs, start, end, max_rows)

    def rows_at(self, bucket: int, at: int, schema: pa.Schema) -> list[pa.RecordBatch]:
        return snapshot_rows(self.table.rows_at(bucket, at), bucket, at,
                             _last_change_ms(self._logs[bucket], at), schema)


def tier_round(table: Table | StoreSource, lake_table: IcebergTable, *, max_rows: int | None = None,
               before_commit: Callable[[], None] | None = None,
               hook: Callable[[str], None] | None = None,
               appended: Callable[[IcebergTable, pa.Table], None] | None = None) -> RoundResult:
    """Run one round for ``table`` (a store's table, or any source like :class:`StoreSource`) into
    its lake table; see the module docstring.

    ``before_commit`` runs right before the catalog commit (the tierer renews its lease there and
    raises if it lost it); ``hook(phase)`` is called at each of :data:`PHASES`; on a log table,
    ``appended(lake_table, rows)`` after the commit, with the rows its snapshot appended (the
    tierer's write-through to the read cache). Lake failures raise
    :class:`~flightstore.errors.LakeUnavailable`; nothing is committed then.
    """
    began = time.monotonic()
    source = StoreSource(table) if isinstance(table, Table) else table
    with lake_failures(f"reading the lake state of {source.path}"):
        lake_table = lake_table.refresh()
    recorded = committed_offsets(lake_table)
    schema = lake_schema(source.descriptor)
    log_start, end = source.offsets()
    dropped = dropped_buckets(source.descriptor, recorded, log_start)  # their partitions were dropped
    recorded = {b: offset for b, offset in recorded.items() if b not in dropped}
    start = {bucket: recorded.get(bucket, offset) for bucket, offset in log_start.items()}
    primary_key = list(source.descriptor.primary_key)
    if not primary_key and hasattr(source, "write_changes"):  # its bucket readers write the data files
        return _tier_written(source, lake_table, recorded, dropped, start, end, max_rows, began,
                             before_commit, hook)
    # A primary-key bucket the lake does not hold yet enters with its rows at its end offset.
    # (Its log may start at its end: the KV snapshot holds the rows then.)
    entering = {b: end[b] for b in end if primary_key and b not in recorded and end[b] > 0}
    read_from = {**start, **entering}
    changes, kinds, reached = source.read_changes(read_from, end, max_rows)
    backlog_left = any(reached[b] < end[b] for b in end)
    if not entering and not dropped and all(reached[b] == start[b] for b in end):
        latest = next(iter(tiering_snapshots(lake_table)), None)
        return RoundResult(source.path, 0, start, start,
                           snapshot_id=latest.snapshot_id if latest is not None else None,
                           committed_at_ms=latest.timestamp_ms if latest is not None else None,
                           seconds=time.monotonic() - began)
    properties = {OFFSETS_PROPERTY: encode_offsets({**recorded, **reached})}
    if hook is not None:
        hook("before-write")
    with lake_failures(f"writing the lake files of {source.path}"):
        if primary_key:
            entered = [batch for b, at in entering.items() for batch in source.rows_at(b, at, schema)]
            folded = fold_changes(changes, kinds, primary_key)
            if merge_on_read(lake_table):
                ratio = source.descriptor.option("table.datalake.delete-compaction-ratio")
                plan = plan_deletes(lake_table, folded.touched, folded.upserts, primary_key, schema, ratio)
                kept, removed = plan.kept, plan.removed
            else:
                rewrite = plan_rewrite(lake_table, folded.touched, primary_key, schema)
                plan, kept, removed = None, rewrite.kept, rewrite.removed
            rows = sort_for_files(pa.concat_tables([pa.Table.from_batches(entered, schema=schema), kept,
                                                    folded.upserts]))
        else:
            rows, plan, kept, removed, folded = changes, None, None, [], None
        transaction = lake_table.transaction()
        stage_drops(transaction, lake_table, dropped, {OFFSETS_PROPERTY: encode_offsets(recorded)})
        checks: list[FileCheck] = []
        if plan is not None and (plan.deletes or removed):
            commit_uuid = uuid.uuid4()
            added, checks = write_data_files(transaction.table_metadata, lake_table.io, rows, commit_uuid,
                                             itertools.count(0))
            for bucket, (positions, partition, spec_id) in sorted(plan.deletes.items()):
                delete_file, check = write_position_deletes(lake_table, positions, partition, spec_id,
                                                            commit_uuid, bucket)
                added.append(delete_file)
                checks.append(check)
            stage_row_delta(transaction, added, removed, properties, commit_uuid)
        elif removed:
            checks = stage_overwrite(transaction, removed, rows, properties)
        else:
            with transaction.update_snapshot(snapshot_properties=properties).fast_append() as append:
                added, checks = write_data_files(transaction.table_metadata, lake_table.io, rows,
                                                 append.commit_uuid)
                for data_file in added:
                    append.append_data_file(data_file)
        record_checks(lake_table, checks)  # before the commit: a committed file always has its check
    committed = _commit(source, transaction, before_commit, hook)
    snapshot = committed.current_snapshot()
    if appended is not None and not primary_key:
        appended(committed, rows)
    summary = snapshot.summary.additional_properties if snapshot is not None and snapshot.summary else {}
    deleted = folded.deleted if folded is not None else 0
    tiered = rows.num_rows - (kept.num_rows if kept is not None else 0) + deleted
    return RoundResult(source.path, tiered, start, reached, committed=True,
                       snapshot_id=snapshot.snapshot_id if snapshot is not None else None,
                       committed_at_ms=snapshot.timestamp_ms if snapshot is not None else None,
                       seconds=time.monotonic() - began, backlog_left=backlog_left, deleted=deleted,
                       files_removed=sum(f.content == DataFileContent.DATA for f in removed),
                       bytes_written=int(summary.get("added-files-size", 0)),
                       delete_files=int(summary.get("added-position-delete-files", 0)),
                       position_deletes=int(summary.get("added-position-deletes", 0)),
                       compacted=tuple(plan.compacted) if plan is not None else (),
                       dropped_buckets=tuple(dropped))


def _tier_written(source, lake_table: IcebergTable, recorded: dict[int, int], dropped: list[int],
                  start: dict[int, int], end: dict[int, int], max_rows: int | None, began: float,
                  before_commit: Callable[[], None] | None,
                  hook: Callable[[str], None] | None) -> RoundResult:
    """A log table's round whose data files are written where each bucket is read (the Spark
    job's executors: ``source.write_changes``); this process commits their metadata, with the
    offsets, in one snapshot. A round that never commits leaves its files orphaned, unreferenced."""
    if not dropped and all(start[b] >= end[b] for b in end):
        latest = next(iter(tiering_snapshots(lake_table)), None)
        return RoundResult(source.path, 0, start, start,
                           snapshot_id=latest.snapshot_id if latest is not None else None,
                           committed_at_ms=latest.timestamp_ms if latest is not None else None,
                           seconds=time.monotonic() - began)
    if hook is not None:
        hook("before-write")
    with lake_failures(f"writing the lake files of {source.path}"):
        files, checks, reached, rows = source.write_changes(lake_table, start, end, max_rows)
        record_checks(lake_table, checks)  # before the commit: a committed file always has its check
        transaction = lake_table.transaction()
        stage_drops(transaction, lake_table, dropped, {OFFSETS_PROPERTY: encode_offsets(recorded)})
        properties = {OFFSETS_PROPERTY: encode_offsets({**recorded, **reached})}
        with transaction.update_snapshot(snapshot_properties=properties).fast_append() as append:
            for data_file in files:
                append.append_data_file(data_file)
    committed = _commit(source, transaction, before_commit, hook)
    snapshot = committed.current_snapshot()
    return RoundResult(source.path, rows, start, reached, committed=True,
                       snapshot_id=snapshot.snapshot_id if snapshot is not None else None,
                       committed_at_ms=snapshot.timestamp_ms if snapshot is not None else None,
                       seconds=time.monotonic() - began, backlog_left=any(reached[b] < end[b] for b in end),
                       bytes_written=sum(f.file_size_in_bytes for f in files), dropped_buckets=tuple(dropped))


def _commit(source, transaction: Transaction, before_commit: Callable[[], None] | None,
            hook: Callable[[str], None] | None) -> IcebergTable:
    """Commit a round's staged ``transaction`` (its files are written): the ``after-write`` hook,
    ``before_commit`` (the lease renewal), the one catalog commit, the ``after-commit`` hook."""
    if hook is not None:
        hook("after-write")
    if before_commit is not None:
        before_commit()
    with lake_failures(f"committing the lake snapshot of {source.path}"):
        committed = transaction.commit_transaction()
    if hook is not None:
        hook("after-commit")
    return committed


tier_log_round = tier_round  # the phase-1 name
