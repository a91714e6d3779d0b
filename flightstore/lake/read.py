"""Reading the lake: a table's tiered rows, as of now or of a past snapshot, pruned and filtered.

Filters are flightstore :mod:`~flightstore.expressions` predicates translated to pyiceberg
expressions, so pyiceberg prunes whole data files by partition (a bucket-key equality reads one
bucket's files) and by column statistics before it reads anything, then filters rows exactly.
Only the requested columns are read from the Parquet files. Rows come back with the table's Arrow
types (Iceberg stores timestamps as microseconds and strings as large strings; they are cast back).

:func:`snapshot_batches` streams a snapshot for the union read: pyiceberg plans (prunes) the data
files, then - when no file has delete files, as in a log table's append-only lake - they are
checked and decoded by :mod:`flightstore.lake.files` (the read cache included). Otherwise
pyiceberg reads them (deletes applied), once every data and delete file it opens is checked.
Every read of a lake file checks it first (size and whole-file CRC,
:mod:`flightstore.lake.integrity`): a damaged file is DATA_LOSS naming it, never a changed value
(the union read falls back to the log instead when the log still holds the file's rows).

A lake file that is gone while its table's metadata is still there because the read's snapshot
was expired by the lake upkeep meanwhile (:mod:`flightstore.lake.upkeep`) raises
:class:`~flightstore.errors.LakeFileMissing`, never a short answer.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyiceberg import expressions as ice
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.table import Table as IcebergTable
from pyiceberg.table.snapshots import Snapshot

from flightstore import expressions as fs
from flightstore.batches import limited
from flightstore.errors import InvalidInput, NotFound, TableNotFound
from flightstore.lake.cache import ReadCache
from flightstore.lake.catalog import LakeCatalog, lake_failures
from flightstore.lake.files import (
    cache_appended,
    cached_schema,
    check_intact,
    missing_files,
    read_data_files,
    read_live_rows,
    task_batches,
)
from flightstore.lake.integrity import DamageHandler
from flightstore.lake.layout import table_types
from flightstore.lake.offsets import snapshot_offsets, tiering_snapshots
from flightstore.schema import TableDescriptor

__all__ = [
    "LakeSnapshot",
    "cache_appended",
    "cached_schema",
    "lake_batches",
    "lake_snapshots",
    "plan_lake_files",
    "read_data_files",
    "read_lake",
    "read_live_rows",
    "resolve_snapshot",
    "scan_snapshot",
    "snapshot_batches",
    "to_iceberg",
]

_COMPARISONS = {"=": ice.EqualTo, "!=": ice.NotEqualTo, "<": ice.LessThan, "<=": ice.LessThanOrEqual,
                ">": ice.GreaterThan, ">=": ice.GreaterThanOrEqual}


def to_iceberg(predicate: fs.Predicate | None) -> ice.BooleanExpression:
    """The pyiceberg expression of a bound flightstore predicate (SQL semantics: a comparison
    with NULL is never true)."""
    if predicate is None or isinstance(predicate, fs.AlwaysTrue):
        return ice.AlwaysTrue()
    if isinstance(predicate, fs.Comparison):
        if predicate.value is None:
            return ice.AlwaysFalse()
        return _COMPARISONS[predicate.op](predicate.column, predicate.value)
    if isinstance(predicate, fs.In):
        values = [v for v in predicate.values if v is not None]
        return ice.In(predicate.column, values) if values else ice.AlwaysFalse()
    if isinstance(predicate, fs.IsNull):
        return ice.IsNull(predicate.column)
    if isinstance(predicate, fs.IsNotNull):
        return ice.NotNull(predicate.column)
    if isinstance(predicate, fs.StartsWith):
        return ice.StartsWith(predicate.column, predicate.prefix)
    if isinstance(predicate, fs.And):
        return ice.And(to_iceberg(predicate.left), to_iceberg(predicate.right))
    if isinstance(predicate, fs.Or):
        return ice.Or(to_iceberg(predicate.left), to_iceberg(predicate.right))
    if isinstance(predicate, fs.Not):
        return ice.Not(to_iceberg(predicate.child))
    raise InvalidInput(f"cannot push {type(predicate).__name__} filters to the lake")


def resolve_snapshot(lake_table: IcebergTable, snapshot_id: int | None = None,
                     as_of_ms: int | None = None) -> Snapshot | None:
    """The snapshot a read sees: ``snapshot_id``, else the one current at ``as_of_ms`` (wall clock
    ms), else the current one (None for a lake table with no commit yet)."""
    if snapshot_id is not None and as_of_ms is not None:
        raise InvalidInput("give a snapshot id or a timestamp to read the lake as of, not both")
    if snapshot_id is not None:
        snapshot = lake_table.snapshot_by_id(int(snapshot_id))
        if snapshot is None:
            raise NotFound(f"the lake table {'.'.join(lake_table.name())} has no snapshot {snapshot_id}")
        return snapshot
    if as_of_ms is not None:
        snapshot = lake_table.snapshot_as_of_timestamp(int(as_of_ms))
        if snapshot is None:
            raise NotFound(f"the lake table {'.'.join(lake_table.name())} has no snapshot at or before "
                           f"{as_of_ms} ms")
        return snapshot
    return lake_table.current_snapshot()


def snapshot_batches(lake_table: IcebergTable, snapshot: Snapshot, descriptor: TableDescriptor,
                     columns: Sequence[str], filter: fs.Predicate | None = None,
                     limit: int | None = None, cache: ReadCache | None = None,
                     damage: DamageHandler | None = None) -> Iterator[pa.RecordBatch]:
    """Stream ``columns`` of the rows of ``snapshot`` matching ``filter`` (bound to
    :func:`table_types`), in the table's types, at most ``limit`` rows; see the module docstring.
    Every data file is checked before it is decoded (:mod:`flightstore.lake.files`); a damaged
    one is offered to ``damage`` (the union read's fall-back to the log) or is DATA_LOSS
    naming it. With a ``cache``, data files it holds are read from it and the others put in it as
    they are read (:mod:`flightstore.lake.cache`). Lake failures raise LakeUnavailable (also
    while streaming), a file of an expired snapshot LakeFileMissing."""
    with missing_files(f"reading the lake table of {descriptor.path}", lake_table, snapshot):
        yield from _snapshot_batches(lake_table, snapshot, descriptor, columns, filter, limit, cache, damage)


def _snapshot_batches(lake_table: IcebergTable, snapshot: Snapshot, descriptor: TableDescriptor,
                      columns: Sequence[str], filter: fs.Predicate | None, limit: int | None,
                      cache: ReadCache | None, damage: DamageHandler | None) -> Iterator[pa.RecordBatch]:
    what = f"reading the lake table of {descriptor.path}"
    types = table_types(descriptor)
    needed = list(dict.fromkeys([*columns, *(sorted(filter.columns()) if filter is not None else [])]))
    with lake_failures(what):
        scan = scan_snapshot(lake_table, snapshot, needed, filter, limit)
        tasks = list(scan.plan_files())
    if not isinstance(lake_table.io, PyArrowFileIO) or any(task.delete_files for task in tasks):
        check_intact(lake_table, snapshot, _task_files(tasks), descriptor.path, what)
        with lake_failures(what):
            reader = scan.to_arrow_batch_reader()
        source = _batches(reader, what)
    else:
        source = task_batches(lake_table, snapshot, tasks, descriptor, needed, what, cache=cache,
                              damage=damage)
    yield from limited(_conformed(source, needed, columns, types, filter), limit)


def _task_files(tasks: Sequence) -> list:
    """The data files and delete files of ``tasks`` (each once)."""
    files = {}
    for task in tasks:
        files.setdefault(task.file.file_path, task.file)
        for delete_file in task.delete_files:
            files.setdefault(delete_file.file_path, delete_file)
    return list(files.values())


def _conformed(source: Iterator[pa.RecordBatch], needed: list[str], columns: Sequence[str], types: pa.Schema,
               filter: fs.Predicate | None) -> Iterator[pa.RecordBatch]:
    """``source``'s batches in the table's ``types``, filtered exactly by ``filter``, cut to ``columns``."""
    row_filter = filter.to_arrow() if filter is not None else None
    typed = pa.schema([types.field(c) for c in needed])
    for batch in source:
        if not batch.schema.equals(typed):  # the cache's batches are typed already
            batch = batch.select(needed).cast(typed)
        if row_filter is not None:
            batch = pa.Table.from_batches([batch]).filter(row_filter).combine_chunks()
            batch = batch.to_batches()[0] if batch.num_rows else None
            if batch is None:
                continue
        yield batch.select(columns) if needed != list(columns) else batch


def _batches(reader: pa.RecordBatchReader, what: str) -> Iterator[pa.RecordBatch]:
    while True:
        with lake_failures(what):
            try:
                batch = reader.read_next_batch()
            except StopIteration:
                return
        yield batch


def _output_schema(descriptor: TableDescriptor, columns: Sequence[str] | None) -> pa.Schema:
    schema = table_types(descriptor)
    if columns is None:
        return schema
    unknown = [c for c in columns if c not in schema.names]
    if unknown:
        raise InvalidInput(f"unknown column(s) {', '.join(unknown)}; the lake table of {descriptor.path} "
                           f"has {', '.join(schema.names)}")
    return pa.schema([schema.field(c) for c in columns])


def scan_snapshot(lake_table: IcebergTable, snapshot: Snapshot | None, columns: Sequence[str],
                  bound: fs.Predicate | None, limit: int | None = None):
    """The pyiceberg scan of ``columns`` of ``snapshot`` (None: the current one) filtered by
    ``bound`` (a predicate bound to :func:`~flightstore.lake.layout.table_types`): what partition
    and statistics pruning leave is read, rows filtered exactly."""
    return lake_table.scan(row_filter=to_iceberg(bound), selected_fields=tuple(columns), limit=limit,
                           snapshot_id=snapshot.snapshot_id if snapshot is not None else None)


def _scan(lake_table: IcebergTable, descriptor: TableDescriptor, columns: Sequence[str] | None,
          filter: fs.Predicate | None, snapshot: Snapshot | None, schema: pa.Schema,
          limit: int | None = None):
    bound = filter.bind(table_types(descriptor)) if filter is not None else None
    return scan_snapshot(lake_table, snapshot, schema.names, bound, limit)


def read_lake(catalog: LakeCatalog, descriptor: TableDescriptor, *, columns: Sequence[str] | None = None,
              filter: fs.Predicate | None = None, snapshot_id: int | None = None,
              as_of_ms: int | None = None, limit: int | None = None) -> pa.Table:
    """The lake rows of a table (``columns``, default all plus the meta columns), filtered exactly.

    As of ``snapshot_id`` or wall-clock ``as_of_ms`` when given (time travel), else the latest
    commit; at most ``limit`` rows. A table nothing was tiered for yet reads as empty. Raises InvalidInput for unknown
    columns, NotFound for an unknown snapshot, LakeUnavailable when the lake cannot be read.
    """
    schema = _output_schema(descriptor, columns)
    try:
        lake_table = catalog.load_table(descriptor.path)
    except TableNotFound:
        if snapshot_id is not None or as_of_ms is not None:
            raise
        return schema.empty_table()
    snapshot = resolve_snapshot(lake_table, snapshot_id, as_of_ms)
    if snapshot is None:
        return schema.empty_table()
    what = f"reading the lake table of {descriptor.path}"
    with missing_files(what, lake_table, snapshot):
        scan = _scan(lake_table, descriptor, columns, filter, snapshot, schema, limit)
        check_intact(lake_table, snapshot, _task_files(scan.plan_files()), descriptor.path, what)
        result = scan.to_arrow()
    result = result.select(schema.names).cast(schema)
    return result if limit is None else result.slice(0, limit)


def lake_batches(catalog: LakeCatalog, descriptor: TableDescriptor, *, columns: Sequence[str] | None = None,
                 filter: fs.Predicate | None = None, snapshot_id: int | None = None,
                 as_of_ms: int | None = None, limit: int | None = None
                 ) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
    """:func:`read_lake` streamed: its schema and its rows batch by batch (``t$lake``: a lake of
    any size read in bounded memory; files checked, the read cache used, as a union read does).
    Unknown columns and snapshots are refused before this returns."""
    schema = _output_schema(descriptor, columns)
    try:
        lake_table = catalog.load_table(descriptor.path)
    except TableNotFound:
        if snapshot_id is not None or as_of_ms is not None:
            raise
        return schema, iter(())
    snapshot = resolve_snapshot(lake_table, snapshot_id, as_of_ms)
    if snapshot is None:
        return schema, iter(())
    bound = filter.bind(table_types(descriptor)) if filter is not None else None
    return schema, snapshot_batches(lake_table, snapshot, descriptor, schema.names, bound, limit, catalog.read_cache)


def plan_lake_files(catalog: LakeCatalog, descriptor: TableDescriptor, *,
                    filter: fs.Predicate | None = None, snapshot_id: int | None = None,
                    as_of_ms: int | None = None) -> list:
    """The data files (pyiceberg ``FileScanTask``) a filtered read of the lake would open: what
    partition and statistics pruning left (Spark splits in phase 2)."""
    lake_table = catalog.load_table(descriptor.path)
    snapshot = resolve_snapshot(lake_table, snapshot_id, as_of_ms)
    if snapshot is None:
        return []
    with lake_failures(f"planning a read of the lake table of {descriptor.path}"):
        scan = _scan(lake_table, descriptor, None, filter, snapshot, table_types(descriptor))
        return list(scan.plan_files())


@dataclass(frozen=True)
class LakeSnapshot:
    """One tiering commit: snapshot id, wall-clock commit time, rows added, offsets after it, rows
    in the lake table after it (position deletes subtracted)."""

    snapshot_id: int
    timestamp_ms: int
    added_rows: int
    offsets: dict[int, int]
    total_rows: int = 0


def _live_rows(summary: dict[str, str]) -> int:
    """Rows a snapshot holds: its data files' rows less the rows its position delete files delete
    (each deletes a distinct live row: flightstore writes them so)."""
    return int(summary.get("total-records", 0)) - int(summary.get("total-position-deletes", 0))


def lake_snapshots(catalog: LakeCatalog, descriptor: TableDescriptor) -> list[LakeSnapshot]:
    """The tiering commits of a table's lake, oldest first (``t$lake$snapshots``)."""
    try:
        lake_table = catalog.load_table(descriptor.path)
    except TableNotFound:
        return []
    commits = []
    for snapshot in reversed(tiering_snapshots(lake_table)):
        summary = snapshot.summary.additional_properties if snapshot.summary is not None else {}
        commits.append(LakeSnapshot(snapshot.snapshot_id, snapshot.timestamp_ms,
                                    int(summary.get("added-records", 0)), snapshot_offsets(snapshot) or {},
                                    _live_rows(summary)))
    return commits
