"""Lake files read where no catalog is at hand (a Spark executor's lake split): the files the
server planned, checked (size and whole-file CRC-32) and decoded straight from the warehouse.

Only pyarrow is imported here, never pyiceberg, SQLAlchemy or Arrow's Acero: a fresh Spark Python
worker that reads a lake split pays seconds of CPU for each of those (pyiceberg's ``io.pyarrow``
alone imported in ~3 s on a busy 2-core machine, more than the whole read). A local warehouse
(``file://`` or a plain path) is opened with Arrow's local file system; any other scheme (S3,
GCS...) goes through pyiceberg's ``PyArrowFileIO`` with the split's file-IO properties, imported
then.

The checks are those of :mod:`flightstore.lake.integrity` (which takes :class:`FileCheck`,
:class:`DamagedFile`, :func:`check_stream` and :func:`damage_error` from here): a damaged file is
DATA_LOSS naming it; a missing one is :class:`~flightstore.errors.LakeFileMissing` (its snapshot
expired meanwhile, or the warehouse lost it: run the read again); any other failure of the
warehouse is :class:`~flightstore.errors.LakeUnavailable`.
"""

from __future__ import annotations

import contextlib
import logging
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urlparse

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from flightstore import memory
from flightstore.errors import DataLoss, LakeFileMissing, LakeUnavailable

__all__ = ["DamagedFile", "FileCheck", "check_stream", "damage_error", "missing_file_error", "read_data_files",
           "read_live_rows"]

log = logging.getLogger("flightstore.lake")

_CHUNK = 4 << 20  # bytes read per step of a CRC


@dataclass(frozen=True)
class FileCheck:
    """What was written to ``path`` (the file's path in its file system, see
    :func:`flightstore.lake.integrity.key_path`): ``size`` bytes whose CRC-32 (zlib's, Parquet's
    page checksum polynomial) is ``crc32``."""

    path: str
    size: int
    crc32: int


@dataclass(frozen=True)
class DamagedFile:
    """A lake file that fails its checks: ``location`` (as the manifest names it), ``problem``
    (``missing``, ``truncated``, ``size`` or ``checksum``) and what was found."""

    location: str
    problem: str
    detail: str

    def describe(self) -> str:
        return f"lake file {self.location} is {_WORDS[self.problem]} ({self.detail})"


_WORDS = {"missing": "missing", "truncated": "truncated", "size": "not the size recorded",
          "checksum": "corrupt"}


def check_stream(read: Callable[[int], bytes], location: str, recorded_size: int,
                 check: FileCheck | None) -> DamagedFile | None:
    """Read a file through with ``read`` (a stream's ``read``) and compare its size with
    ``recorded_size`` (the manifest's) and its CRC with ``check`` (None: size only)."""
    crc, size = 0, 0
    while True:
        chunk = read(_CHUNK)
        if not chunk:
            break
        crc = zlib.crc32(chunk, crc)
        size += len(chunk)
    expected = check.size if check is not None else int(recorded_size)
    if size != int(recorded_size) or size != expected:
        problem = "truncated" if size < int(recorded_size) else "size"
        return DamagedFile(location, problem, f"{size} bytes, {recorded_size} recorded")
    if check is not None and crc != check.crc32:
        return DamagedFile(location, "checksum", f"CRC-32 {crc:08x}, {check.crc32:08x} recorded")
    return None


def damage_error(where: str, damaged: DamagedFile, why: str = "") -> DataLoss:
    """The DATA_LOSS of a read (of ``where``: "table db.t") that met ``damaged`` (``why``: why
    the log cannot answer instead)."""
    log.error("%s: %s%s", where, damaged.describe(), f"; {why}" if why else "")
    return DataLoss(f"{where}: {damaged.describe()}{'; ' + why if why else ''}")


def missing_file_error(what: str, cause: object, which: str = "the snapshot") -> LakeFileMissing:
    """A lake file of ``which`` snapshot, the one a read was planned on, is gone (``cause``)."""
    return LakeFileMissing(
        f"{what}: a lake file is gone ({cause}): {which} the read was planned on was expired "
        "meanwhile (table.datalake.snapshot.retention) or the warehouse lost it; run the read again")


@contextlib.contextmanager
def _failures(what: str) -> Iterator[None]:
    """A missing file is LakeFileMissing (its snapshot was expired meanwhile or the warehouse lost
    it), any other failure of the warehouse LakeUnavailable; DATA_LOSS passes as it is."""
    try:
        yield
    except FileNotFoundError as exc:
        raise missing_file_error(what, exc) from exc
    except pa.ArrowException as exc:
        if "checksum" in str(exc).lower():  # a page that no longer matches its CRC
            raise DataLoss(f"{what}: a page fails its checksum ({exc})") from exc
        raise LakeUnavailable(f"{what}: {exc}") from exc
    except OSError as exc:
        raise LakeUnavailable(f"{what}: {exc}") from exc


class _Warehouse:
    """Opens lake files by location: Arrow's local file system for ``file://`` and plain paths,
    pyiceberg's ``PyArrowFileIO`` (imported on first use) for any other scheme."""

    def __init__(self, io_properties: Mapping[str, str]) -> None:
        self.properties = dict(io_properties)
        self._io = None

    def _file_system(self, location: str):
        parsed = urlparse(location)
        if parsed.scheme in ("", "file"):
            from pyarrow import fs
            return fs.LocalFileSystem(), (parsed.path if parsed.scheme else location)
        if self._io is None:
            from pyiceberg.io.pyarrow import PyArrowFileIO
            self._io = PyArrowFileIO(self.properties)
        scheme, netloc, path = self._io.parse_location(location, self._io.properties)
        return self._io.fs_by_scheme(scheme, netloc), path

    def stream(self, location: str):
        file_system, path = self._file_system(location)
        return file_system.open_input_stream(path)

    def file(self, location: str):
        file_system, path = self._file_system(location)
        return file_system.open_input_file(path)


def _verify_planned(warehouse: _Warehouse, planned: str | Mapping, what: str) -> None:
    """Check a planned file (size and CRC-32) before it is decoded (a bare location: not checked)."""
    if isinstance(planned, str) or planned.get("bytes") is None:
        return
    location = str(planned["path"])
    crc = planned.get("crc32")
    check = None if crc is None else FileCheck(location, int(planned["bytes"]), int(crc))
    with warehouse.stream(location) as stream:
        damaged = check_stream(stream.read, location, int(planned["bytes"]), check)
    if damaged is not None:
        raise damage_error(what, damaged)


def _decode(warehouse: _Warehouse, location: str, fields: pa.Schema) -> Iterator[pa.RecordBatch]:
    """``fields`` of one Parquet file, batch by batch, page checksums verified."""
    with warehouse.file(location) as source:
        parquet = pq.ParquetFile(source, page_checksum_verification=True)
        for batch in parquet.iter_batches(batch_size=memory.batch_rows(fields, 131_072), columns=fields.names,
                                          use_threads=False):
            yield batch if batch.schema.equals(fields) else batch.select(fields.names).cast(fields)


def _guarded(batches: Iterator[pa.RecordBatch], what: str) -> Iterator[pa.RecordBatch]:
    """``batches``, each one's decoding under :func:`_failures` (not the caller's work on it)."""
    while True:
        with _failures(what):
            batch = next(batches, None)
        if batch is None:
            return
        yield batch


def read_data_files(files: Sequence[str | Mapping], io_properties: Mapping[str, str], schema: pa.Schema,
                    columns: Sequence[str]) -> Iterator[pa.RecordBatch]:
    """``columns`` of lake data files read straight from the warehouse (a Spark executor's lake
    split): ``files`` are locations, or the server's planned files (``path``, ``bytes`` and
    ``crc32``, :func:`flightstore.lake.union.plan_split`), each checked before it is decoded
    (DATA_LOSS naming a damaged one); ``schema`` is the files' Arrow schema
    (:func:`~flightstore.lake.layout.lake_schema`), ``io_properties`` pyiceberg file-IO
    properties (S3 endpoint and credentials...)."""
    warehouse = _Warehouse(io_properties)
    fields = pa.schema([schema.field(c) for c in columns])
    for planned in files:
        location = planned if isinstance(planned, str) else str(planned["path"])
        what = f"reading lake data file {location}"
        with _failures(what):
            _verify_planned(warehouse, planned, what)
        yield from _guarded(_decode(warehouse, location, fields), what)


def read_live_rows(file: str | Mapping, delete_locations: Sequence[str], io_properties: Mapping[str, str],
                   schema: pa.Schema, columns: Sequence[str]) -> Iterator[pa.RecordBatch]:
    """``columns`` of one lake data file of a primary-key table (a location or a planned file,
    checked first) without the rows its position delete files (``delete_locations``, as planned
    for this file) delete: a Spark executor's read of a lake snapshot, straight from the warehouse."""
    if not delete_locations:
        yield from read_data_files([file], io_properties, schema, columns)
        return
    warehouse = _Warehouse(io_properties)
    location = file if isinstance(file, str) else str(file["path"])
    what = f"reading lake data file {location}"
    fields = pa.schema([schema.field(c) for c in columns])
    with _failures(what):
        _verify_planned(warehouse, file, what)
        deleted = []
        for delete in delete_locations:
            with warehouse.file(delete) as source:
                positions = pq.ParquetFile(source).read(columns=["file_path", "pos"], use_threads=False)
            deleted.append(positions.filter(pc.equal(positions.column("file_path"), location)).column("pos")
                           .to_numpy())
        gone = np.unique(np.concatenate(deleted)) if deleted else np.empty(0, np.int64)
        decoded = _decode(warehouse, location, fields)
    at = 0
    for batch in _guarded(decoded, what):
        keep = ~np.isin(np.arange(at, at + batch.num_rows, dtype=np.int64), gone, assume_unique=True)
        at += batch.num_rows
        if keep.all():
            yield batch
        elif keep.any():
            yield batch.filter(pa.array(keep))
