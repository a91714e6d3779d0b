"""One tiering round of a log table: the log since the last commit -> one Iceberg snapshot.

A round

1. reloads the lake table and reads the tiered offset of every bucket from its last committed
   tiering snapshot (:mod:`flightstore.lake.offsets`);
2. reads each bucket's log from there up to the end offset it saw at the start (at most
   ``max_rows`` rows in all, so memory stays bounded; a longer backlog takes several rounds);
3. appends those rows (the table's columns + ``__bucket``, ``__offset``, ``__timestamp``, in offset
   order) and commits ONE snapshot whose summary records the new offset of every bucket.

The commit is the only step with an effect anyone sees: it swaps the data files and the offsets in
together, and it asserts that the table still is at the snapshot the round started from. A round
that dies anywhere (before writing, after writing data files, after committing) is therefore
redone from the last committed offsets by the next one: no row twice, none missing. Data files of
a round that died before its commit are orphans no snapshot references.

The same function serves the server's background tierer and (phase 2) the Spark tiering job.
Primary-key tables (changelog applied as upserts and deletes per bucket) plug in beside
:func:`tier_log_round` later.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa
from pyiceberg.table import Table as IcebergTable

from flightstore.errors import CorruptData, DataLoss, Unsupported
from flightstore.lake.catalog import lake_failures
from flightstore.lake.layout import lake_batch, lake_schema
from flightstore.lake.offsets import OFFSETS_PROPERTY, committed_offsets, encode_offsets, tiering_snapshots
from flightstore.schema import TablePath
from flightstore.store import Table

__all__ = ["PHASES", "RoundResult", "read_backlog", "tier_log_round"]

# Points of a round a hook is called at (tests kill the process there).
PHASES = ("before-write", "after-write", "after-commit")


@dataclass(frozen=True)
class RoundResult:
    """What one round did: ``rows`` tiered (``committed`` when > 0), the offsets it started from
    and reached; ``snapshot_id``/``committed_at_ms`` of the lake's latest tiering snapshot after the
    round (None before the first); ``backlog_left`` when ``max_rows`` stopped it short."""

    path: TablePath
    rows: int
    start_offsets: dict[int, int]
    end_offsets: dict[int, int]
    committed: bool = False
    snapshot_id: int | None = None
    committed_at_ms: int | None = None
    seconds: float = 0.0
    backlog_left: bool = False


def read_backlog(table: Table, start: dict[int, int], end: dict[int, int],
                 max_rows: int | None) -> tuple[pa.Table, dict[int, int]]:
    """The lake rows of every bucket's log in ``[start, end)``, at most about ``max_rows``.

    Returns the rows (bucket by bucket, each in offset order) and the offset each bucket was read
    up to. A bucket whose ``start`` lies below the log's start offset lost untiered records:
    :class:`DataLoss`; a ``start`` past the log's end means the lake is ahead of the log:
    :class:`CorruptData`. Neither happens while the retention guard holds.
    """
    schema = lake_schema(table.descriptor)
    batches: list[pa.RecordBatch] = []
    reached = dict(start)
    budget = max_rows
    for bucket, log in enumerate(table.logs):
        begin, stop = start[bucket], end[bucket]
        if begin < log.start_offset:
            raise DataLoss(f"table {table.path} bucket {bucket}: log records [{begin}, {log.start_offset}) "
                           "were deleted before they were tiered into the lake")
        if begin > log.end_offset:
            raise CorruptData(f"table {table.path} bucket {bucket}: the lake holds offsets up to {begin} "
                              f"but the log ends at {log.end_offset}")
        if budget is not None and budget <= 0:
            continue
        for record in log.read(begin, to_offset=stop, max_rows=budget):
            batch = lake_batch(record, bucket, schema)
            batches.append(batch)
            reached[bucket] = min(record.next_offset, stop)
            if budget is not None:
                budget -= batch.num_rows
    return pa.Table.from_batches(batches, schema=schema), reached


def tier_log_round(table: Table, lake_table: IcebergTable, *, max_rows: int | None = None,
                   before_commit: Callable[[], None] | None = None,
                   hook: Callable[[str], None] | None = None) -> RoundResult:
    """Run one round for log table ``table`` into its lake table; see the module docstring.

    ``before_commit`` runs right before the catalog commit (the tierer renews its lease there and
    raises if it lost it); ``hook(phase)`` is called at each of :data:`PHASES`. Lake failures raise
    :class:`~flightstore.errors.LakeUnavailable`; nothing is committed then.
    """
    if table.has_primary_key:
        raise Unsupported(f"table {table.path}: tiering primary-key tables is not supported yet")
    began = time.monotonic()
    with lake_failures(f"reading the lake state of {table.path}"):
        lake_table = lake_table.refresh()
    recorded = committed_offsets(lake_table)
    log_start = table.start_offsets()
    start = {bucket: recorded.get(bucket, log_start[bucket]) for bucket in range(table.num_buckets)}
    end = table.end_offsets()
    rows, reached = read_backlog(table, start, end, max_rows)
    backlog_left = any(reached[b] < end[b] for b in end)
    if rows.num_rows == 0:
        latest = next(iter(tiering_snapshots(lake_table)), None)
        return RoundResult(table.path, 0, start, start,
                           snapshot_id=latest.snapshot_id if latest is not None else None,
                           committed_at_ms=latest.timestamp_ms if latest is not None else None,
                           seconds=time.monotonic() - began)
    if hook is not None:
        hook("before-write")
    with lake_failures(f"writing the lake files of {table.path}"):
        transaction = lake_table.transaction()
        transaction.append(rows, snapshot_properties={OFFSETS_PROPERTY: encode_offsets(reached)})
    if hook is not None:
        hook("after-write")
    if before_commit is not None:
        before_commit()
    with lake_failures(f"committing the lake snapshot of {table.path}"):
        committed = transaction.commit_transaction()
    snapshot = committed.current_snapshot()
    if hook is not None:
        hook("after-commit")
    return RoundResult(table.path, rows.num_rows, start, reached, committed=True,
                       snapshot_id=snapshot.snapshot_id if snapshot is not None else None,
                       committed_at_ms=snapshot.timestamp_ms if snapshot is not None else None,
                       seconds=time.monotonic() - began, backlog_left=backlog_left)
