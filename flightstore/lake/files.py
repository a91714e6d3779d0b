"""Reading lake data files: each one checked before it is decoded, then decoded or served from the cache.

:func:`task_batches` reads the data files of a planned scan (files with no delete files, as a log
table's append-only lake has) in windows of a few files: the files of a window that the read cache
(:mod:`flightstore.lake.cache`) does not hold are checked first (size and whole-file CRC,
:mod:`flightstore.lake.integrity`; in parallel, the next window's while this one is decoded),
then Arrow's dataset scanner decodes them with file- and batch-level read-ahead in parallel
threads, verifying Parquet page checksums (the lake's files are flightstore's own: columns match
by name, and a column added later reads as nulls from older files). Given the cache, the decoded
rows are put in it file by file: what the cache holds was checked before it was decoded.

A damaged file (missing, truncated, corrupt) is offered to the caller's ``damage`` handler: the union
read answers its bucket from the log from the file's first offset on when the log still holds it
(files are read in (bucket, offset) order, so the bucket's later files are skipped too and none
was streamed yet); otherwise the read fails with DATA_LOSS naming the file. A file that is gone
because the snapshot read was expired meanwhile (:mod:`flightstore.lake.upkeep`) is
:class:`~flightstore.errors.LakeFileMissing` ("run the read again"), and a warehouse that is gone
altogether is the lake being unavailable.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.manifest import DataFile, ManifestEntryStatus
from pyiceberg.table import Table as IcebergTable
from pyiceberg.table.snapshots import Snapshot

from flightstore import memory
from flightstore.errors import DataLoss, LakeFileMissing, LakeUnavailable
from flightstore.lake.cache import CacheFill, ReadCache
from flightstore.lake.catalog import lake_failures
from flightstore.lake.direct import missing_file_error, read_data_files, read_live_rows
from flightstore.lake.integrity import (
    PARQUET_READ_FORMAT,
    DamagedFile,
    DamageHandler,
    Verification,
    damage_error,
    file_span,
    verify_files,
)
from flightstore.lake.layout import BUCKET_COLUMN, lake_schema, table_types
from flightstore.schema import TableDescriptor

__all__ = ["cache_appended", "cached_schema", "check_intact", "missing_files", "read_data_files", "read_live_rows",
           "task_batches"]

_WINDOW_FILES = 8  # files checked, then decoded together (the scanner reads ahead across them)
_READ_AHEAD = 4  # batches the scanner decodes ahead, per file


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


def _expired_error(what: str, snapshot: Snapshot | None, cause: object) -> LakeFileMissing:
    which = f"snapshot {snapshot.snapshot_id}" if snapshot is not None else "the snapshot"
    return missing_file_error(what, cause, which)


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
        raise _expired_error(what, snapshot, cause) from cause


def _not_damage(lake_table: IcebergTable, snapshot: Snapshot | None, damaged: DamagedFile, what: str) -> None:
    """Raise what a missing file means when it is not damage: its snapshot expired meanwhile
    (LakeFileMissing) or the whole warehouse is gone (LakeUnavailable)."""
    if damaged.problem != "missing":
        return
    if not _exists(lake_table.io, lake_table.metadata_location):
        raise LakeUnavailable(f"{what}: the lake table's metadata is gone too ({lake_table.metadata_location}): "
                              "the warehouse is unavailable")
    if snapshot is not None and _expired(lake_table, snapshot):
        raise _expired_error(what, snapshot, damaged.detail)


def check_intact(lake_table: IcebergTable, snapshot: Snapshot | None, files: Sequence[DataFile],
                 table: object, what: str) -> None:
    """Check ``files`` (data and delete files a pyiceberg reader is about to decode); the first
    damaged one is DATA_LOSS naming it."""
    damaged = verify_files(lake_table, files, what)
    for location in sorted(damaged):
        _not_damage(lake_table, snapshot, damaged[location], what)
        raise damage_error(f"table {table}", damaged[location])


def cached_schema(descriptor: TableDescriptor) -> pa.Schema:
    """What the read cache holds of a data file: the table's columns in its own types, and
    ``__bucket`` (what union reads select and filter on; not the offsets and timestamps)."""
    types = table_types(descriptor)
    return pa.schema([types.field(c) for c in [*descriptor.schema.names, BUCKET_COLUMN]])


def _order(lake_table: IcebergTable, tasks: Sequence) -> list[tuple[object, tuple[int, int] | None]]:
    """Tasks with their file's (bucket, first offset), in that order (files without one last)."""
    spans = [(task, file_span(lake_table, task.file)) for task in tasks]
    return sorted(spans, key=lambda ts: (ts[1] is None, ts[1] or (0, 0)))


def task_batches(lake_table: IcebergTable, snapshot: Snapshot | None, tasks: Sequence,
                 descriptor: TableDescriptor, columns: list[str], what: str, *, cache: ReadCache | None = None,
                 damage: DamageHandler | None = None) -> Iterator[pa.RecordBatch]:
    """``columns`` of the data files of ``tasks`` (none with delete files), each checked before it
    is decoded; see the module docstring. With ``cache`` (and ``columns`` among
    :func:`cached_schema`'s) batches come typed, from the cache or put in it; else in the lake's
    physical types. A damaged file is offered to ``damage.take_over`` (True: the caller reads its
    bucket from its first offset on elsewhere); without ``damage``, or when it declines, it is
    DATA_LOSS. ``damage.checked`` hears of the files that checked out."""
    io = lake_table.io
    use_cache = cache is not None and set(columns) <= set(cached_schema(descriptor).names)
    types = cached_schema(descriptor)
    table_uuid = str(lake_table.metadata.table_uuid)
    ordered = _order(lake_table, tasks)
    windows = [ordered[i:i + _WINDOW_FILES] for i in range(0, len(ordered), _WINDOW_FILES)]
    cut: dict[int, int] = {}  # bucket -> first offset the caller reads elsewhere

    def is_cut(span: tuple[int, int] | None) -> bool:
        return span is not None and span[0] in cut and span[1] >= cut[span[0]]

    def prepare(window: list) -> tuple[list, list, Verification | None]:
        """Cached batches and files to decode of ``window``, and the check of the latter."""
        cached, to_decode = [], []
        for task, span in window:
            key = None
            if use_cache:
                file = task.file
                key = cache.key(table_uuid, file.file_path, file.file_size_in_bytes, file.record_count, types)
                batches = cache.read(key, types, file.record_count)
                if batches is not None:
                    cached.append((span, batches))
                    continue
            to_decode.append((task, span, key))
        files = [task.file for task, _, _ in to_decode]
        return cached, to_decode, Verification(lake_table, files, what) if files else None

    pending = prepare(windows[0]) if windows else None
    for index in range(len(windows)):
        cached, to_decode, checking = pending
        damaged = checking.result() if checking is not None else {}
        if damage is not None and to_decode:
            damage.checked([t.file.file_path for t, _, _ in to_decode if t.file.file_path not in damaged])
        # the next window's files are checked while this one is decoded
        pending = prepare(windows[index + 1]) if index + 1 < len(windows) else None
        for task, span, _ in to_decode:
            bad = damaged.get(task.file.file_path)
            if bad is None or is_cut(span):
                continue
            _not_damage(lake_table, snapshot, bad, what)
            if damage is None or span is None or not damage.take_over(bad, span):
                raise damage_error(f"table {descriptor.path}", bad)
            cut[span[0]] = min(cut.get(span[0], span[1]), span[1])
        for span, batches in cached:
            if is_cut(span):
                continue
            for batch in batches:
                if batch.num_rows:
                    yield batch.select(columns)
        decode = [(task, key) for task, span, key in to_decode if not is_cut(span)]
        if not decode:
            continue
        if use_cache:
            missing = {task.file.file_path: (key, task.file.record_count) for task, key in decode}
            yield from _filling(cache, io, missing, descriptor, columns, what)
        else:
            physical = lake_schema(descriptor)
            yield from _parquet_batches(io, [task.file.file_path for task, _ in decode],
                                        pa.schema([physical.field(c) for c in columns]), what)


def _by_file_system(io: PyArrowFileIO, locations: Sequence[str]) -> dict[tuple[str, str], list[tuple[str, str]]]:
    """``(location, path in its file system)`` of each location, grouped by file system (scheme,
    netloc): one warehouse is one."""
    by_fs: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for location in locations:
        scheme, netloc, path = io.parse_location(location, io.properties)
        by_fs.setdefault((scheme, netloc), []).append((location, path))
    return by_fs


def _parquet_batches(io: PyArrowFileIO, locations: Sequence[str], schema: pa.Schema,
                     what: str) -> Iterator[pa.RecordBatch]:
    """The ``schema`` columns of Parquet files, read by Arrow's scanner with read-ahead in parallel
    threads (grouped by file system: one warehouse is one), page checksums verified."""
    for (scheme, netloc), located in _by_file_system(io, locations).items():
        with lake_failures(what):
            dataset = pads.dataset([path for _, path in located], schema=schema, format=PARQUET_READ_FORMAT,
                                   filesystem=io.fs_by_scheme(scheme, netloc))
            batches = dataset.to_batches(columns=schema.names, use_threads=True, **_bounded(schema))
        yield from _batches_of(batches, what, [location for location, _ in located])


def _bounded(schema: pa.Schema) -> dict:
    """Scanner options holding about half of ``query.memory-limit`` decoded at most: batches of
    :func:`flightstore.memory.batch_bytes` at the rows' width (Arrow's default of 131,072 rows is
    gigabytes for a wide table), :data:`_READ_AHEAD` of them from two files at a time."""
    return {"batch_size": memory.batch_rows(schema, 131_072), "batch_readahead": _READ_AHEAD,
            "fragment_readahead": 2}


def _batches_of(batches, what: str, locations: Sequence[str]) -> Iterator:
    iterator = iter(batches)
    while True:
        try:
            with lake_failures(what):
                batch = next(iterator, None)
        except LakeUnavailable as exc:
            if "checksum" in str(exc).lower():  # a page that no longer matches its CRC
                raise DataLoss(f"{what}: a page of one of the lake files {', '.join(locations)} fails its "
                               f"checksum ({exc.__cause__})") from exc
            raise
        if batch is None:
            return
        yield batch


def _filling(cache: ReadCache, io: PyArrowFileIO, missing: dict[str, tuple[str, int]],
             descriptor: TableDescriptor, columns: list[str], what: str) -> Iterator[pa.RecordBatch]:
    """``columns`` of the (checked) files ``missing`` (location -> (cache key, rows)), typed,
    every cached column decoded in one parallel scan and put in ``cache`` file by file."""
    types = cached_schema(descriptor)
    physical = pa.schema([lake_schema(descriptor).field(c) for c in types.names])
    for (scheme, netloc), located in _by_file_system(io, list(missing)).items():
        keys = {path: missing[location] for location, path in located}
        with lake_failures(what):
            dataset = pads.dataset(list(keys), schema=physical, format=PARQUET_READ_FORMAT,
                                   filesystem=io.fs_by_scheme(scheme, netloc))
            tagged = dataset.scanner(columns=physical.names, use_threads=True, **_bounded(physical)).scan_batches()
        fill, current = None, None
        try:
            for item in _batches_of(tagged, what, [location for location, _ in located]):
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
    by_bucket: dict[int, list] = {}
    for manifest in snapshot.manifests(lake_table.io):
        if manifest.added_snapshot_id != snapshot.snapshot_id:
            continue
        for entry in manifest.fetch_manifest_entry(lake_table.io, discard_deleted=True):
            if entry.status != ManifestEntryStatus.ADDED or entry.snapshot_id != snapshot.snapshot_id:
                continue
            span = file_span(lake_table, entry.data_file)
            if span is not None:
                by_bucket.setdefault(span[0], []).append(entry.data_file)
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
