"""A tiering round's source over a table of a cluster: every bucket read at its leader.

The server that holds the cluster's tiering lease (:mod:`flightstore.lake.cluster`) tiers tables
whose buckets other servers lead. :class:`ClusterSource` gives
:func:`~flightstore.lake.tiering.tier_round` what it reads, through the table interface only
(:class:`~flightstore.table.api.TableApi`, here a :class:`~flightstore.cluster.table.ClusterTable`):
each bucket's start offset and high watermark, its committed changelog between two offsets, and
a primary-key bucket's rows at an offset, each from the bucket's leader. Changelog rows become
lake rows exactly as the Spark job's do (:func:`flightstore.lake.remote.lake_changes`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flightstore import changetype
from flightstore.lake.changes import snapshot_rows
from flightstore.lake.layout import lake_schema
from flightstore.lake.remote import from_ipc, ipc, lake_changes
from flightstore.table.api import TableApi

__all__ = ["ClusterSource"]


class ClusterSource:
    """What a tiering round reads of a cluster table (a :class:`~flightstore.table.api.TableApi`
    that routes each bucket to its leader): per-bucket offsets, each bucket's committed changelog
    and a primary-key bucket's rows at an offset, the same three things
    :class:`~flightstore.lake.tiering.StoreSource` reads of a local table."""

    def __init__(self, table: TableApi) -> None:
        self.table = table
        self.path = table.path
        self.descriptor = table.descriptor
        self._starts: dict[int, int] = {}

    def offsets(self) -> tuple[dict[int, int], dict[int, int]]:
        """Per bucket, the leader's log start and high watermark."""
        self._starts = self.table.start_offsets()
        return dict(self._starts), self.table.end_offsets()

    def read_changes(self, start: Mapping[int, int], end: Mapping[int, int], max_rows: int | None
                     ) -> tuple[pa.Table, np.ndarray | None, dict[int, int]]:
        """Every bucket's changelog in ``[start, end)``, bucket by bucket, at most about
        ``max_rows`` rows: each leader stops after the record that reaches what is left."""
        reached = dict(start)
        parts = []
        budget = max_rows
        for bucket in sorted(end):
            if start[bucket] >= end[bucket] or (budget is not None and budget <= 0):
                continue
            batches = self.table.read_changelog(bucket, start[bucket], to_offset=end[bucket], max_rows=budget)
            rows, reached[bucket] = lake_changes(batches, bucket, self.descriptor, start[bucket], end[bucket], None)
            parts.append(rows)
            if budget is not None:
                budget -= rows.num_rows
        schema = lake_schema(self.descriptor)
        pk = self.descriptor.has_primary_key
        if not parts:
            return schema.empty_table(), (np.empty(0, np.int8) if pk else None), reached
        # Buffers off the Flight wire may be unaligned, which pyiceberg-core's bucket transform
        # refuses: one copy through IPC aligns them.
        rows = from_ipc(ipc(pa.concat_tables(parts)))
        kinds = None
        if pk:
            kinds = rows.column(changetype.CHANGE_TYPE_COLUMN).to_numpy()
            rows = rows.drop_columns([changetype.CHANGE_TYPE_COLUMN])
        return rows, kinds, reached

    def rows_at(self, bucket: int, at: int, schema: pa.Schema) -> list[pa.RecordBatch]:
        """A primary-key bucket entering the lake: its rows at offset ``at`` (at its leader),
        stamped with the time of its last change."""
        rows = pa.Table.from_batches(list(self.table.read_snapshot(bucket, at, self.descriptor.schema.names)),
                                     schema=pa.schema([changetype.snapshot_schema(self.descriptor.schema).field(c)
                                                       for c in self.descriptor.schema.names]))
        last_ms = None
        if self._starts.get(bucket, 0) < at:
            for batch in self.table.read_changelog(bucket, at - 1, columns=[changetype.COMMIT_TIMESTAMP_COLUMN],
                                                   to_offset=at):
                if batch.num_rows:
                    last_ms = pc.max(batch.column(0).cast(pa.int64())).as_py()
        if last_ms is None:
            last_ms = int(time.time() * 1000)
        rows = from_ipc(ipc(rows))
        return snapshot_rows(rows.to_batches(), bucket, at, last_ms, schema)
