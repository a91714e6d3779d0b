"""Union read of a datalake-enabled log table: the lake below each bucket's tiered offset, the log
from there on, as one table with no gap and no duplicate.

The split point is the tiered offsets recorded by ONE lake snapshot (:mod:`flightstore.lake.offsets`):
its data files hold exactly the rows of every bucket below its offset, so the lake part reads that
snapshot and the log part reads each bucket from its offset. A tiering commit that lands meanwhile
changes nothing (the read keeps its snapshot); log retention only deletes records the lake holds,
and a split whose log part was deleted under it (the retention floor moved past an older snapshot)
is planned again on the newer snapshot. A read whose snapshot the lake upkeep expired under it
(and deleted its files) fails with :class:`~flightstore.errors.LakeFileMissing`, never answering
short (the snapshot a read plans on is the current one, which expiry always keeps).

Filters and column pruning apply to both parts: the lake part through pyiceberg (partition and
statistics file pruning, then an exact row filter), the log part through the log's batch statistics.

Only the table interface is used (:class:`~flightstore.table.api.TableApi`), so the same read runs
on a single server and through any server of a cluster: there the lake part is read from the
shared warehouse where the read runs, and each bucket's log part at the bucket's leader
(:meth:`~flightstore.table.api.TableApi.read_log`, committed records only).

When the lake cannot be read (catalog down, warehouse gone) while the log still holds every record
from offset 0 of every bucket, the log alone answers (nothing was deleted, so nothing is missing);
otherwise the read fails with :class:`~flightstore.errors.LakeUnavailable`, never a short answer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyiceberg.table import Table as IcebergTable
from pyiceberg.table.snapshots import Snapshot

from flightstore import expressions as fs
from flightstore.batches import limited_sources
from flightstore.errors import DataLoss, LakeUnavailable, NotFound, TableNotFound, Unsupported
from flightstore.lake.catalog import LakeCatalog, lake_failures
from flightstore.lake.integrity import ChecksumStore, DamagedFile, key_path
from flightstore.lake.layout import BUCKET_COLUMN, lake_schema, table_types
from flightstore.lake.offsets import TABLE_ID_PROPERTY, committed_offsets
from flightstore.lake.read import scan_snapshot, snapshot_batches
from flightstore.table.api import TableApi as Table

__all__ = ["UnionSplit", "plan_split", "public_io_properties", "read_union", "union_buckets", "union_count",
           "union_split"]

logger = logging.getLogger("flightstore.lake")

_REPLANS = 5  # how often a split whose log part retention deleted meanwhile is planned again


@dataclass(frozen=True)
class UnionSplit:
    """Where a union read splits: ``offsets[b]`` is the first offset of bucket ``b`` read from the
    log; the lake part is ``snapshot`` of ``lake_table`` (both None: nothing tiered, or the lake is
    unreachable and the log holds everything)."""

    lake_table: IcebergTable | None
    snapshot: Snapshot | None
    offsets: dict[int, int]

    @property
    def lake_rows(self) -> int:
        """Rows in the lake part (the snapshot's ``total-records``)."""
        if self.snapshot is None or self.snapshot.summary is None:
            return 0
        return int(self.snapshot.summary.additional_properties.get("total-records", 0))


def _lake_of(catalog: LakeCatalog, table: Table) -> IcebergTable | None:
    """The lake table of this incarnation of ``table``, None when nothing was tiered for it (a lake
    table left by a dropped table of the same name holds none of its rows)."""
    try:
        lake_table = catalog.load_table(table.path)
    except TableNotFound:
        return None
    if lake_table.properties.get(TABLE_ID_PROPERTY) != table.table_id:
        return None
    return lake_table


def _log_only(table: Table, cause: LakeUnavailable) -> UnionSplit:
    starts = table.start_offsets()
    gone = {bucket: start for bucket, start in starts.items() if start > 0}
    if gone:
        bucket, start = min(gone.items())
        raise LakeUnavailable(f"table {table.path}: the lake cannot be read ({cause}) and the log of "
                              f"bucket {bucket} starts at offset {start}: the rows below are only in "
                              "the lake; retry when the lake is back") from cause
    return UnionSplit(None, None, dict(starts))


def union_split(catalog: LakeCatalog | None, table: Table, snapshot_id: int | None = None) -> UnionSplit:
    """Plan the split of a union read of log table ``table`` (``catalog`` None: no lake, the log
    answers alone). Raises LakeUnavailable (lake unreadable and the log incomplete), DataLoss (the
    log lost records the lake does not hold)."""
    if catalog is None:
        return UnionSplit(None, None, table.start_offsets())
    for _ in range(_REPLANS):
        try:
            lake_table = _lake_of(catalog, table)
        except LakeUnavailable as exc:
            return _log_only(table, exc)
        snapshot = lake_table.current_snapshot() if lake_table is not None else None
        if snapshot_id is not None:
            if lake_table is None or lake_table.snapshot_by_id(int(snapshot_id)) is None:
                raise NotFound(f"table {table.path}: the lake has no snapshot {snapshot_id} (expired?)")
            snapshot = lake_table.snapshot_by_id(int(snapshot_id))
        recorded = committed_offsets(lake_table, snapshot) if snapshot is not None else {}
        starts = table.start_offsets()
        offsets = {bucket: recorded.get(bucket, start) for bucket, start in starts.items()}
        if all(offsets[bucket] >= start for bucket, start in starts.items()):
            return UnionSplit(lake_table if snapshot is not None else None, snapshot, offsets)
        if not recorded:
            break  # nothing tiered yet, yet the log lost records: no newer snapshot will help
    bucket = next(b for b, start in table.start_offsets().items() if offsets[b] < start)
    raise DataLoss(f"table {table.path} bucket {bucket}: log records from offset {offsets[bucket]} "
                   f"were deleted but the lake holds only the rows below it")


def _partitioned(table: Table) -> bool:
    return bool(table.descriptor.partition_keys)


def _wanted(table: Table, filter: fs.Predicate | None, buckets: Sequence[int] | None) -> list[int]:
    """The table-wide buckets a read visits: ``buckets`` (default all) of the live partitions
    ``filter`` cannot rule out (partition pruning); a bucket of a dropped partition has no rows."""
    if _partitioned(table):
        live = table.bucket_ids(filter=filter.bind(table.schema) if filter is not None else None)
    else:
        live = list(range(table.num_buckets))
    if buckets is None:
        return live
    kept = set(live)
    return [int(b) for b in buckets if int(b) in kept]


def union_buckets(table: Table, filter: fs.Predicate | None = None) -> list[int]:
    """The table-wide buckets a union read with ``filter`` visits (a partitioned table: those of
    the live partitions the filter cannot rule out): one Flight endpoint each."""
    return _wanted(table, filter, None)


def _lake_filter(table: Table, filter: fs.Predicate | None, wanted: Sequence[int]) -> fs.Predicate | None:
    """``filter`` for the lake part, restricted to the ``wanted`` buckets. A partitioned table is
    always restricted: its lake may still hold rows of dropped partitions (until the next tiering
    round deletes them), which live under table-wide bucket ids no live partition uses."""
    if not _partitioned(table) and set(wanted) >= set(range(table.num_buckets)):
        return filter
    only = fs.In(BUCKET_COLUMN, tuple(int(b) for b in wanted))
    return only if filter is None else fs.And(filter, only)


def read_union(catalog: LakeCatalog | None, table: Table, columns: Sequence[str], *,
               filter: fs.Predicate | None = None, limit: int | None = None,
               buckets: Sequence[int] | None = None, exact: bool = True,
               split: UnionSplit | None = None) -> Iterator[pa.Table | pa.RecordBatch]:
    """The rows of ``buckets`` (default all) of log table ``table``: the lake part, then the log
    part of each bucket; only ``columns`` (of the table), filtered by ``filter`` (bound to the
    table's schema; ``exact=False`` lets log rows through that only the statistics could not rule
    out, for callers that filter again), at most ``limit`` rows.

    The lake part streams as pyiceberg decodes it; a lake that cannot be reached when the read is
    planned is handled by :func:`union_split`, one that fails mid-read fails the read (never a
    short answer)."""
    columns = list(columns)
    planned = split is None
    split = union_split(catalog, table) if split is None else split
    wanted = _wanted(table, filter, buckets)
    if not wanted:
        return
    # Retention must not delete the log tail this split reads (a tiering round may commit and
    # retention run while the lake part streams): a local table holds it; a split planned before
    # retention moved past it is planned again (a given split then fails with DATA_LOSS).
    hold = None if _partitioned(table) else getattr(table, "hold_log_from", None)
    release = None
    for _ in range(5 if hold is not None else 0):
        release = hold(split.offsets)
        if release is not None or not planned:
            break
        split = union_split(catalog, table)
    try:
        yield from _union_rows(catalog, table, columns, split, wanted, filter, limit, exact)
    finally:
        if release is not None:
            release()


def _union_rows(catalog: LakeCatalog | None, table: Table, columns: list[str], split: UnionSplit,
                wanted: Sequence[int], filter: fs.Predicate | None, limit: int | None,
                exact: bool) -> Iterator[pa.Table | pa.RecordBatch]:
    fall_back = _FallBack(catalog, table, split, wanted)

    def lake_part(rows: int | None) -> Iterator[pa.RecordBatch]:
        lake_filter = _lake_filter(table, filter, wanted)
        bound = lake_filter.bind(table_types(table.descriptor)) if lake_filter is not None else None
        cache = catalog.read_cache if catalog is not None else None
        return snapshot_batches(split.lake_table, split.snapshot, table.descriptor, columns, bound, rows, cache,
                                damage=fall_back)

    def log_part(bucket: int) -> Callable[[int | None], Iterable[pa.RecordBatch]]:
        def open_log(rows: int | None) -> Iterable[pa.RecordBatch]:
            if bucket not in split.offsets:
                return ()  # its partition was created since the split was planned
            start = min(split.offsets[bucket], fall_back.taken.get(bucket, split.offsets[bucket]))
            return table.read_log(bucket, start, columns, filter=filter, limit=rows, exact=exact)
        return open_log

    sources = ([lake_part] if split.snapshot is not None else []) + [log_part(bucket) for bucket in wanted]
    yield from limited_sources(sources, limit)


class _FallBack:
    """A union read's answer to damaged lake files (:class:`~flightstore.lake.integrity.DamageHandler`):
    a bucket whose log still holds the file's records from its first offset on is read from the
    log from there (``taken``); each one met is logged and listed in ``t$lake$status``."""

    def __init__(self, catalog: LakeCatalog | None, table: Table, split: UnionSplit, wanted: Sequence[int]) -> None:
        self.catalog, self.table, self.split, self.wanted = catalog, table, split, set(wanted)
        self.taken: dict[int, int] = {}  # bucket -> first offset read from the log instead

    def take_over(self, damaged: DamagedFile, span: tuple[int, int]) -> bool:
        bucket, first = span
        if bucket not in self.wanted or bucket not in self.split.offsets:
            return False
        # Through the table interface (in a cluster the bucket's leader answers); a log damaged or
        # cut below its start fails the log read itself with DATA_LOSS (never a short answer).
        start = self.table.start_offsets().get(bucket)
        if start is None or start > first:
            self._report(bucket, damaged, f"the log of bucket {bucket} no longer holds offsets from {first} "
                                          f"(it starts at {start})")
            return False
        self.taken[bucket] = min(self.taken.get(bucket, first), first)
        self._report(bucket, damaged, f"bucket {bucket} is answered from the log from offset {first} on instead")
        return True

    def checked(self, locations: Sequence[str]) -> None:
        if self.catalog is not None:
            self.catalog.damage.clear(str(self.table.path), locations)

    def _report(self, bucket: int, damaged: DamagedFile, outcome: str) -> None:
        logger.error("table %s: %s; %s", self.table.path, damaged.describe(), outcome)
        if self.catalog is not None:
            self.catalog.damage.report(str(self.table.path), bucket, damaged)


def union_count(catalog: LakeCatalog | None, table: Table, split: UnionSplit | None = None,
                partitions: Sequence[str] | None = None) -> int:
    """``COUNT(*)`` of the union (of the named ``partitions`` of a partitioned table): the lake
    snapshot's record count plus the log records from the split offsets on. A partitioned table's
    lake part counts the ``__bucket`` column of its live partitions' buckets (its lake may hold
    dropped partitions' rows), reading that one column only."""
    split = union_split(catalog, table) if split is None else split
    ends = table.end_offsets()
    wanted = table.bucket_ids(partitions) if _partitioned(table) else sorted(ends)
    tail = sum(max(0, ends[b] - split.offsets.get(b, ends[b])) for b in wanted if b in ends)
    if split.snapshot is None or not _partitioned(table):
        return split.lake_rows + tail
    if not wanted:
        return tail
    only = fs.In(BUCKET_COLUMN, tuple(int(b) for b in wanted)).bind(table_types(table.descriptor))
    cache = catalog.read_cache if catalog is not None else None
    lake = sum(batch.num_rows for batch in snapshot_batches(split.lake_table, split.snapshot,
                                                            table.descriptor, [BUCKET_COLUMN], only,
                                                            cache=cache))
    return lake + tail


# Properties of the lake's file IO a reader elsewhere may be given (never credentials).
_SECRET_WORDS = ("secret", "key-id", "token", "password", "credential", "session")


def public_io_properties(properties: dict[str, str]) -> dict[str, str]:
    """File-IO properties safe to hand to a reader elsewhere: endpoint, region... not keys."""
    return {k: v for k, v in properties.items() if not any(word in k.lower() for word in _SECRET_WORDS)}


def plan_split(catalog: LakeCatalog | None, table: Table, filter: fs.Predicate | None = None,
               snapshot_id: int | None = None, *, with_deletes: bool = False) -> dict:
    """A union read planned for readers elsewhere (Spark executors): the split's snapshot and
    offsets, the data files a read with ``filter`` (bound to the table's schema) must open after
    partition and statistics pruning, the files' Arrow schema (IPC bytes) and the lake's file-IO
    properties without credentials (readers bring their own). ``with_deletes``: each data file
    also names the position delete files that apply to it (a primary-key table's merge-on-read;
    the reader drops those rows), instead of refusing such a snapshot."""
    split = union_split(catalog, table, snapshot_id)
    files: list[dict] = []
    if _partitioned(table):  # the live partitions' buckets the filter leaves (pruning)
        wanted = _wanted(table, filter, None)
        split = UnionSplit(split.lake_table, split.snapshot,
                           {b: o for b, o in split.offsets.items() if b in set(wanted)})
        filter = _lake_filter(table, filter, wanted)
    if split.snapshot is not None and split.offsets:
        bound = filter.bind(table_types(table.descriptor)) if filter is not None else None
        with lake_failures(f"planning a read of the lake table of {table.path}"):
            tasks = list(scan_snapshot(split.lake_table, split.snapshot,
                                       table_types(table.descriptor).names, bound).plan_files())
        if not with_deletes and any(task.delete_files for task in tasks):
            raise Unsupported(f"table {table.path}: its lake has delete files; read it with SQL")
        store = ChecksumStore.of(split.lake_table)
        io = split.lake_table.io
        checks = store.lookup([key_path(io, t.file.file_path) for t in tasks]) if store is not None else {}
        files = []
        for task in tasks:
            check = checks.get(key_path(io, task.file.file_path))
            files.append({"path": task.file.file_path, "rows": task.file.record_count,
                          "bytes": task.file.file_size_in_bytes,
                          "crc32": check.crc32 if check is not None else None})
        if with_deletes:
            for planned, task in zip(files, tasks):
                planned["deletes"] = sorted(d.file_path for d in task.delete_files)
    io = {} if split.lake_table is None else public_io_properties(split.lake_table.io.properties)
    return {"snapshot_id": split.snapshot.snapshot_id if split.snapshot is not None else None,
            "offsets": {str(b): o for b, o in split.offsets.items()}, "files": files,
            "schema": lake_schema(table.descriptor).serialize().to_pybytes().hex(), "io": io}
