"""Reading the lake: a table's tiered rows, as of now or of a past snapshot, pruned and filtered.

Filters are flightstore :mod:`~flightstore.expressions` predicates translated to pyiceberg
expressions, so pyiceberg prunes whole data files by partition (a bucket-key equality reads one
bucket's files) and by column statistics before it reads anything, then filters rows exactly.
Only the requested columns are read from the Parquet files. Rows come back with the table's Arrow
types (Iceberg stores timestamps as microseconds and strings as large strings; they are cast back).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyiceberg import expressions as ice
from pyiceberg.table import Table as IcebergTable
from pyiceberg.table.snapshots import Snapshot

from flightstore import expressions as fs
from flightstore.errors import InvalidInput, NotFound, TableNotFound
from flightstore.lake.catalog import LakeCatalog, lake_failures
from flightstore.lake.layout import table_types
from flightstore.lake.offsets import snapshot_offsets, tiering_snapshots
from flightstore.schema import TableDescriptor

__all__ = [
    "LakeSnapshot",
    "lake_snapshots",
    "plan_lake_files",
    "read_lake",
    "resolve_snapshot",
    "scan_snapshot",
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
    with lake_failures(f"reading the lake table of {descriptor.path}"):
        result = _scan(lake_table, descriptor, columns, filter, snapshot, schema, limit).to_arrow()
    result = result.select(schema.names).cast(schema)
    return result if limit is None else result.slice(0, limit)


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
    in the lake table after it."""

    snapshot_id: int
    timestamp_ms: int
    added_rows: int
    offsets: dict[int, int]
    total_rows: int = 0


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
                                    int(summary.get("total-records", 0))))
    return commits
