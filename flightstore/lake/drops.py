"""Dropped partitions leave the lake: their rows are deleted by the next tiering commit.

A partition of a partitioned table is dropped by a catalog change (``ALTER TABLE ... DROP
PARTITION``, auto-partition retention): its buckets disappear from the table, and partition ids are
never reused, so a bucket the lake's tiered offsets still name but the table no longer has is a
bucket of a dropped partition (:func:`dropped_buckets`). Detection needs no record of the drop
itself: a drop that happened while the lake was down, or while no tierer ran, is seen by the first
round that reads the lake afterwards, so nothing is lost and nothing comes back.

The tierer (holding the table's lease) stages an Iceberg delete of those buckets' rows in the same
transaction as the round's data (:func:`stage_drops`). Every data file holds the rows of exactly one
table-wide bucket of one partition (bucket alignment), so the delete predicate
``__bucket IN (<the dropped partition's buckets>)`` matches whole files by their exact integer
statistics: pyiceberg drops them from the manifests (a ``delete`` snapshot, metadata only, no data
file read or rewritten). Matching the table-wide bucket numbers rather than the partition's values
makes the delete exact for this incarnation of the partition: a partition created again with the
same values has new bucket numbers. The delete snapshot records the tiered offsets of every other
bucket unchanged (the dropped buckets removed), so ``committed_offsets``, the status and union
splits never see the dropped buckets again and the next round resumes where the last one ended.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from pyiceberg import expressions as ice
from pyiceberg.table import Table as IcebergTable
from pyiceberg.table import Transaction

from flightstore.lake.layout import BUCKET_COLUMN
from flightstore.schema import TableDescriptor

__all__ = ["dropped_buckets", "stage_drops"]


def dropped_buckets(descriptor: TableDescriptor, recorded: Mapping[int, int],
                    live: Collection[int]) -> list[int]:
    """The buckets the lake's tiered offsets ``recorded`` name that the table no longer has
    (``live``: its table-wide bucket numbers): those of dropped partitions. A table that is not
    partitioned never loses a bucket: none."""
    if not descriptor.is_partitioned:
        return []
    return sorted(b for b in recorded if b not in live)


def stage_drops(transaction: Transaction, lake_table: IcebergTable, buckets: list[int],
                properties: dict[str, str]) -> int:
    """Stage, in ``transaction``, the deletion of every lake row of ``buckets`` as one snapshot
    with summary ``properties``. Returns the number of data files it drops (0: the buckets held no
    rows; no snapshot is staged then, the round's own commit records the offsets)."""
    if not buckets or lake_table.current_snapshot() is None:
        return 0
    predicate = ice.In(BUCKET_COLUMN, buckets)
    files = list(lake_table.scan(row_filter=predicate).plan_files())
    if not files:
        return 0
    transaction.delete(predicate, snapshot_properties=properties)
    return len(files)
