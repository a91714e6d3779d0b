"""A table read through a flightstore server, for tiering rounds that run outside it (the Spark job).

:class:`FlightSource` gives :func:`flightstore.lake.tiering.tier_round` what it reads of a table,
through the server's Flight API only: the descriptor and offsets (``flightstore.describe``), each
bucket's changelog between two offsets (a subscription bounded by ``until``) and a bucket's rows at
an offset (``snapshot`` reads). :func:`read_bucket_changes` reads one bucket and is what a Spark
executor runs; :meth:`FlightSource.read_changes` runs it for every bucket through ``map_buckets``
(sequential by default; the Spark job passes one that fans the buckets out over executors).

Log tables need no folding, so a round's data files need not pass through the process that
commits: :func:`write_bucket_files` reads one bucket's backlog and writes its Iceberg data files
straight to the warehouse (:class:`LakeTarget`: the lake table's metadata and file-IO properties,
serializable), returning only their :class:`~pyiceberg.manifest.DataFile` metadata.
:meth:`FlightSource.write_changes` runs it for every bucket through ``map_writes`` (the Spark job:
one executor task per bucket) and the round commits the returned files in one snapshot. Files a
task wrote for a round that never commits are orphans no snapshot references.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.io import load_file_io
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table as IcebergTable
from pyiceberg.table.metadata import TableMetadataUtil

from flightstore import changetype
from flightstore.client import Connection
from flightstore.errors import Unsupported
from flightstore.lake.changes import snapshot_rows
from flightstore.lake.integrity import FileCheck, write_data_files
from flightstore.lake.layout import lake_rows, lake_schema
from flightstore.schema import TableDescriptor

__all__ = ["BucketFiles", "BucketRead", "FlightSource", "LakeTarget", "from_ipc", "ipc", "lake_changes",
           "read_bucket_changes", "write_bucket_files"]

# One bucket's read: (bucket, start offset, end offset, row budget or None).
BucketRead = tuple[int, int, int, "int | None"]
# What reading it gives: (bucket, lake rows as Arrow IPC bytes, offset reached).
BucketRows = tuple[int, bytes, int]
MapBuckets = Callable[[Sequence[BucketRead]], list[BucketRows]]
# What writing it gives: (bucket, data files written, offset reached, rows in them, the files'
# checks: :mod:`flightstore.lake.integrity`).
BucketFiles = tuple[int, list[DataFile], int, int, list[FileCheck]]
MapWrites = Callable[[Sequence[BucketRead], "LakeTarget"], list[BucketFiles]]


def ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def from_ipc(data: bytes) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all()


def read_bucket_changes(connection: Connection, name: str, descriptor: TableDescriptor,
                        read: BucketRead) -> BucketRows:
    """The lake rows of one bucket's changelog in ``[start, end)`` as Arrow IPC bytes, with the
    int8 change kinds in a ``_change_type`` column on a primary-key table, and the offset reached.

    A row budget stops the read after the record that reaches it: rounds end on record
    boundaries, so a ``-U``/``+U`` pair (one write) is never split between two rounds."""
    bucket, rows, reached = _read_bucket(connection, name, descriptor, read)
    return bucket, ipc(rows), reached


def _read_bucket(connection: Connection, name: str, descriptor: TableDescriptor,
                 read: BucketRead) -> tuple[int, pa.Table, int]:
    bucket, start, end, budget = read
    if start >= end:
        return bucket, lake_changes((), bucket, descriptor, start, end, budget)[0], start
    with connection.table(name).subscribe({bucket: start}, until={bucket: end}) as stream:
        rows, reached = lake_changes(stream, bucket, descriptor, start, end, budget)
    return bucket, rows, reached


def lake_changes(batches: Iterable[pa.RecordBatch], bucket: int, descriptor: TableDescriptor, start: int,
                 end: int, budget: int | None) -> tuple[pa.Table, int]:
    """Lake rows of ``batches`` (one bucket's changelog rows, ``t$changelog`` columns, from offset
    ``start``), with the int8 change kinds in a ``_change_type`` column on a primary-key table, and
    the offset reached (at most ``end``). A ``budget`` of rows stops after the batch that reaches
    it (each batch is one record or ends one, so a round never splits a ``-U``/``+U`` pair).
    Shared by the Spark job's readers and the cluster's tierer
    (:class:`flightstore.lake.cluster.ClusterSource`)."""
    reached = start
    schema = lake_schema(descriptor)
    out = schema.append(pa.field(changetype.CHANGE_TYPE_COLUMN, pa.int8())) \
        if descriptor.has_primary_key else schema
    parts = []
    for batch in batches:
        if batch.num_rows == 0:
            continue
        micros = batch.column(changetype.COMMIT_TIMESTAMP_COLUMN).cast(pa.int64()).to_numpy() * 1000
        rows = lake_rows(batch, bucket, batch.column(changetype.LOG_OFFSET_COLUMN), micros, schema)
        if descriptor.has_primary_key:
            kinds = changetype.from_strings(batch.column(changetype.CHANGE_TYPE_COLUMN))
            rows = pa.RecordBatch.from_arrays(rows.columns + [kinds], schema=out)
        parts.append(rows)
        reached = min(end, batch.column(changetype.LOG_OFFSET_COLUMN)[-1].as_py() + 1)
        if budget is not None:
            budget -= rows.num_rows
            if budget <= 0:
                break
    return pa.Table.from_batches(parts, schema=out), reached


@dataclass(frozen=True)
class LakeTarget:
    """Where a process that is not the committer writes a lake table's data files: the table's
    metadata (JSON) and file-IO properties (warehouse credentials), picklable for Spark tasks."""

    metadata_json: str
    io_properties: dict[str, str]

    @classmethod
    def of(cls, lake_table: IcebergTable) -> LakeTarget:
        return cls(lake_table.metadata.model_dump_json(), dict(lake_table.io.properties))

    def write(self, rows: pa.Table) -> tuple[list[DataFile], list[FileCheck]]:
        """Write ``rows`` (lake rows of one bucket, in offset order) as data files of the table's
        partition spec, under a fresh write id; returns their metadata and checks (the committer
        records them). Nothing is committed."""
        if rows.num_rows == 0:
            return [], []
        metadata = TableMetadataUtil.parse_raw(self.metadata_json)
        io = load_file_io(self.io_properties, metadata.location)
        return write_data_files(metadata, io, rows, uuid.uuid4())


def write_bucket_files(connection: Connection, name: str, descriptor: TableDescriptor, read: BucketRead,
                       target: LakeTarget) -> BucketFiles:
    """Read one bucket of a log table in ``[start, end)`` (as :func:`read_bucket_changes`) and
    write its rows straight to the lake's warehouse: ``(bucket, data files, offset reached, rows,
    the files' checks)``."""
    if descriptor.has_primary_key:
        raise Unsupported(f"table {name} has a primary key: its changelog is folded before it is written")
    bucket, rows, reached = _read_bucket(connection, name, descriptor, read)
    # Buffers straight off the Flight wire may be unaligned, which pyiceberg-core's bucket
    # transform refuses: one copy through IPC aligns them (the driver path gets that copy anyway).
    files, checks = target.write(from_ipc(ipc(rows)))
    return bucket, files, reached, rows.num_rows, checks


class FlightSource:
    """A table of a flightstore server as a tiering round's source (see module docstring)."""

    def __init__(self, connection: Connection, name: str, *, map_buckets: MapBuckets | None = None,
                 map_writes: MapWrites | None = None) -> None:
        self.connection = connection
        self.name = name
        described = connection.table(name).describe()
        self.descriptor = TableDescriptor.from_json(described["descriptor"])
        self.path = self.descriptor.path
        self.table_id: str = described["table_id"]
        self._offsets = (described["start_offsets"], described["end_offsets"])
        self._map = map_buckets or self._sequential
        self._map_writes = map_writes or self._sequential_writes

    def _sequential(self, reads: Sequence[BucketRead]) -> list[BucketRows]:
        return [read_bucket_changes(self.connection, self.name, self.descriptor, read) for read in reads]

    def _sequential_writes(self, reads: Sequence[BucketRead], target: LakeTarget) -> list[BucketFiles]:
        return [write_bucket_files(self.connection, self.name, self.descriptor, read, target) for read in reads]

    @staticmethod
    def _reads(start: Mapping[int, int], end: Mapping[int, int], max_rows: int | None) -> list[BucketRead]:
        """One read per bucket with a backlog; ``max_rows`` shared out between them."""
        pending = sorted(b for b in end if start[b] < end[b])
        share = None if max_rows is None or not pending else max(1, max_rows // len(pending))
        return [(b, start[b], end[b], share) for b in pending]

    def offsets(self) -> tuple[dict[int, int], dict[int, int]]:
        return dict(self._offsets[0]), dict(self._offsets[1])

    def read_changes(self, start: Mapping[int, int], end: Mapping[int, int], max_rows: int | None
                     ) -> tuple[pa.Table, np.ndarray | None, dict[int, int]]:
        """Every bucket's changelog in ``[start, end)``; ``max_rows`` is shared out between the
        buckets (each stops after the record that reaches its share)."""
        reached = dict(start)
        parts = []
        for bucket, data, offset in sorted(self._map(self._reads(start, end, max_rows)),
                                           key=lambda answer: answer[0]):
            parts.append(from_ipc(data))
            reached[bucket] = offset
        schema = lake_schema(self.descriptor)
        pk = self.descriptor.has_primary_key
        if not parts:
            return schema.empty_table(), (np.empty(0, np.int8) if pk else None), reached
        rows = pa.concat_tables(parts)
        kinds = None
        if pk:
            kinds = rows.column(changetype.CHANGE_TYPE_COLUMN).to_numpy()
            rows = rows.drop_columns([changetype.CHANGE_TYPE_COLUMN])
        return rows, kinds, reached

    def write_changes(self, lake_table: IcebergTable, start: Mapping[int, int], end: Mapping[int, int],
                      max_rows: int | None) -> tuple[list[DataFile], list[FileCheck], dict[int, int], int]:
        """A log table's backlog in ``[start, end)`` written as data files of ``lake_table`` where
        ``map_writes`` runs (each bucket's reader writes its own files): the files, their checks,
        the offset each bucket reached and the rows written. Nothing is committed."""
        reached = dict(start)
        files: list[DataFile] = []
        checks: list[FileCheck] = []
        rows = 0
        target = LakeTarget.of(lake_table)
        for bucket, written, offset, count, written_checks in sorted(
                self._map_writes(self._reads(start, end, max_rows), target), key=lambda answer: answer[0]):
            files.extend(written)
            checks.extend(written_checks)
            reached[bucket] = offset
            rows += count
        return files, checks, reached, rows

    def rows_at(self, bucket: int, at: int, schema: pa.Schema) -> list[pa.RecordBatch]:
        table = self.connection.table(self.name)
        rows = table.read_snapshot(bucket, at, columns=self.descriptor.schema.names)
        last_ms = None
        if self._offsets[0].get(bucket, 0) < at:
            with table.subscribe({bucket: at - 1}, columns=[changetype.COMMIT_TIMESTAMP_COLUMN],
                                 until={bucket: at}) as stream:
                for batch in stream:
                    last_ms = pc.max(batch.column(0).cast(pa.int64())).as_py()
        if last_ms is None:
            last_ms = int(time.time() * 1000)
        return snapshot_rows(rows.to_batches(), bucket, at, last_ms, schema)
