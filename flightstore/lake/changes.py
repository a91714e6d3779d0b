"""Primary-key tables in the lake: changelogs folded into upserts and deletes, applied bucket-aligned.

The lake table of a primary-key table holds the table's current rows as of its tiered offsets, one
row per key. A bucket enters the lake with its rows at the log end offset the round saw (its
newest KV snapshot image plus the changelog after it: :meth:`~flightstore.store.Table.rows_at`);
those rows carry ``__offset`` = that offset - 1 and ``__timestamp`` = the time of that last
change. From then on each round reads the bucket's changelog since its tiered offset and folds it:
the last change of each key wins (``-U`` before-images are ignored); a final ``+I``/``+U`` is an
upsert, a final ``-D`` a delete. Partial updates need no special case: the changelog carries full
after-images.

Iceberg format-version 2 lake tables (the default) apply them merge-on-read, with position delete
files (:mod:`flightstore.lake.deletes`). A format-version 1 table applies them here, copy-on-write
restricted to what changed: only the data files of the changed buckets are read (partition and
``__bucket`` statistics prune the rest), and only those holding a changed key are rewritten,
without those keys; the upserted rows are appended. Data files of unchanged buckets are never
touched, so a round costs the changed buckets' files, not the table.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from pyiceberg import expressions as ice
from pyiceberg.io.pyarrow import ArrowScan
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table as IcebergTable
from pyiceberg.table import Transaction

from flightstore import changetype
from flightstore.lake.files import check_intact
from flightstore.lake.integrity import FileCheck, write_data_files
from flightstore.lake.layout import BUCKET_COLUMN, OFFSET_COLUMN, lake_rows

__all__ = ["FoldedChanges", "LakeRewrite", "fold_changes", "plan_rewrite", "snapshot_rows", "sort_for_files",
           "stage_overwrite"]

_ROW = "__row"


@dataclass(frozen=True)
class FoldedChanges:
    """The net effect of a stretch of changelog: ``upserts`` (lake rows, the latest image of each
    key whose last change is ``+I``/``+U``) and ``touched`` (primary key + ``__bucket`` of every
    changed key, upserted or deleted)."""

    upserts: pa.Table
    touched: pa.Table

    @property
    def deleted(self) -> int:
        return self.touched.num_rows - self.upserts.num_rows


def fold_changes(changes: pa.Table, kinds: np.ndarray, primary_key: Sequence[str]) -> FoldedChanges:
    """Fold lake rows of changelog ``changes`` (bucket by bucket, each in offset order) with their
    change ``kinds`` (int8 codes) into the last change of each key. Vectorized: one group-by."""
    keep = kinds != changetype.UPDATE_BEFORE
    rows = changes.filter(pa.array(keep)) if not keep.all() else changes
    kinds = kinds[keep]
    numbered = rows.select(list(primary_key)).append_column(_ROW, pa.array(np.arange(rows.num_rows)))
    last = numbered.group_by(list(primary_key), use_threads=False).aggregate([(_ROW, "max")])
    latest = np.sort(last.column(f"{_ROW}_max").to_numpy())
    latest_rows = rows.take(pa.array(latest))
    upserts = latest_rows.filter(pa.array(kinds[latest] != changetype.DELETE))
    return FoldedChanges(upserts, latest_rows.select([*primary_key, BUCKET_COLUMN]))


def snapshot_rows(batches: Iterable[pa.RecordBatch], bucket: int, at: int, timestamp_ms: int,
                  schema: pa.Schema) -> list[pa.RecordBatch]:
    """Lake rows of a bucket's rows as of offset ``at`` (``rows_at``): ``__offset`` = ``at - 1``,
    ``__timestamp`` = ``timestamp_ms`` (the last change's time)."""
    out = []
    for batch in batches:
        n = batch.num_rows
        out.append(lake_rows(batch, bucket, pa.array(np.full(n, at - 1, dtype=np.int64)),
                             np.full(n, timestamp_ms * 1000, dtype=np.int64), schema))
    return out


@dataclass(frozen=True)
class LakeRewrite:
    """The data files a round replaces (``removed``) and the rows they keep (``kept``)."""

    removed: list[DataFile]
    kept: pa.Table
    files_read: int

    @property
    def removed_bytes(self) -> int:
        return sum(f.file_size_in_bytes for f in self.removed)


def plan_rewrite(lake_table: IcebergTable, touched: pa.Table, primary_key: Sequence[str],
                 schema: pa.Schema) -> LakeRewrite:
    """Which current data files of ``lake_table`` hold a ``touched`` key, and their other rows.

    Only the files of the touched buckets are read; a file is removed only if it holds one of the
    keys. ``schema`` is the lake's Arrow schema the kept rows are cast to.
    """
    if touched.num_rows == 0 or lake_table.current_snapshot() is None:
        return LakeRewrite([], schema.empty_table(), 0)
    buckets = sorted(set(touched.column(BUCKET_COLUMN).to_pylist()))
    scan = lake_table.scan(row_filter=ice.In(BUCKET_COLUMN, buckets))
    tasks = list(scan.plan_files())
    name = ".".join(lake_table.name())  # a damaged file stops the round (DATA_LOSS naming it)
    check_intact(lake_table, None, [t.file for t in tasks], name, f"rewriting the lake files of {name}")
    keys = touched.select(list(primary_key))
    removed, kept, read = [], [], 0
    for task in tasks:
        rows = ArrowScan(table_metadata=lake_table.metadata, io=lake_table.io,
                         projected_schema=lake_table.schema(), row_filter=ice.AlwaysTrue()
                         ).to_table(tasks=[task])
        read += 1
        rows = rows.select(schema.names).cast(schema)
        numbered = rows.select(list(primary_key)).append_column(_ROW, pa.array(np.arange(rows.num_rows)))
        survivors = numbered.join(keys, keys=list(primary_key), join_type="left anti", use_threads=False)
        if survivors.num_rows == rows.num_rows:
            continue
        removed.append(task.file)
        kept.append(rows.take(pa.array(np.sort(survivors.column(_ROW).to_numpy()))))
    kept_rows = pa.concat_tables(kept) if kept else schema.empty_table()
    return LakeRewrite(removed, kept_rows, read)


def stage_overwrite(transaction: Transaction, removed: list[DataFile], rows: pa.Table,
                    properties: dict[str, str]) -> list[FileCheck]:
    """Stage one snapshot in ``transaction`` that drops ``removed`` and adds ``rows`` (written now
    as data files, split by partition). Returns the checks of the files written (to record
    before the commit)."""
    commit_uuid = uuid.uuid4()
    with transaction.update_snapshot(snapshot_properties=properties).overwrite(commit_uuid=commit_uuid) as overwrite:
        for data_file in removed:
            overwrite.delete_data_file(data_file)
        written, checks = write_data_files(transaction.table_metadata, transaction._table.io, rows, commit_uuid,
                                           itertools.count(0))
        for data_file in written:
            overwrite.append_data_file(data_file)
    return checks


def sort_for_files(rows: pa.Table) -> pa.Table:
    """Rows in ``(__bucket, __offset)`` order: each data file ends up sorted by offset."""
    return rows.sort_by([(BUCKET_COLUMN, "ascending"), (OFFSET_COLUMN, "ascending")])
