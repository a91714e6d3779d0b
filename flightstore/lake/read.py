"""Reading the lake: a table's tiered rows, as of now or of a past snapshot, pruned and filtered.

Filters are flightstore :mod:`~flightstore.expressions` predicates translated to pyiceberg
expressions, so pyiceberg prunes whole data files by partition (a bucket-key equality reads one
bucket's files) and by column statistics before it reads anything, then filters rows exactly.
Only the requested columns are read from the Parquet files. Rows come back with the table's Arrow
types (Iceberg stores timestamps as microseconds and strings as large strings; they are cast back).

:func:`snapshot_batches` streams a snapshot for the union read: pyiceberg plans (prunes) the data
files, then - when no file has delete files, as in a log table's append-only lake - Arrow's dataset
scanner reads them straight from the warehouse with file- and batch-level read-ahead in parallel
threads (the lake's files are flightstore's own: columns match by name, and a column added later
reads as nulls from older files). Otherwise pyiceberg reads them (deletes applied). Given the
server's read cache (:mod:`flightstore.lake.cache`), files it holds decoded are memory-mapped from
it instead, and the others are put in it as the scanner decodes them.

A lake file that is gone while its table's metadata is still there (the read's snapshot was
expired by the lake upkeep meanwhile, :mod:`flightstore.lake.upkeep`) raises
:class:`~flightstore.errors.LakeFileMissing`, never a short answer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.parquet as pq
from pyiceberg import expressions as ice
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.manifest import ManifestEntryStatus
from pyiceberg.table import Table as IcebergTable
from pyiceberg.table.snapshots import Snapshot

from flightstore import expressions as fs
from flightstore.batches import limited
from flightstore.errors import InvalidInput, LakeFileMissing, LakeUnavailable, NotFound, TableNotFound
from flightstore.lake.cache import CacheFill, ReadCache
from flightstore.lake.catalog import LakeCatalog, lake_failures
from flightstore.lake.layout import BUCKET_COLUMN, lake_schema, table_types
from flightstore.lake.offsets import snapshot_offsets, tiering_snapshots
from flightstore.schema import TableDescriptor

__all__ = [
    "LakeSnapshot",
    "cache_appended",
    "cached_schema",
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


def _exists(io, location: str) -> bool:
    try:
        return io.new_input(location).exists()
    except Exception:  # noqa: BLE001 - cannot tell: the lake is unavailable
        return False


def _expired(lake_table: IcebergTable, snapshot: Snapshot | None) -> bool:
    """Whether ``snapshot`` of ``lake_table`` is gone from the table's metadata now (None: whether
    the table still is there at all)."""
    if not _exists(lake_table.io, lake_table.metadata_location):
        return False  # the warehouse is gone, not a snapshot
    if snapshot is None:
        return True
    try:
        return lake_table.refresh().snapshot_by_id(snapshot.snapshot_id) is None
    except Exception:  # noqa: BLE001 - the catalog is unreachable: the lake is unavailable
        return False


@contextlib.contextmanager
def missing_files(what: str, lake_table: IcebergTable | None = None,
                  snapshot: Snapshot | None = None) -> Iterator[None]:
    """Inside the block, lake failures raise LakeUnavailable, except a file that is gone because
    ``snapshot`` (the one read) expired meanwhile: :class:`LakeFileMissing` (without a table,
    which cannot be asked, any missing file)."""
    try:
        with lake_failures(what):
            yield
    except LakeUnavailable as exc:
        cause = exc.__cause__
        if not isinstance(cause, FileNotFoundError) or \
                (lake_table is not None and not _expired(lake_table, snapshot)):
            raise
        which = f"snapshot {snapshot.snapshot_id}" if snapshot is not None else "the snapshot"
        raise LakeFileMissing(
            f"{what}: a lake file is gone ({cause}): {which} the read was planned on was expired "
            "meanwhile (table.datalake.snapshot.retention) or the warehouse lost it; run the read "
            "again") from cause


def snapshot_batches(lake_table: IcebergTable, snapshot: Snapshot, descriptor: TableDescriptor,
                     columns: Sequence[str], filter: fs.Predicate | None = None,
                     limit: int | None = None, cache: ReadCache | None = None) -> Iterator[pa.RecordBatch]:
    """Stream ``columns`` of the rows of ``snapshot`` matching ``filter`` (bound to
    :func:`table_types`), in the table's types, at most ``limit`` rows; see the module docstring.
    With a ``cache``, data files it holds are read from it and the others put in it as they are
    read (:mod:`flightstore.lake.cache`). Lake failures raise LakeUnavailable (also while streaming),
    a file of an expired snapshot LakeFileMissing."""
    with missing_files(f"reading the lake table of {descriptor.path}", lake_table, snapshot):
        yield from _snapshot_batches(lake_table, snapshot, descriptor, columns, filter, limit, cache)


def _snapshot_batches(lake_table: IcebergTable, snapshot: Snapshot, descriptor: TableDescriptor,
                      columns: Sequence[str], filter: fs.Predicate | None, limit: int | None,
                      cache: ReadCache | None) -> Iterator[pa.RecordBatch]:
    what = f"reading the lake table of {descriptor.path}"
    types = table_types(descriptor)
    needed = list(dict.fromkeys([*columns, *(sorted(filter.columns()) if filter is not None else [])]))
    with lake_failures(what):
        scan = scan_snapshot(lake_table, snapshot, needed, filter, limit)
        tasks = list(scan.plan_files())
    io = lake_table.io
    if not isinstance(io, PyArrowFileIO) or any(task.delete_files for task in tasks):
        with lake_failures(what):
            reader = scan.to_arrow_batch_reader()
        source = _batches(reader, what)
    elif cache is not None and set(needed) <= set(cached_schema(descriptor).names):
        source = _cached_batches(cache, lake_table, tasks, descriptor, needed, what)
    else:
        source = _dataset_batches(io, [task.file.file_path for task in tasks], descriptor, needed, what)
    yield from limited(_conformed(source, needed, columns, types, filter), limit)


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


def _by_file_system(io: PyArrowFileIO, locations: Sequence[str]) -> dict[tuple[str, str], list[tuple[str, str]]]:
    """``(location, path in its file system)`` of each location, grouped by file system (scheme,
    netloc): one warehouse is one."""
    by_fs: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for location in locations:
        scheme, netloc, path = io.parse_location(location, io.properties)
        by_fs.setdefault((scheme, netloc), []).append((location, path))
    return by_fs


def _dataset_batches(io: PyArrowFileIO, locations: list[str], descriptor: TableDescriptor,
                     columns: list[str], what: str) -> Iterator[pa.RecordBatch]:
    """Arrow's scanner over the data files, in the lake's physical types."""
    physical = lake_schema(descriptor)
    yield from _parquet_batches(io, locations, pa.schema([physical.field(c) for c in columns]), what)


def _parquet_batches(io: PyArrowFileIO, locations: Sequence[str], schema: pa.Schema,
                     what: str) -> Iterator[pa.RecordBatch]:
    """The ``schema`` columns of Parquet files, read by Arrow's scanner with read-ahead in parallel
    threads (grouped by file system: one warehouse is one)."""
    for (scheme, netloc), located in _by_file_system(io, locations).items():
        with lake_failures(what):
            dataset = pads.dataset([path for _, path in located], schema=schema, format="parquet",
                                   filesystem=io.fs_by_scheme(scheme, netloc))
            batches = dataset.to_batches(columns=schema.names, use_threads=True)
        yield from _batches_of(batches, what)


def cached_schema(descriptor: TableDescriptor) -> pa.Schema:
    """What the read cache holds of a data file: the table's columns in its own types, and
    ``__bucket`` (what union reads select and filter on; not the offsets and timestamps)."""
    types = table_types(descriptor)
    return pa.schema([types.field(c) for c in [*descriptor.schema.names, BUCKET_COLUMN]])


def _cached_batches(cache: ReadCache, lake_table: IcebergTable, tasks: list, descriptor: TableDescriptor,
                    columns: list[str], what: str) -> Iterator[pa.RecordBatch]:
    """``columns`` of the data files of ``tasks``, typed: those ``cache`` holds from it, then the
    others read (every cached column, in one parallel scan as :func:`_dataset_batches` does) and
    put in it file by file."""
    types = cached_schema(descriptor)
    table_uuid = str(lake_table.metadata.table_uuid)
    missing: dict[str, tuple[str, int]] = {}  # location -> (cache key, rows)
    for task in tasks:
        file = task.file
        key = cache.key(table_uuid, file.file_path, file.file_size_in_bytes, file.record_count, types)
        cached = cache.read(key, types, file.record_count)
        if cached is None:
            missing[file.file_path] = (key, file.record_count)
            continue
        for batch in cached:
            if batch.num_rows:
                yield batch.select(columns)
    if missing:
        yield from _filling(cache, lake_table.io, missing, descriptor, columns, what)


def _filling(cache: ReadCache, io: PyArrowFileIO, missing: dict[str, tuple[str, int]],
             descriptor: TableDescriptor, columns: list[str], what: str) -> Iterator[pa.RecordBatch]:
    types = cached_schema(descriptor)
    physical = pa.schema([lake_schema(descriptor).field(c) for c in types.names])
    for (scheme, netloc), located in _by_file_system(io, list(missing)).items():
        keys = {path: missing[location] for location, path in located}
        with lake_failures(what):
            dataset = pads.dataset(list(keys), schema=physical, format="parquet",
                                   filesystem=io.fs_by_scheme(scheme, netloc))
            tagged = dataset.scanner(columns=physical.names, use_threads=True).scan_batches()
        fill, current = None, None
        try:
            for item in _batches_of(tagged, what):
                path = item.fragment.path
                if path != current:
                    if fill is not None:
                        fill.commit()
                    current, fill = path, _start_fill(cache, keys.get(path), types)
                batch = item.record_batch.cast(types)
                if fill is not None and not _write(fill, batch):
                    fill = None
                yield batch.select(columns)
            if fill is not None:
                fill.commit()
                fill = None
        finally:
            if fill is not None:  # the reader stopped early (a limit, a cancel) or failed
                fill.abort()


def cache_appended(cache: ReadCache, lake_table: IcebergTable, descriptor: TableDescriptor,
                   rows: pa.Table) -> int:
    """Write-through: put the data files that the current snapshot of ``lake_table`` added in
    ``cache``, from ``rows``, the lake rows that snapshot appended (a tiering round of a log
    table), so union reads find them decoded from the start. A data file holds one bucket's rows
    (bucket alignment); a bucket whose rows went into several files is left to the first read.
    Returns how many files were cached."""
    snapshot = lake_table.current_snapshot()
    if snapshot is None or not rows.num_rows:
        return 0
    types = cached_schema(descriptor)
    bucket_field = lake_table.schema().find_field(BUCKET_COLUMN).field_id
    by_bucket: dict[int, list] = {}
    for manifest in snapshot.manifests(lake_table.io):
        if manifest.added_snapshot_id != snapshot.snapshot_id:
            continue
        for entry in manifest.fetch_manifest_entry(lake_table.io, discard_deleted=True):
            if entry.status != ManifestEntryStatus.ADDED or entry.snapshot_id != snapshot.snapshot_id:
                continue
            file = entry.data_file
            low, high = (file.lower_bounds or {}).get(bucket_field), (file.upper_bounds or {}).get(bucket_field)
            if low is None or low != high:
                continue
            by_bucket.setdefault(int.from_bytes(low, "little", signed=True), []).append(file)
    buckets = rows.column(BUCKET_COLUMN)
    table_uuid = str(lake_table.metadata.table_uuid)
    cached = 0
    for bucket, files in by_bucket.items():
        part = rows.filter(pc.equal(buckets, pa.scalar(bucket, pa.int32())))
        if len(files) != 1 or part.num_rows != files[0].record_count:
            continue
        file = files[0]
        key = cache.key(table_uuid, file.file_path, file.file_size_in_bytes, file.record_count, types)
        fill = cache.fill(key, types, file.record_count)
        try:
            for batch in part.select(types.names).cast(types).to_batches():
                fill.write(batch)
        except BaseException:
            fill.abort()
            raise
        cached += fill.commit()
    return cached


def _start_fill(cache: ReadCache, keyed: tuple[str, int] | None, types: pa.Schema) -> CacheFill | None:
    if keyed is None:
        return None
    try:
        return cache.fill(keyed[0], types, keyed[1])
    except (OSError, pa.ArrowException):  # the cache's disk is full or gone: read on without it
        return None


def _write(fill: CacheFill, batch: pa.RecordBatch) -> bool:
    try:
        fill.write(batch)
        return True
    except (OSError, pa.ArrowException):
        fill.abort()
        return False


def read_data_files(locations: Sequence[str], io_properties: dict[str, str], schema: pa.Schema,
                    columns: Sequence[str]) -> Iterator[pa.RecordBatch]:
    """``columns`` of lake data files read straight from the warehouse (a Spark executor's lake
    split): ``schema`` is the files' Arrow schema (:func:`~flightstore.lake.layout.lake_schema`),
    ``io_properties`` pyiceberg file-IO properties (S3 endpoint and credentials...)."""
    io = PyArrowFileIO(dict(io_properties))
    what = "reading lake data files"
    with missing_files(what):
        yield from _parquet_batches(io, locations, pa.schema([schema.field(c) for c in columns]), what)


def read_live_rows(location: str, delete_locations: Sequence[str], io_properties: dict[str, str],
                   schema: pa.Schema, columns: Sequence[str]) -> Iterator[pa.RecordBatch]:
    """``columns`` of one lake data file of a primary-key table without the rows its position
    delete files (``delete_locations``, as planned for this file) delete: a Spark executor's
    read of a lake snapshot, straight from the warehouse."""
    io = PyArrowFileIO(dict(io_properties))
    what = f"reading lake data file {location}"
    if not delete_locations:
        yield from read_data_files([location], io_properties, schema, columns)
        return
    with missing_files(what), lake_failures(what):
        deleted = []
        for delete in delete_locations:
            with io.new_input(delete).open() as stream:
                positions = pq.read_table(stream, columns=["file_path", "pos"])
            deleted.append(positions.filter(pc.equal(positions.column("file_path"), location)).column("pos")
                           .to_numpy())
        gone = np.unique(np.concatenate(deleted)) if deleted else np.empty(0, np.int64)
        fields = pa.schema([schema.field(c) for c in columns])
        with io.new_input(location).open() as stream:
            at = 0
            for batch in pq.ParquetFile(stream).iter_batches(columns=list(columns)):
                keep = ~np.isin(np.arange(at, at + batch.num_rows, dtype=np.int64), gone, assume_unique=True)
                at += batch.num_rows
                if keep.any():
                    yield batch.filter(pa.array(keep)).cast(fields)


def _batches_of(batches: Iterator[pa.RecordBatch], what: str) -> Iterator[pa.RecordBatch]:
    iterator = iter(batches)
    while True:
        with lake_failures(what):
            batch = next(iterator, None)
        if batch is None:
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
    with missing_files(f"reading the lake table of {descriptor.path}", lake_table, snapshot):
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
