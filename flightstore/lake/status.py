"""Tiering status: how far the lake is behind the log, per table and bucket, and why.

Computed from what the tierer last learned from the lake (its tiered offsets, commit time, error, last upkeep)
and from the log as it is now, so it answers while the lake is unreachable: that is exactly when
the lag matters. It is served as the ``t$lake$status`` virtual table and by ``flightstore lake
status``. A process that does not tier (a reader of the lake) gets it from the lake alone with
:func:`lake_status`: offsets and last commit from the lake's latest tiering snapshot, no error.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields

import pyarrow as pa

from flightstore.changetype import COMMIT_TIMESTAMP_COLUMN
from flightstore.errors import OffsetOutOfRange
from flightstore.table.api import TableApi

__all__ = ["BucketStatus", "TableStatus", "bucket_statuses", "lake_status"]


@dataclass(frozen=True)
class BucketStatus:
    """One bucket: the lake holds offsets below ``tiered_offset`` (None: not known yet), the log
    ends at ``log_end_offset``; ``lag_records`` rows wait, the oldest since ``lag_seconds``;
    ``damaged_files``: the bucket's lake files that reads of this process found damaged
    (missing, truncated, corrupt: :mod:`flightstore.lake.integrity`), each described."""

    bucket: int
    tiered_offset: int | None
    log_end_offset: int
    lag_records: int
    lag_seconds: float
    damaged_files: tuple[str, ...] = ()


@dataclass(frozen=True)
class TableStatus:
    """One datalake-enabled table. ``last_commit_ms`` is the wall-clock time of the last tiering
    commit, ``last_error`` the error of the latest failed attempt (None once a round succeeds)."""

    table: str
    buckets: tuple[BucketStatus, ...]
    last_commit_ms: int | None
    last_snapshot_id: int | None
    last_error: str | None
    last_error_ms: int | None
    consecutive_failures: int
    tierer: str | None
    last_upkeep_ms: int | None = None  # the lake upkeep's last run (flightstore.lake.upkeep)
    upkeep_expired_snapshots: int = 0  # snapshots it expired
    upkeep_removed_files: int = 0  # files it deleted: of expired snapshots, and orphans
    upkeep_error: str | None = None  # the error of its latest attempt (None once one succeeds)

    @property
    def lag_records(self) -> int:
        return sum(b.lag_records for b in self.buckets)

    @property
    def lag_seconds(self) -> float:
        return max((b.lag_seconds for b in self.buckets), default=0.0)

    def to_dict(self) -> dict:
        return asdict(self) | {"lag_records": self.lag_records, "lag_seconds": self.lag_seconds}

    @classmethod
    def from_dict(cls, data: dict) -> TableStatus:
        """The status :meth:`to_dict` gave (another server's, in a cluster)."""
        known = {f.name for f in fields(cls)} - {"buckets"}
        buckets = tuple(BucketStatus(**b) for b in data["buckets"])
        return cls(buckets=buckets, **{k: v for k, v in data.items() if k in known})


def bucket_statuses(table: TableApi, tiered: dict[int, int] | None, now_ms: int | None = None,
                    damaged: Mapping[int | None, list[str]] | None = None) -> tuple[BucketStatus, ...]:
    """Per-bucket lag of ``table`` given the ``tiered`` offsets (None: unknown; the lag then counts
    from the log's start). ``lag_seconds`` is the age of the oldest untiered record. Only the
    table interface is read (in a cluster each bucket's offsets come from its leader). ``damaged``:
    descriptions of damaged lake files by bucket (:meth:`~flightstore.lake.integrity.DamageLog.damaged`)."""
    damaged = damaged or {}
    now = int(time.time() * 1000) if now_ms is None else int(now_ms)
    starts, ends = table.start_offsets(), table.end_offsets()
    statuses = []
    for bucket, end in sorted(ends.items()):  # table-wide numbers when partitioned
        start = starts.get(bucket, 0)
        known = None if tiered is None else tiered.get(bucket, start)
        first = start if known is None else max(known, start)
        lag_seconds = 0.0
        if first < end:
            oldest = _oldest_ms(table, bucket, first)
            if oldest is not None:
                lag_seconds = max(0.0, (now - oldest) / 1000)
        statuses.append(BucketStatus(bucket, known, end, max(0, end - first), lag_seconds,
                                     tuple(damaged.get(bucket, ()))))
    return tuple(statuses)


def _oldest_ms(table: TableApi, bucket: int, offset: int) -> int | None:
    """The commit time of the record holding ``offset`` (None: retention deleted it meanwhile)."""
    try:
        batch = next(iter(table.read_changelog(bucket, offset, columns=[COMMIT_TIMESTAMP_COLUMN],
                                               max_rows=1)), None)
    except OffsetOutOfRange:
        return None
    if batch is None or batch.num_rows == 0:
        return None
    return batch.column(0).cast(pa.int64())[0].as_py()


def lake_status(catalog, table: TableApi) -> TableStatus:
    """The status of ``table`` as its lake tells it (``catalog``: a
    :class:`~flightstore.lake.catalog.LakeCatalog`): tiered offsets and last commit of the latest
    tiering snapshot. Raises LakeUnavailable when the lake cannot be read."""
    from flightstore.errors import TableNotFound
    from flightstore.lake.offsets import committed_offsets, tiering_snapshots

    damaged = catalog.damage.damaged(str(table.path))
    try:
        lake_table = catalog.load_table(table.path)
    except TableNotFound:
        return TableStatus(str(table.path), bucket_statuses(table, None, damaged=damaged), None, None, None, None,
                           0, None)
    latest = next(iter(tiering_snapshots(lake_table)), None) if lake_table.current_snapshot() else None
    tiered = committed_offsets(lake_table) if latest is not None else None
    return TableStatus(str(table.path), bucket_statuses(table, tiered, damaged=damaged),
                       latest.timestamp_ms if latest is not None else None,
                       latest.snapshot_id if latest is not None else None, None, None, 0, None)
