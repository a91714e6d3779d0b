"""Lake files are checked before anything is read from them: page checksums, size and a whole-file CRC.

Every Parquet file flightstore writes into the lake (data files and position delete files, by
the server's tierer, a Spark tiering job's executors or its driver) is written

* with Parquet **page checksums** (CRC-32 of each page, in its page header), which every Parquet
  reader that verifies them (Arrow, parquet-mr, DuckDB) checks page by page, and
* with a **CRC-32 of the whole file**, computed from the bytes as they are written (never read
  back: a write the storage garbled is not blessed), and its size.

The whole-file CRC is what catches every single-bit flip: page checksums do not cover page
headers, the footer, nor the magic bytes, and a flip there can change values silently (a wrong
``num_values``, an offset, a statistic pruning a file out). CRC-32 detects every burst of up to
32 bits, so every single-bit flip anywhere in the file.

**Where the checks live.** Iceberg's manifest entry of a file carries its size
(``file_size_in_bytes``) but has no field for a checksum. The CRC goes into
``flightstore_lake_files``, a table of flightstore's own in the lake's catalog database (the SQL
database every tierer and the server already share, as the tiering leases do), keyed by the
file's path: one row per file, written before the snapshot adding the file is committed (a
committed file always has its row; a round that dies leaves a row for an orphan file, removed
with it by the lake upkeep). Not the snapshot summary: that of the snapshot adding a file is gone
once the snapshot expires while the file lives on (``table.datalake.snapshot.retention``), and a
read would have to find which snapshot added each file.

**Reading.** :func:`verify_files` checks files before they are decoded: the size the manifest
records, then the CRC (one sequential read; files already decoded into the read cache were
checked when they were put there). A file that is missing, shorter or longer than recorded, or
whose CRC differs is :class:`DamagedFile`; what the read does then (fall back to the log, or fail
with DATA_LOSS naming the file: :func:`damage_error`) is the caller's choice
(:mod:`flightstore.lake.union`). Files written before checks were recorded are checked by size
and, where they have them, page checksums only.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
import weakref
import zlib
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.dataset as pads
from pyiceberg.io import FileIO, OutputFile, OutputStream
from pyiceberg.io.fileformat import FileFormatFactory
from pyiceberg.io.pyarrow import ParquetFormatModel, ParquetFormatWriter, _dataframe_to_data_files
from pyiceberg.manifest import DataFile, FileFormat
from pyiceberg.schema import Schema
from pyiceberg.table import Table as IcebergTable
from pyiceberg.table.metadata import TableMetadata
from sqlalchemy import BigInteger, Column, MetaData, String, Table, Text, delete, insert, select
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from flightstore.lake.catalog import lake_failures
from flightstore.lake.direct import DamagedFile, FileCheck, check_stream, damage_error
from flightstore.lake.layout import BUCKET_COLUMN, OFFSET_COLUMN

__all__ = ["PARQUET_READ_FORMAT", "ChecksumStore", "DamageLog", "DamagedFile", "FileCheck", "DamageHandler",
           "Verification", "checked_parquet_writer", "damage_error", "file_span", "key_path", "record_checks",
           "verify_file", "verify_files", "write_data_files", "written_check"]

log = logging.getLogger("flightstore.lake")

# Arrow's Parquet reader verifying every page checksum it meets (files without them read as before).
PARQUET_READ_FORMAT = pads.ParquetFileFormat(
    default_fragment_scan_options=pads.ParquetFragmentScanOptions(page_checksum_verification=True))


def key_path(io: FileIO, location: str) -> str:
    """``location`` as its file system's path (what listing the warehouse gives): the key of checks."""
    parse = getattr(io, "parse_location", None)
    if parse is None:
        return location
    return parse(location, io.properties)[2]


# ---- writing --------------------------------------------------------------------------------------
_WRITTEN_MAX = 16_384  # checks of files written but not yet collected (bounds a leak, never hit)
_written: OrderedDict[str, FileCheck] = OrderedDict()
_written_lock = threading.Lock()


class _CrcStream:
    """An output stream that keeps the CRC-32 and size of everything written through it."""

    def __init__(self, inner: OutputStream) -> None:
        self.inner = inner
        self.crc = 0
        self.size = 0

    def write(self, data: Any) -> int:
        self.crc = zlib.crc32(data, self.crc)
        self.size += memoryview(data).nbytes
        return self.inner.write(data)

    def flush(self) -> None:
        flush = getattr(self.inner, "flush", None)
        if flush is not None:
            flush()

    def tell(self) -> int:
        return self.size

    @property
    def closed(self) -> bool:
        return bool(getattr(self.inner, "closed", False))

    def writable(self) -> bool:
        return True

    def close(self) -> None:
        self.inner.close()

    def __enter__(self) -> _CrcStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _CrcOutput(OutputFile):
    """An output file whose stream records a :class:`FileCheck` once closed."""

    def __init__(self, inner: OutputFile, io_path: str) -> None:
        super().__init__(inner.location)
        self.inner = inner
        self.io_path = io_path
        self.stream: _CrcStream | None = None

    def __len__(self) -> int:
        return len(self.inner)

    def exists(self) -> bool:
        return self.inner.exists()

    def to_input_file(self):  # noqa: ANN201 - pyiceberg's InputFile
        return self.inner.to_input_file()

    def create(self, overwrite: bool = False) -> OutputStream:
        self.stream = _CrcStream(self.inner.create(overwrite=overwrite))
        return self.stream  # type: ignore[return-value]

    def check(self) -> FileCheck:
        assert self.stream is not None
        return FileCheck(self.io_path, self.stream.size, self.stream.crc)


class _CheckedParquetWriter(ParquetFormatWriter):
    """pyiceberg's Parquet writer with page checksums, recording the file's CRC when closed."""

    def __init__(self, output_file: OutputFile, file_schema: Schema, properties: Mapping[str, str]) -> None:
        io_path = output_file.location
        parse = getattr(output_file, "_path", None)  # PyArrowFile: the path in its file system
        if isinstance(parse, str):
            io_path = parse
        self._crc_output = _CrcOutput(output_file, io_path)
        super().__init__(self._crc_output, file_schema, dict(properties))
        self._parquet_writer_kwargs["write_page_checksum"] = True

    def close(self):  # noqa: ANN201 - pyiceberg's DataFileStatistics
        if self._result is not None:
            return self._result
        result = super().close()
        check = self._crc_output.check()
        with _written_lock:
            _written[check.path] = check
            while len(_written) > _WRITTEN_MAX:
                _written.popitem(last=False)
        return result


class _CheckedParquetModel(ParquetFormatModel):
    def create_writer(self, output_file: OutputFile, file_schema: Schema,
                      properties: Mapping[str, str]) -> ParquetFormatWriter:
        return _CheckedParquetWriter(output_file, file_schema, properties)


def _install() -> None:
    """Make pyiceberg write every Parquet file of this process through :class:`_CheckedParquetWriter`
    (its format registry refuses a second model for a format, hence the direct replacement)."""
    current = FileFormatFactory.get(FileFormat.PARQUET)
    if not isinstance(current, _CheckedParquetModel):
        FileFormatFactory._registry[FileFormat.PARQUET] = _CheckedParquetModel()


_install()


def checked_parquet_writer(output: OutputFile, schema: Schema, properties: Mapping[str, str]) -> ParquetFormatWriter:
    """A Parquet writer of one file with page checksums whose check :func:`written_check` gives
    once it is closed (position delete files)."""
    return _CheckedParquetWriter(output, schema, properties)


def written_check(io: FileIO, location: str) -> FileCheck | None:
    """The check of the file just written at ``location`` by this process (taken: a second call
    gives None)."""
    with _written_lock:
        return _written.pop(key_path(io, location), None)


def write_data_files(table_metadata: TableMetadata, io: FileIO, rows: pa.Table, write_uuid: Any,
                     counter: Any = None) -> tuple[list[DataFile], list[FileCheck]]:
    """Write ``rows`` as data files of the table's partition spec (pyiceberg's task planning and
    statistics), with page checksums; returns their metadata and their checks. Nothing is
    committed: record the checks (:meth:`ChecksumStore.record`) before the commit."""
    if rows.num_rows == 0:
        return [], []
    kwargs = {"counter": counter} if counter is not None else {}
    files = list(_dataframe_to_data_files(table_metadata=table_metadata, df=rows, io=io,
                                          write_uuid=write_uuid, **kwargs))
    checks = [written_check(io, f.file_path) for f in files]
    missing = [f.file_path for f, c in zip(files, checks) if c is None]
    if missing:  # never: every Parquet file goes through _CheckedParquetWriter
        raise RuntimeError(f"no checksum was recorded while writing {missing[0]}")
    return files, [c for c in checks if c is not None]


# ---- recording ------------------------------------------------------------------------------------
_METADATA = MetaData()
_FILES = Table(
    "flightstore_lake_files", _METADATA,
    Column("path_key", String(64), primary_key=True),  # sha256 of the path: any length, indexable
    Column("path", Text, nullable=False),
    Column("size", BigInteger, nullable=False),
    Column("crc32", BigInteger, nullable=False),
    Column("recorded_at_ms", BigInteger, nullable=False),
)
_LOOKUP_CHUNK = 500


def _hash(path: str) -> str:
    return hashlib.sha256(path.encode()).hexdigest()


class ChecksumStore:
    """The checks of one catalog database's lake files (see the module docstring); its table is
    created the first time an engine is used."""

    _created: weakref.WeakSet = weakref.WeakSet()  # engines whose table exists
    _created_lock = threading.Lock()

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        with ChecksumStore._created_lock:
            created = engine in ChecksumStore._created
        if not created:
            with lake_failures("creating the lake file checksum table"):
                _METADATA.create_all(engine, tables=[_FILES])
            with ChecksumStore._created_lock:
                ChecksumStore._created.add(engine)

    @classmethod
    def of(cls, lake_table: IcebergTable) -> ChecksumStore | None:
        """The store of the catalog ``lake_table`` was loaded from (None: not a SQL catalog)."""
        engine = getattr(getattr(lake_table, "catalog", None), "engine", None)
        return cls(engine) if isinstance(engine, Engine) else None

    def record(self, checks: Iterable[FileCheck]) -> None:
        """Record the checks of files about to be committed (a path recorded before keeps its row:
        paths are unique write ids, a second record is a retried round's)."""
        rows = [{"path_key": _hash(c.path), "path": c.path, "size": int(c.size), "crc32": int(c.crc32),
                 "recorded_at_ms": int(time.time() * 1000)} for c in checks]
        if not rows:
            return
        with lake_failures("recording the checksums of lake files"):
            try:
                with self.engine.begin() as connection:
                    connection.execute(insert(_FILES), rows)
            except IntegrityError:
                with self.engine.begin() as connection:
                    for row in rows:
                        connection.execute(delete(_FILES).where(_FILES.c.path_key == row["path_key"]))
                    connection.execute(insert(_FILES), rows)

    def lookup(self, paths: Iterable[str]) -> dict[str, FileCheck]:
        """The recorded checks of ``paths`` (file system paths) that have one."""
        wanted = {_hash(p): p for p in paths}
        found: dict[str, FileCheck] = {}
        keys = list(wanted)
        with lake_failures("reading the checksums of lake files"), self.engine.connect() as connection:
            for start in range(0, len(keys), _LOOKUP_CHUNK):
                chunk = keys[start:start + _LOOKUP_CHUNK]
                for row in connection.execute(select(_FILES).where(_FILES.c.path_key.in_(chunk))):
                    if row.path == wanted.get(row.path_key):
                        found[row.path] = FileCheck(row.path, int(row.size), int(row.crc32))
        return found

    def forget(self, paths: Iterable[str]) -> None:
        """Drop the checks of deleted files."""
        keys = [_hash(p) for p in paths]
        if not keys:
            return
        with lake_failures("forgetting the checksums of deleted lake files"), self.engine.begin() as connection:
            for start in range(0, len(keys), _LOOKUP_CHUNK):
                connection.execute(delete(_FILES).where(_FILES.c.path_key.in_(keys[start:start + _LOOKUP_CHUNK])))


def record_checks(lake_table: IcebergTable, checks: Sequence[FileCheck]) -> None:
    """Record ``checks`` in the checksum store of ``lake_table``'s catalog (a no-op for a catalog
    that is not a SQL database)."""
    store = ChecksumStore.of(lake_table)
    if store is not None and checks:
        store.record(checks)


# ---- verifying ------------------------------------------------------------------------------------
def verify_file(io: FileIO, location: str, recorded_size: int, check: FileCheck | None) -> DamagedFile | None:
    """Read ``location`` through and compare its size with ``recorded_size`` (the manifest's) and
    its CRC with ``check`` (None: size only). Raises what the file system raises but a missing
    file (lake failures: the caller's ``lake_failures``)."""
    try:
        with io.new_input(location).open(seekable=False) as stream:
            return check_stream(getattr(stream, "read_buffer", None) or stream.read, location, recorded_size, check)
    except FileNotFoundError as exc:
        return DamagedFile(location, "missing", str(exc).splitlines()[0] if str(exc) else "not found")


_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _verifier() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="lake-verify")
        return _pool


class Verification:
    """The checks of some files of a lake table, running in the background (one task per file;
    a task never waits on another, so concurrent reads cannot starve the pool). ``checks`` (by
    file system path) default to the recorded ones, looked up now."""

    def __init__(self, lake_table: IcebergTable, files: Sequence[DataFile], what: str,
                 checks: Mapping[str, FileCheck] | None = None) -> None:
        self.what = what
        io = lake_table.io
        paths = {f.file_path: key_path(io, f.file_path) for f in files}
        if checks is None and files:
            store = ChecksumStore.of(lake_table)
            checks = store.lookup(set(paths.values())) if store is not None else {}
        checks = checks or {}
        self._inline = [(f, checks.get(paths[f.file_path])) for f in files] if len(files) == 1 else []
        self._io = io
        self._futures: list[Future] = [] if len(files) <= 1 else [
            _verifier().submit(verify_file, io, f.file_path, f.file_size_in_bytes, checks.get(paths[f.file_path]))
            for f in files]

    def result(self) -> dict[str, DamagedFile]:
        """The damaged files by location. Lake failures other than a missing file raise
        LakeUnavailable."""
        with lake_failures(self.what):
            results = [verify_file(self._io, f.file_path, f.file_size_in_bytes, check) for f, check in self._inline]
            results += [future.result() for future in self._futures]
        return {damaged.location: damaged for damaged in results if damaged is not None}


def verify_files(lake_table: IcebergTable, files: Sequence[DataFile], what: str,
                 checks: Mapping[str, FileCheck] | None = None) -> dict[str, DamagedFile]:
    """Check ``files`` of ``lake_table`` (in parallel); returns the damaged ones by location."""
    return Verification(lake_table, files, what, checks).result()


def file_span(lake_table: IcebergTable, data_file: DataFile) -> tuple[int, int] | None:
    """``(bucket, first offset)`` of a data file's rows, from the ``__bucket`` and ``__offset``
    bounds its manifest entry records (None when they are not recorded or span buckets)."""
    schema = lake_table.schema()
    bucket_id = schema.find_field(BUCKET_COLUMN).field_id
    offset_id = schema.find_field(OFFSET_COLUMN).field_id
    lower, upper = data_file.lower_bounds or {}, data_file.upper_bounds or {}
    low_bucket, high_bucket, first = lower.get(bucket_id), upper.get(bucket_id), lower.get(offset_id)
    if low_bucket is None or low_bucket != high_bucket or first is None:
        return None
    return (int.from_bytes(low_bucket, "little", signed=True), int.from_bytes(first, "little", signed=True))


class DamageLog:
    """Damaged lake files that reads met, per table and bucket, for ``t$lake$status`` (the newest
    :data:`MAX_PER_TABLE` per table; a file that checks out again is dropped). Thread-safe."""

    MAX_PER_TABLE = 100

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._files: dict[str, OrderedDict[str, tuple[int | None, DamagedFile]]] = {}

    def report(self, table: str, bucket: int | None, damaged: DamagedFile) -> None:
        with self._lock:
            files = self._files.setdefault(str(table), OrderedDict())
            files.pop(damaged.location, None)
            files[damaged.location] = (bucket, damaged)
            while len(files) > self.MAX_PER_TABLE:
                files.popitem(last=False)

    def clear(self, table: str, locations: Iterable[str]) -> None:
        with self._lock:
            files = self._files.get(str(table))
            if files:
                for location in locations:
                    files.pop(location, None)

    def damaged(self, table: str) -> dict[int | None, list[str]]:
        """``{bucket: [descriptions of its damaged files]}`` of ``table``."""
        with self._lock:
            files = list(self._files.get(str(table), {}).values())
        out: dict[int | None, list[str]] = {}
        for bucket, damaged in files:
            out.setdefault(bucket, []).append(damaged.describe())
        return out


class DamageHandler(Protocol):
    """What a read does about damaged lake files (the union read: :mod:`flightstore.lake.union`)."""

    def take_over(self, damaged: DamagedFile, span: tuple[int, int]) -> bool:
        """Whether the caller reads the bucket of ``damaged`` from its first offset on elsewhere
        (``span``: (bucket, first offset)); False: the read fails with DATA_LOSS."""

    def checked(self, locations: Sequence[str]) -> None:
        """``locations`` checked out whole (a file reported damaged before may have been restored)."""
