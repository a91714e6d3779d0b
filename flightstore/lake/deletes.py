"""Merge-on-read for primary-key tables: Iceberg v2 position delete files, written by flightstore.

A round of a primary-key table no longer rewrites the data files holding changed keys. For each
changed bucket it

1. finds the ``(file_path, pos)`` of each changed key's live row: only the key columns of the
   bucket's current data files are read (each file checked first: size and whole-file CRC,
   :mod:`flightstore.lake.integrity`), and rows the bucket's delete files already delete are
   skipped (:func:`plan_deletes`);
2. writes ONE position delete file for the bucket (Iceberg's schema: ``file_path`` string, field
   id 2147483546, ``pos`` long, field id 2147483545, sorted by ``file_path, pos``; in the bucket's
   partition) (:func:`write_position_deletes`);
3. lets the round append the upserted rows as new data files; all of it is committed in the
   round's one snapshot by :func:`stage_row_delta` (delete files in a ``deletes`` manifest, data
   files in a ``data`` manifest, the round's summary properties).

Readers (pyiceberg, DuckDB's ``iceberg_scan``, Spark's Iceberg reader) apply a delete file to
the data files of its partition whose data sequence number is not newer than its own: the data
file the same snapshot adds is unaffected (its rows are not in the delete file anyway).

Compaction: when a bucket's deleted rows would exceed ``table.datalake.delete-compaction-ratio``
of its live rows, the round rewrites that bucket copy-on-write instead (its live rows minus the
changed keys, in new data files) and drops its data and delete files: what a round writes stays
bounded by the changed buckets' size, and reads do not slow down forever.

Only format-version 2 lake tables take this path (the lake creates v2 tables); a v1 table, which
cannot hold delete files, keeps the copy-on-write of :mod:`flightstore.lake.changes`.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg import expressions as ice
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.io.pyarrow import ArrowScan, schema_to_pyarrow
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestWriterV2,
)
from pyiceberg.schema import Schema
from pyiceberg.table import Table as IcebergTable
from pyiceberg.table import Transaction
from pyiceberg.table.snapshots import Operation
from pyiceberg.table.update.snapshot import _SnapshotProducer
from pyiceberg.types import LongType, NestedField, StringType

from flightstore.lake.files import check_intact
from flightstore.lake.integrity import FileCheck, checked_parquet_writer, written_check
from flightstore.lake.layout import BUCKET_COLUMN

__all__ = ["DELETE_FILE_SCHEMA", "DeletePlan", "merge_on_read", "plan_deletes", "stage_row_delta",
           "write_position_deletes"]

# The Iceberg spec's position delete schema (reserved field ids).
DELETE_FILE_SCHEMA = Schema(NestedField(2147483546, "file_path", StringType(), required=True),
                            NestedField(2147483545, "pos", LongType(), required=True))
_DELETE_ARROW = schema_to_pyarrow(DELETE_FILE_SCHEMA)
# Exact file_path bounds: a reader matches a delete file to its data files by them.
_DELETE_METRICS = {"write.metadata.metrics.default": "full"}
_ROW = "__row"


def merge_on_read(lake_table: IcebergTable) -> bool:
    """Whether ``lake_table`` can hold position delete files (Iceberg format version 2)."""
    return lake_table.metadata.format_version == 2


@dataclass
class _Bucket:
    """One changed bucket's current files: data files with the positions already deleted, and
    the delete files that delete them."""

    partition: object = None
    spec_id: int = 0
    data_files: list[DataFile] = field(default_factory=list)
    delete_files: dict[str, DataFile] = field(default_factory=dict)
    tasks: list = field(default_factory=list)


@dataclass(frozen=True)
class DeletePlan:
    """What a round does to the lake's current files.

    ``deletes``: per merge-on-read bucket, the ``(file_path, pos)`` rows its delete file holds
    (with the bucket's partition and spec id); ``removed``: data and delete files of compacted
    buckets, whose live rows minus the changed keys are ``kept``; ``files_read``: data files whose
    keys (or rows, when compacted) were read."""

    deletes: dict[int, tuple[pa.Table, object, int]]
    removed: list[DataFile]
    kept: pa.Table
    compacted: list[int]
    files_read: int


def _bucket_of(data_file: DataFile, field_id: int) -> int:
    bound = data_file.lower_bounds[field_id]
    return int.from_bytes(bound, "little", signed=True)


def _current_buckets(lake_table: IcebergTable, buckets: Sequence[int]) -> dict[int, _Bucket]:
    """The current data files of ``buckets`` (partition and ``__bucket`` statistics prune the
    others) with the delete files that apply to them."""
    field_id = lake_table.schema().find_field(BUCKET_COLUMN).field_id
    found: dict[int, _Bucket] = {}
    for task in lake_table.scan(row_filter=ice.In(BUCKET_COLUMN, list(buckets))).plan_files():
        bucket = _bucket_of(task.file, field_id)
        if bucket not in buckets:
            continue
        entry = found.setdefault(bucket, _Bucket(task.file.partition, task.file.spec_id))
        entry.data_files.append(task.file)
        entry.tasks.append(task)
        for delete_file in task.delete_files:
            entry.delete_files[delete_file.file_path] = delete_file
    return found


def _read_parquet(lake_table: IcebergTable, location: str, columns: list[str]) -> pa.Table:
    with lake_table.io.new_input(location).open() as stream:
        return pq.read_table(stream, columns=columns, page_checksum_verification=True)


def _positions_deleted(lake_table: IcebergTable, delete_files: Iterable[DataFile]) -> pa.Table:
    """Every ``(file_path, pos)`` the given delete files hold."""
    parts = [_read_parquet(lake_table, f.file_path, ["file_path", "pos"]).cast(_DELETE_ARROW)
             for f in delete_files]
    return pa.concat_tables(parts) if parts else _DELETE_ARROW.empty_table()


def _located(lake_table: IcebergTable, bucket: _Bucket, keys: pa.Table, primary_key: list[str],
             key_schema: pa.Schema, already: pa.Table) -> pa.Table:
    """``(file_path, pos)`` of the live rows of ``keys`` in the bucket's data files."""
    found = []
    for data_file in bucket.data_files:
        rows = _read_parquet(lake_table, data_file.file_path, primary_key).cast(key_schema)
        numbered = rows.append_column(_ROW, pa.array(np.arange(rows.num_rows, dtype=np.int64)))
        hits = numbered.join(keys, keys=primary_key, join_type="inner", use_threads=False).column(_ROW)
        if not len(hits):
            continue
        positions = np.sort(hits.to_numpy())
        gone = already.filter(pc.equal(already.column("file_path"), data_file.file_path)).column("pos")
        if len(gone):
            positions = positions[~np.isin(positions, gone.to_numpy())]
        found.append(pa.table([pa.repeat(pa.scalar(data_file.file_path, pa.string()), len(positions)),
                               pa.array(positions, pa.int64())], schema=_DELETE_ARROW))
    return pa.concat_tables(found) if found else _DELETE_ARROW.empty_table()


def plan_deletes(lake_table: IcebergTable, touched: pa.Table, upserts: pa.Table, primary_key: Sequence[str],
                 schema: pa.Schema, compaction_ratio: float) -> DeletePlan:
    """Where the ``touched`` keys' live rows are, per bucket, and which buckets to compact.

    A bucket is compacted when its deleted rows after this round would exceed
    ``compaction_ratio`` times its live rows after it (``upserts`` counted in); ``schema`` is the
    lake's Arrow schema.
    """
    primary_key = list(primary_key)
    empty = DeletePlan({}, [], schema.empty_table(), [], 0)
    if touched.num_rows == 0 or lake_table.current_snapshot() is None:
        return empty
    bucket_column = touched.column(BUCKET_COLUMN).to_numpy()
    current = _current_buckets(lake_table, sorted(set(bucket_column.tolist())))
    # Every file the round reads is checked first: a damaged one stops the round (DATA_LOSS
    # naming it) instead of carrying its damage into the files the round writes.
    name = ".".join(lake_table.name())
    check_intact(lake_table, None, [f for files in current.values()
                                    for f in [*files.data_files, *files.delete_files.values()]],
                 name, f"tiering the changes of {name} into its lake files")
    key_schema = pa.schema([schema.field(c) for c in primary_key])
    upserted_buckets = upserts.column(BUCKET_COLUMN).to_numpy()
    deletes, removed, kept, compacted, read = {}, [], [], [], 0
    for bucket, files in sorted(current.items()):
        keys = touched.filter(pa.array(bucket_column == bucket)).select(primary_key).cast(key_schema)
        already = _positions_deleted(lake_table, files.delete_files.values())
        positions = _located(lake_table, files, keys, primary_key, key_schema, already)
        read += len(files.data_files)
        if positions.num_rows == 0:
            continue  # only new keys: the upserts are appended, nothing deleted
        data_rows = sum(f.record_count for f in files.data_files)
        deleted = already.num_rows + positions.num_rows
        live = data_rows - deleted + int(np.count_nonzero(upserted_buckets == bucket))
        if deleted > compaction_ratio * live:
            rows = ArrowScan(table_metadata=lake_table.metadata, io=lake_table.io,
                             projected_schema=lake_table.schema(), row_filter=ice.AlwaysTrue()
                             ).to_table(tasks=files.tasks)
            rows = rows.select(schema.names).cast(schema)
            numbered = rows.select(primary_key).append_column(_ROW, pa.array(np.arange(rows.num_rows)))
            survivors = numbered.join(keys, keys=primary_key, join_type="left anti", use_threads=False)
            kept.append(rows.take(pa.array(np.sort(survivors.column(_ROW).to_numpy()))))
            removed.extend(files.data_files)
            removed.extend(files.delete_files.values())
            compacted.append(bucket)
        else:
            deletes[bucket] = (positions.sort_by([("file_path", "ascending"), ("pos", "ascending")]),
                               files.partition, files.spec_id)
    return DeletePlan(deletes, removed, pa.concat_tables(kept) if kept else schema.empty_table(), compacted, read)


def write_position_deletes(lake_table: IcebergTable, positions: pa.Table, partition: object, spec_id: int,
                           write_uuid: uuid.UUID, bucket: int) -> tuple[DataFile, FileCheck]:
    """Write one position delete file of ``positions`` (sorted ``file_path, pos``) into the
    partition of the data files it refers to; return its :class:`DataFile` and its check (page
    checksums and a whole-file CRC, :mod:`flightstore.lake.integrity`)."""
    location = lake_table.location_provider().new_data_location(
        f"{write_uuid}-deletes-{bucket:05d}.parquet")
    output = lake_table.io.new_output(location)
    writer = checked_parquet_writer(output, DELETE_FILE_SCHEMA, {**lake_table.properties, **_DELETE_METRICS})
    with writer:
        writer.write(positions.cast(_DELETE_ARROW))
    statistics = writer.result()
    check = written_check(lake_table.io, location)
    if check is None:  # never: the writer records it when closed
        raise RuntimeError(f"no checksum was recorded while writing {location}")
    return DataFile.from_args(
        content=DataFileContent.POSITION_DELETES, file_path=location, file_format=FileFormat.PARQUET,
        partition=partition, file_size_in_bytes=len(output), sort_order_id=None, spec_id=spec_id,
        equality_ids=None, key_metadata=None, **statistics.to_serialized_dict()), check


class _DeleteManifestWriter(ManifestWriterV2):
    """A v2 manifest of delete files (pyiceberg 0.12 writes data manifests only)."""

    def content(self) -> ManifestContent:
        return ManifestContent.DELETES

    @property
    def _meta(self) -> dict[str, str]:
        return {**super()._meta, "content": "deletes"}


class _RowDelta(_SnapshotProducer["_RowDelta"]):
    """One snapshot that adds data and position delete files and removes files (of compacted
    buckets), like Iceberg's RowDelta + RewriteFiles. It refuses to commit on top of a snapshot
    other than the one it was planned against (positions would be stale)."""

    def _manifests(self) -> list[ManifestFile]:
        out = []
        spec = self._transaction.table_metadata.spec()
        for content in (DataFileContent.DATA, DataFileContent.POSITION_DELETES):
            files = [f for f in self._added_data_files if f.content == content]
            if not files:
                continue
            writer = (self.new_manifest_writer(spec) if content == DataFileContent.DATA else
                      _DeleteManifestWriter(spec, self.schema(), self.new_manifest_output(), self._snapshot_id,
                                            self._compression))
            with writer:
                for data_file in files:
                    writer.add(ManifestEntry.from_args(status=ManifestEntryStatus.ADDED, snapshot_id=self._snapshot_id,
                                                       sequence_number=None, file_sequence_number=None,
                                                       data_file=data_file))
            out.append(writer.to_manifest_file())
        return out + self._existing_manifests()

    def _existing_manifests(self) -> list[ManifestFile]:
        if self._parent_snapshot_id is None:
            return []
        parent = self._transaction.table_metadata.snapshot_by_id(self._parent_snapshot_id)
        removed = {f.file_path for f in self._deleted_data_files}
        kept = []
        for manifest in parent.manifests(io=self._io):
            if not (manifest.has_added_files() or manifest.has_existing_files()):
                continue
            entries = manifest.fetch_manifest_entry(io=self._io, discard_deleted=True) if removed else []
            if not any(e.data_file.file_path in removed for e in entries):
                kept.append(manifest)
                continue
            spec = self.spec(manifest.partition_spec_id)
            writer = (self.new_manifest_writer(spec) if manifest.content == ManifestContent.DATA else
                      _DeleteManifestWriter(spec, self.schema(), self.new_manifest_output(), self._snapshot_id,
                                            self._compression))
            with writer:
                for entry in entries:
                    if entry.data_file.file_path in removed:
                        writer.delete(entry)
                    else:
                        writer.existing(entry)
            kept.append(writer.to_manifest_file())
        return kept

    def _deleted_entries(self) -> list[ManifestEntry]:
        return []  # written into the rewritten manifests above

    def _validate_concurrency(self) -> None:
        if self._commit_window is not None and not self._commit_window.is_empty():
            raise CommitFailedException("the lake table changed since the round planned its position deletes")


def stage_row_delta(transaction: Transaction, added: Sequence[DataFile], removed: Sequence[DataFile],
                    properties: dict[str, str], commit_uuid: uuid.UUID) -> None:
    """Stage one snapshot in ``transaction`` adding ``added`` (data and position delete files)
    and removing ``removed`` (data and delete files), with summary ``properties``."""
    producer = _RowDelta(operation=Operation.OVERWRITE, transaction=transaction, io=transaction._table.io,
                         commit_uuid=commit_uuid, snapshot_properties=properties)
    with producer:
        for data_file in added:
            producer.append_data_file(data_file)
        for data_file in removed:
            producer.delete_data_file(data_file)
